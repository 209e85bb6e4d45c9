"""Apply a plan to a module.

`apply_plan` runs the plan's pipeline of passes (`plan_pipeline`: fusion
boundaries, all-reduce buckets, all-gather buckets, chunked collectives, then
prefetched all-gathers) on a copy of the module, then verifies the result: it
still builds as our IR, converts to StableHLO and compiles (XLA's all-reduce
combiner off, for this compile only), and the compiled module sends exactly
the plan's collectives (`collective_census`).

The rewrite's other checks are beside it: outputs (`output_comparison`) and
step times (`candidate_timing`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from disco_xla.errors import DiscoInputError, RewriteError
from disco_xla.hlo.chunking import chunked_computation
from disco_xla.hlo.graph import HloModule
from disco_xla.hlo.loops import computed_from_invariants, loop_of_body
from disco_xla.hlo_passes.bucket_all_gathers import GATHER_BUCKET_MARK, BucketAllGathers
from disco_xla.hlo_passes.bucket_all_reduces import BucketAllReduces
from disco_xla.hlo_passes.chunk_collectives import ChunkCollectives
from disco_xla.hlo_passes.drop_schedule import DropSchedule
from disco_xla.hlo_passes.fusion_boundaries import OutlineFusionGroups
from disco_xla.hlo_passes.pass_interface import HloPass, run_pipeline
from disco_xla.hlo_passes.prefetch_all_gathers import PrefetchAllGathers
from disco_xla.hlo_passes.synchronous_all_reduces import SynchronousAllReduces
from disco_xla.plan import DIMENSIONS, Plan, departing_groups, verify_plan
from disco_xla.runtime.collective_census import check_collectives
from disco_xla.runtime.xla_runner import NO_COMBINER, compile_module


def apply_plan(
    module: HloModule,
    plan: Plan,
    plan_source: str = "<plan>",
    fusion: bool = True,
    check: bool = True,
    left_to_xla: Collection[tuple[str, ...]] | None = None,
) -> HloModule:
    """A rewritten copy of `module` that runs `plan`; raises RewriteError if the
    result does not compile to the plan's all-reduces (`check=False` leaves that
    to the caller, who compiles it anyway: `check_collectives`). With
    `fusion=False` only the buckets are applied and XLA fuses as it would (its
    results are then bit-equal to the original's, where enforced fusion groups
    may change the order of floating-point reductions).

    `left_to_xla` holds the groups XLA forms by itself (`checked_rewrite.xla_own_groups`):
    only the plan's other groups get a boundary (`fusion_boundaries`). None
    outlines every group, as the boundary-cost benchmark measures."""
    verify_plan(plan, module, source=plan_source)
    rewritten = HloModule.from_bytes(module.to_bytes(), f"{module.source} + {plan_source}")
    try:
        run_pipeline(rewritten, plan_pipeline(rewritten, plan, fusion, left_to_xla))
    except DiscoInputError as error:  # the plan was verified: a pass found it cannot apply
        raise RewriteError(f"the rewrite failed: {error}") from None
    if check:
        try:
            compiled = compile_module(rewritten, NO_COMBINER)
        except Exception as error:  # noqa: BLE001 - any XLA failure is a failed rewrite
            raise RewriteError(f"the rewritten module does not compile: {error}") from None
        check_collectives(module, plan, compiled)
    return rewritten


def plan_pipeline(
    module: HloModule,
    plan: Plan,
    fusion: bool = True,
    left_to_xla: Collection[tuple[str, ...]] | None = None,
) -> list[HloPass]:
    """The passes that realise `plan` (verified) on `module`, in order: drop a
    scheduled module's schedule and make its asynchronous all-reduces
    synchronous, then each dimension's passes (`REWRITE_PASSES`) in the order
    `plan.DIMENSIONS` declares: the fusion boundaries (when `fusion`), the
    all-reduce buckets, the all-gather buckets, the chunked collectives, then
    the prefetched all-gathers (after the chunks, so that the loop trip it
    peels is a copy of the chunked body)."""
    rewrite = _Rewrite(module, plan, fusion, left_to_xla)
    passes: list[HloPass] = [DropSchedule(), SynchronousAllReduces()]
    for dimension in DIMENSIONS:
        passes += REWRITE_PASSES[dimension.name](rewrite)
    return passes


@dataclass(frozen=True)
class _Rewrite:
    """What a dimension's passes are made from."""

    module: HloModule
    plan: Plan
    fusion: bool
    left_to_xla: Collection[tuple[str, ...]] | None


