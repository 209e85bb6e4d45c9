"""The all-reduce bucket dimension: how the gradient all-reduces (and gradient
reduce-scatters, where a step sends its gradients sharded) are grouped into
buckets (`Plan.all_reduce_buckets`, an ordered partition of them).

Members of a bucket share kind, dtype, reduction, device groups, channel scope
and computation, and do not depend on each other; no bucket depends on a later
one. Realised by `hlo_passes.bucket_all_reduces`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from disco_xla.hlo.graph import HloModule, Instruction
from disco_xla.plan.buckets import BucketWords, check_partition, dependencies_among
from disco_xla.plan.dimension import Dimension, Verification, as_lists, names_in_groups

if TYPE_CHECKING:
    from disco_xla.plan.core import Plan

_WORDS = BucketWords(
    "bucket",
    "a gradient all-reduce",
    "all-reduces",
    "dtype, reduction, device groups or computation",
    "{count} gradient all-reduces are in no bucket",
    "all-reduce bucket",
)


def gradient_all_reduces_in_order(module: HloModule) -> list[Instruction]:
    """Gradient all-reduce instructions in topological order."""
    names = {a.name for a in module.gradient_all_reduces}
    return [
        instr
        for computation in module.computations
        for instr in computation.topological_order
        if instr.name in names
    ]


def bucket_kinds(module: HloModule) -> dict[str, tuple]:
    """What gradient all-reduces must share to go in one bucket, by name: kind
    (all-reduce or reduce-scatter), dtype, reduction, device groups, channel
    scope and computation. Reduce-scatters over different dimensions may share
    one: the bucket pass moves each one's scattered dimension to the front."""
    by_name = {i.name: i for i in module.instructions()}
    return {
        a.name: (
            a.kind,
            by_name[a.name].shape.leaves()[0].element_type,
            a.reduction,
            a.group_size,
            a.groups,
            a.scope,
            by_name[a.name].computation.name,
        )
        for a in module.gradient_all_reduces
    }


def gradient_dependencies(module: HloModule) -> dict[str, frozenset[str]]:
    """For each gradient all-reduce that reads, through its operands, the result
    of other gradient all-reduces: their names (instruction-level dependencies, the
    ones `verify_plan` checks). Most steps have none: then the dict is empty."""
    return dependencies_among(module, [a.name for a in module.gradient_all_reduces])


def check(plan: Plan, verification: Verification) -> None:
    """The buckets partition the gradient all-reduces, each of one kind, and
    each gradient comes after the gradients whose all-reduced values it reads."""
    module = verification.module
    bucket_of = check_partition(plan.all_reduce_buckets, bucket_kinds(module), _WORDS, verification)
    for name, earlier in gradient_dependencies(module).items():
        own = bucket_of[name]
        later = [bucket_of[e] for e in earlier if bucket_of[e] >= own]
        if own in later:
            raise verification.fail(f"bucket {own} depends on its own result (through {name!r})")
        if later:
            raise verification.fail(
                f"bucket {own} depends on bucket {min(later)}, which comes after it"
            )


ALL_REDUCE_BUCKETS = Dimension(
    name="all-reduce buckets",
    field="all_reduce_buckets",
    meaning="which gradient all-reduces (and reduce-scatters) are sent as one",
    read=lambda data: names_in_groups(data, "all_reduce_buckets", required=True),
    write=as_lists,
    check=check,
    describe=lambda plan: None,  # the table's buckets column
    after=("fusion",),
    always_written=True,
)
