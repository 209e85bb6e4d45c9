"""The prefetch dimension: which all-gathers in a counted loop's body are
issued one loop trip ahead of their use (`Plan.prefetched_all_gathers`;
empty: none).

Each must be `loops.prefetchable` (of values the loop does not change), once,
and a bucket of several all-gathers is prefetched whole or not at all.
Realised by `hlo_passes.prefetch_all_gathers`, after the chunks, so that the
loop trip it peels is a copy of the chunked body.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from disco_xla.hlo.graph import HloModule
from disco_xla.hlo.loops import prefetchable
from disco_xla.plan.all_gather_buckets import all_gathers
from disco_xla.plan.dimension import Dimension, Verification

if TYPE_CHECKING:
    from disco_xla.plan.core import Plan


def prefetchable_all_gathers(module: HloModule) -> list[str]:
    """The all-gathers (`all_gathers`) a plan may issue one loop trip ahead
    (`loops.prefetchable`), in topological order."""
    return [instr.name for instr in all_gathers(module) if prefetchable(instr)]


def check(plan: Plan, verification: Verification) -> None:
    if not plan.prefetched_all_gathers:
        return
    allowed = set(prefetchable_all_gathers(verification.module))
    chosen = set(plan.prefetched_all_gathers)
    for name in plan.prefetched_all_gathers:
        if name not in allowed:
            raise verification.fail(
                f"{name!r} is not an all-gather a loop trip can issue ahead: it must be in a "
                "counted loop's body, of values the loop does not change"
            )
    if len(chosen) != len(plan.prefetched_all_gathers):
        raise verification.fail("an all-gather is prefetched twice")
    for index, bucket in enumerate(plan.all_gather_buckets):
        if 0 < len(chosen.intersection(bucket)) < len(bucket):
            raise verification.fail(
                f"all-gather bucket {index} is prefetched in part: all its members or none"
            )


def _read(data: dict) -> tuple[str, ...]:
    """The list of names under 'prefetched_all_gathers' (() when absent)."""
    names = data.get("prefetched_all_gathers", [])
    if not isinstance(names, list):
        raise ValueError("prefetched_all_gathers is not a list of names")
    return tuple(map(str, names))


def describe(plan: Plan) -> str | None:
    prefetched = plan.prefetched_all_gathers
    if not prefetched:
        return None
    return f"{len(prefetched)} all-gathers issued a loop trip ahead"


PREFETCH = Dimension(
    name="prefetch",
    field="prefetched_all_gathers",
    meaning="which all-gathers are issued a loop trip ahead",
    read=_read,
    write=list,
    check=check,
    describe=describe,
    after=("chunks",),
)
