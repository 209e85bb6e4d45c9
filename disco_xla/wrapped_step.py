"""What `disco_xla.jit` and `disco_xla.tf_function` share: a wrapped training step
that keeps the original, the settings, and one record per argument signature
(what it runs, and with which plan), and the warning they give when they run
the original because something failed. Their trial is `trial.Trial`."""

from __future__ import annotations

import functools
import warnings
from typing import Any

from disco_xla.settings import OptimizeSettings


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
        self._warned: set[str] = set()
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

    def measurements(self) -> list[dict]:
        """Per signature seen so far: each candidate program's label mapped to
        what the first call found of it: 'simulated_s' (the simulator's step
        time, where the search gave one), 'equal' (its outputs against the
        original's), 'measured_s' (its median step time, timed beside the
        original's, which is under 'original'), 'peak_bytes' (XLA's count of the
        most buffer bytes the compiled program holds on one device: arguments,
        results and temporaries, less what donated arguments' buffers are
        reused for), or 'same_as' (the label of the same program) or 'error';
        and 'chosen' under the label it runs. A label
        tried (or, for 'original', run) only because an earlier measured run
        on this machine chose it, as the plan cache recorded, has 'from_cache'."""
        return [dict(getattr(r, "candidates", {})) for r in self._by_signature.values()]

    def _warn(self, api: str, why: str, stacklevel: int, once: bool = False) -> None:
        """The fallback warning: `api` (e.g. 'jit') runs the original for `why`,
        pointing `stacklevel` frames up. With `once`, a reason this function
        has already warned of (for another signature) is not repeated."""
        why = why.removeprefix("original: ")
        if once and why in self._warned:
            return
        self._warned.add(why)
        warnings.warn(
            f"disco_xla.{api}({self.__name__}) runs the original program: {why}",
            DiscoFallbackWarning,
            stacklevel=stacklevel + 1,
        )


def one_line(error: BaseException) -> str:
    """An exception as one line of at most 300 characters, with its type."""
    return " ".join(f"{type(error).__name__}: {error}".split())[:300]
