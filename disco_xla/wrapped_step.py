"""What `disco_xla.jit` and `disco_xla.tf_function` share: a wrapped training step
that keeps the original, the settings, and one record per argument signature
(what it runs, and with which plan); the warning they give when they run the
original because something failed; the rule of their first-call speed check,
and which candidates a first call tries (`candidate_order`)."""

from __future__ import annotations

import functools
import warnings
from typing import Any

from disco_xla.settings import OptimizeSettings

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


def fastest_label(measured_s: dict[str, float], labels: list[str]) -> str:
    """The label of `labels` with the least measured time (the earlier one on a
    tie), or 'original' when it is not strictly faster than `measured_s['original']`
    (`slower_status`'s rule)."""
    best = min(labels, key=lambda label: (measured_s[label], labels.index(label)))
    return best if measured_s[best] < measured_s["original"] else "original"


def candidate_order(choice: Any, measuring: bool) -> dict[str, tuple[Any, bool]]:
    """The candidate programs of a `PlanChoice` in order of preference, label ->
    (plan, whether its fusion groups are applied): the plan, its buckets alone,
    then (when they are timed) the search's next best and the best baseline.
    A candidate that an earlier measured run on this machine chose (the cache's
    `CandidateRecord.chosen`) is the only one tried, when it is among them
    (a recorded 'original' is not: `disco_xla.jit` then builds and times every
    candidate again, `disco_xla.tf_function` runs the original, untried)."""
    record = choice.candidates
    order = {"plan": (choice.plan, True), "buckets": (choice.plan, False)}
    if measuring:
        order.update({label: (plan, True) for label, plan in record.plans.items()})
    if record.chosen in order:
        order = {record.chosen: order[record.chosen]}
    return order


def cached_label(choice: Any, order: dict) -> str | None:
    """The label `candidate_order` kept alone because the cache recorded it as
    the measured choice, else None."""
    chosen = choice.candidates.chosen
    return chosen if chosen is not None and list(order) == [chosen] else None
