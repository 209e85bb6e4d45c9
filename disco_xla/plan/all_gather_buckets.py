"""The all-gather bucket dimension: how the module's all-gathers are grouped
(`Plan.all_gather_buckets`, an ordered partition of `all_gathers`; empty: each
all-gather as the module has it).

Members of a bucket share dtype, devices gathered from, device groups, channel
scope and computation; no bucket depends on itself or a later one. Realised by
`hlo_passes.bucket_all_gathers`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from disco_xla.hlo.collectives import collective_scope, device_groups, gathered_devices
from disco_xla.hlo.graph import HloModule, Instruction
from disco_xla.plan.buckets import (
    BucketWords,
    buckets_follow_dependencies,
    check_partition,
    dependencies_among,
)
from disco_xla.plan.dimension import Dimension, Verification, as_lists, names_in_groups

if TYPE_CHECKING:
    from disco_xla.plan.core import Plan

_WORDS = BucketWords(
    "all-gather bucket",
    "an all-gather of one array over one dimension",
    "all-gathers",
    "dtype, device groups or computation",
    "{count} all-gathers are in no all-gather bucket",
    "all-gather bucket",
)


def all_gathers(module: HloModule) -> list[Instruction]:
    """The all-gathers a plan may bucket, in topological order: those of one
    array over one dimension (`gathered_devices`), in program code."""
    return [
        instr
        for computation in module.computations
        if computation.role in ("entry", "program")
        for instr in computation.topological_order
        if instr.opcode == "all-gather" and gathered_devices(instr)
    ]


def all_gather_kinds(module: HloModule) -> dict[str, tuple]:
    """What all-gathers must share to go in one bucket, by name: dtype, devices
    gathered from, device groups, channel scope and computation."""
    return {
        instr.name: (
            instr.proto.shape.element_type,
            gathered_devices(instr),
            device_groups(instr.proto),
            collective_scope(instr.proto),
            instr.computation.name,
        )
        for instr in all_gathers(module)
    }


def all_gather_dependencies(module: HloModule) -> dict[str, frozenset[str]]:
    """For each all-gather that reads, through its operands, the result of other
    all-gathers (`all_gathers`): their names."""
    return dependencies_among(module, [instr.name for instr in all_gathers(module)])


def check(plan: Plan, verification: Verification) -> None:
    if not plan.all_gather_buckets:
        return
    module = verification.module
    check_partition(plan.all_gather_buckets, all_gather_kinds(module), _WORDS, verification)
    if not buckets_follow_dependencies(plan.all_gather_buckets, all_gather_dependencies(module)):
        raise verification.fail("an all-gather bucket depends on itself or on a bucket after it")


def describe(plan: Plan) -> str | None:
    gathers = plan.all_gather_buckets
    if not gathers:
        return None
    return f"its all-gathers sent in {len(gathers)} buckets (largest {max(map(len, gathers))})"


ALL_GATHER_BUCKETS = Dimension(
    name="all-gather buckets",
    field="all_gather_buckets",
    meaning="which all-gathers are sent as one",
    read=lambda data: names_in_groups(data, "all_gather_buckets"),
    write=as_lists,
    check=check,
    describe=describe,
    after=("all-reduce buckets",),
)