def _fusion_passes(rewrite: _Rewrite) -> list[HloPass]:
    """The boundaries of the groups that need one (`plan.departing_groups`). A
    group that holds what later passes rewrite in place (a prefetched
    all-gather's operand, the elementwise operations between chunked
    collectives: `kept_in_place`) gets none: outlined into a call, it would
    hide them from those passes."""
    if not rewrite.fusion:
        return []
    module, plan = rewrite.module, rewrite.plan
    boundaries = departing_groups(module, plan, rewrite.left_to_xla)
    kept = kept_in_place(module, plan)
    if kept:
        boundaries = [group for group in boundaries if kept.isdisjoint(group)]
    return [OutlineFusionGroups(plan.fusion_groups, boundaries)]


def _all_reduce_passes(rewrite: _Rewrite) -> list[HloPass]:
    return [BucketAllReduces(rewrite.plan.all_reduce_buckets)]


def _all_gather_passes(rewrite: _Rewrite) -> list[HloPass]:
    buckets = rewrite.plan.all_gather_buckets
    return [BucketAllGathers(buckets)] if buckets else []


def _chunk_passes(rewrite: _Rewrite) -> list[HloPass]:
    chunked = rewrite.plan.chunked_collectives
    return [ChunkCollectives(dict(chunked))] if chunked else []


def _prefetch_passes(rewrite: _Rewrite) -> list[HloPass]:
    if not rewrite.plan.prefetched_all_gathers:
        return []
    return [PrefetchAllGathers(prefetched_after_buckets(rewrite.plan))]


# Each plan dimension's passes, by dimension name (`plan.DIMENSIONS`).
REWRITE_PASSES: dict[str, Callable[[_Rewrite], list[HloPass]]] = {
    "fusion": _fusion_passes,
    "all-reduce buckets": _all_reduce_passes,
    "all-gather buckets": _all_gather_passes,
    "chunks": _chunk_passes,
    "prefetch": _prefetch_passes,
}


def kept_in_place(module: HloModule, plan: Plan) -> set[str]:
    """The names of the instructions that the prefetch and chunk passes find
    and rewrite where they are: what each prefetched all-gather's operand is
    computed from in its loop body (`loops.computed_from_invariants`) and what
    its loop's trips are counted by, and what the chunked collectives compute
    in chunks (`chunking.chunked_computation`)."""
    kept: set[str] = set()
    for name in plan.prefetched_all_gathers:
        gather = module.instruction(name)
        loop = loop_of_body(gather.computation)
        if loop is None:
            continue
        kept.update(i.name for i in computed_from_invariants(loop, gather.operands[0]) or ())
        # What its trip count is read from: the condition, the counter's step
        # and its start (`trip_counts.induction_variable`).
        kept.update(i.name for i in loop.condition.instructions)
        step = loop.next_induction
        kept.update(i.name for i in (step, *step.operands))
        kept.add(loop.instruction.operands[0].operands[loop.induction_element].name)
    if plan.chunked_collectives:
        kept.update(chunked_computation(module, plan.chunked_collectives).computed)
    return kept


def prefetched_after_buckets(plan: Plan) -> list[str]:
    """The names of the plan's prefetched all-gathers once its all-gather
    buckets are applied: a bucket of several is one all-gather
    (`GATHER_BUCKET_MARK`), prefetched when its members are."""
    chosen = set(plan.prefetched_all_gathers)
    names: list[str] = []
    placed: set[str] = set()
    for index, bucket in enumerate(plan.all_gather_buckets):
        if bucket[0] in chosen:
            names.append(bucket[0] if len(bucket) == 1 else f"{GATHER_BUCKET_MARK}.{index}")
            placed.update(bucket)
    names.extend(name for name in plan.prefetched_all_gathers if name not in placed)
    return names
