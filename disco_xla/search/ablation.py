"""What each plan dimension contributes, and the part of a plan an entry point
would run.

Leave-one-out ablation: the found plan with one dimension at a time set to the
expert's choice for it (the `xla-tuned` baseline's plan: XLA's own fusion, its
tuned combiner buckets, ...), priced as the rewrite runs it. The ratio of that
time to the found plan's is what the dimension adds over the expert's choice;
a pair of dimensions that only pays together shows in neither.

The realisable plan: the checking entry points (`disco_xla.jit`, the hook,
`optimize -o` with measurement) compare the rewritten program's outputs with
XLA's and fall back where they differ. A departure from XLA's fusion moves f32
sums into other kernels, in another order, so it is taken to change results:
the realisable plan keeps the found plan's buckets, prefetches and chunks over
XLA's own fusion. Where the found plan keeps XLA's fusion it is realisable as
it is.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import fields, replace

from disco_xla.plan import DIMENSIONS as PLAN_DIMENSIONS
from disco_xla.plan import IDENTITY_FIELDS, Plan

# Each plan dimension and the `Plan` fields that hold it, in the order the
# rewrite applies them (`plan.DIMENSIONS`). Every field of a plan but its
# identity belongs to exactly one dimension (`tests/search/test_ablation.py`).
DIMENSIONS: dict[str, tuple[str, ...]] = {d.name: (d.field,) for d in PLAN_DIMENSIONS}

PriceFn = Callable[[Plan], float]  # a plan's simulated seconds; inf where it cannot run


def with_dimension_of(plan: Plan, other: Plan, dimension: str) -> Plan:
    """`plan` with `dimension`'s fields taken from `other`."""
    return replace(plan, **{name: getattr(other, name) for name in DIMENSIONS[dimension]})


def departs_from(plan: Plan, other: Plan, dimension: str) -> bool:
    """Whether `plan` chose otherwise than `other` in `dimension` (fusion
    groups compared as sets: their order does not change the program)."""
    if dimension == "fusion":
        return _groups(plan) != _groups(other)
    return any(getattr(plan, n) != getattr(other, n) for n in DIMENSIONS[dimension])


def leave_one_out(found: Plan, expert: Plan, price: PriceFn) -> dict[str, float | None]:
    """For each dimension where `found` departs from `expert`: the seconds of
    `found` with that dimension as `expert` has it (None where that mix is not
    a valid plan, for example chunks whose dots the expert's fusion groups
    otherwise). Dimensions where the two agree are left out."""
    ablated: dict[str, float | None] = {}
    for dimension in DIMENSIONS:
        if not departs_from(found, expert, dimension):
            continue
        seconds = price(with_dimension_of(found, expert, dimension))
        ablated[dimension] = None if math.isinf(seconds) else seconds
    return ablated


def realisable_plan(found: Plan, xla_fusion: Plan) -> Plan:
    """The part of `found` that an entry point which checks outputs would run
    (module docstring): `found` over XLA's fusion groups, the other dimensions
    kept."""
    if not departs_from(found, xla_fusion, "fusion"):
        return found
    return with_dimension_of(found, xla_fusion, "fusion")


def plan_fields_by_dimension() -> dict[str, str]:
    """Each `Plan` field but the identity, and the dimension holding it."""
    owner = {name: dim for dim, names in DIMENSIONS.items() for name in names}
    return {f.name: owner.get(f.name, "") for f in fields(Plan) if f.name not in IDENTITY_FIELDS}


def _groups(plan: Plan) -> frozenset[frozenset[str]]:
    return frozenset(frozenset(group) for group in plan.fusion_groups)
