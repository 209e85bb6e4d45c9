"""What `disco_xla.jit` and `disco_xla.tf_function` share: a wrapped training step
that keeps the original, the settings, and one record per argument signature
(what it runs, and with which plan); the warning they give when they run the
original because something failed; the rule of their first-call speed check."""

from __future__ import annotations

import functools
from typing import Any

from disco_xla.planning import OptimizeSettings

TIMING_ROUNDS = 6  # paired rounds of the first-call speed check


class DiscoFallbackWarning(RuntimeWarning):
    """disco-xla runs the original program, for the reason given."""


class WrappedStep:
    """A step that runs disco-xla's rewritten program when it can and the
    original otherwise. Call it like the original; other attributes are the
    original's. A record per signature has at least `status` and `plan`."""

    def __init__(self, original: Any, settings: OptimizeSettings):
        self._original = original
        self._settings = settings
        self._by_signature: dict[Any, Any] = {}
        functools.update_wrapper(self, original, updated=())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._original, name)

    def status(self) -> list[str]:
        """What each signature seen so far runs, in the order they were seen:
        'optimized ...', 'not data-parallel', or 'original: <why>'."""
        return [record.status for record in self._by_signature.values()]

    def plans(self) -> list:
        """The plans found so far, one per optimised signature."""
        return [r.plan for r in self._by_signature.values() if r.plan is not None]


def slower_status(original_s: float, rewritten_s: float, chosen: str) -> str | None:
    """The first-call speed check's rule: the rewritten program stays only if it
    is strictly faster than the original (times per step, as the user calls them).
    Returns the status of a signature that runs the original because it is
    faster here (or as fast), else None. `chosen` is the rewritten program's status."""
    if rewritten_s < original_s:
        return None
    return (
        f"original: faster here ({original_s * 1e3:.3f} ms per step "
        f"against {rewritten_s * 1e3:.3f} ms for {chosen})"
    )
