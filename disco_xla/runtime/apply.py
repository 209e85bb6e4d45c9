"""Apply a plan to a module, and check a rewritten module against its original.

`apply_plan` runs the plan's pipeline of passes (`plan_pipeline`: fusion
boundaries, all-reduce buckets, all-gather buckets, chunked collectives, then
prefetched all-gathers) on a copy of the module, then verifies the
result: it still builds as our IR, converts to StableHLO and compiles (XLA's
all-reduce combiner off, for this compile only), and the compiled module's
all-reduces are exactly the plan's buckets.

`verify_rewrite` runs the original and the rewritten module on the same random
inputs on N CPU devices, alternating, and compares outputs and step times.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from disco_xla.errors import DiscoInputError
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
from disco_xla.plan import Plan, all_gathers, departing_groups, verify_plan
from disco_xla.runtime.agreement import broadcast
from disco_xla.runtime.xla_runner import (
    PartitionedProgram,
    compile_module,
    program_for,
    random_arguments,
)

# XLA:CPU's pass that merges every all-reduce into one after the last gradient.
# Rewritten modules compile with it off (NO_COMBINER), or it
# would merge their buckets again.
ALL_REDUCE_COMBINER = "cpu-all-reduce-combiner"
NO_COMBINER = (ALL_REDUCE_COMBINER,)
# The same pass per platform (`no_combiner`). XLA:GPU runs GpuAllReduceCombiner,
# whose name() is "gpu-all-reduce-combiner" (openxla/xla, 2024 on:
# xla/service/gpu/transforms/collectives/all_reduce_combiner.h, added to the
# pipeline in xla/service/gpu/gpu_compiler.cc); before it, XLA:GPU ran the generic
# AllReduceCombiner, whose name() is "all-reduce-combiner"
# (xla/service/all_reduce_combiner.h). Both are listed: XLA skips a disabled
# name that no pass has (checked here on XLA:CPU with both names).
NO_COMBINER_BY_PLATFORM = {
    "cpu": NO_COMBINER,
    "gpu": ("gpu-all-reduce-combiner", "all-reduce-combiner"),
}
# Where XLA changed a reduction order, an output may differ by 1e-6 of its own scale
# plus 1e-6 of the step's typical output scale: outputs that are zero in exact
# arithmetic (an attention key bias's gradient) hold only rounding noise.
RELATIVE_TOLERANCE = 1e-6
# Timing: each program runs for about ROUND_S per round (at most this many steps).
ROUND_S = 0.02
MAX_STEPS_PER_ROUND = 50


class RewriteError(RuntimeError):
    """The rewritten module failed its own verification."""


def no_combiner(platform: str = "cpu") -> tuple[str, ...]:
    """The passes to disable so that XLA on `platform` keeps every all-reduce
    as written (NO_COMBINER on the CPU)."""
    return NO_COMBINER_BY_PLATFORM.get(platform, NO_COMBINER_BY_PLATFORM["gpu"])


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
    synchronous, then the fusion boundaries of the groups that need one
    (`plan.departing_groups`), when `fusion`, then the all-reduce buckets, then
    the all-gather buckets where the plan has them, then its chunked
    collectives, then its prefetched all-gathers (after the chunks, so that the
    loop trip it peels is a copy of the chunked body). A group that holds what
    those later passes rewrite in place (a prefetched all-gather's operand, the
    elementwise operations between chunked collectives: `kept_in_place`) gets
    no boundary: outlined into a call, it would hide them from those passes."""
    passes: list[HloPass] = [DropSchedule(), SynchronousAllReduces()]
    if fusion:
        boundaries = departing_groups(module, plan, left_to_xla)
        kept = kept_in_place(module, plan)
        if kept:
            boundaries = [group for group in boundaries if kept.isdisjoint(group)]
        passes.append(OutlineFusionGroups(plan.fusion_groups, boundaries))
    passes.append(BucketAllReduces(plan.all_reduce_buckets))
    if plan.all_gather_buckets:
        passes.append(BucketAllGathers(plan.all_gather_buckets))
    if plan.chunked_collectives:
        passes.append(ChunkCollectives(dict(plan.chunked_collectives)))
    if plan.prefetched_all_gathers:
        passes.append(PrefetchAllGathers(prefetched_after_buckets(plan)))
    return passes


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


def check_collectives(original: HloModule, plan: Plan, compiled: HloModule) -> None:
    """Raise RewriteError unless `compiled` sends the plan's buckets of both
    kinds (`check_all_reduces`, `check_all_gathers`)."""
    check_all_reduces(original, plan, compiled)
    check_all_gathers(original, plan, compiled)


def check_all_reduces(original: HloModule, plan: Plan, compiled: HloModule) -> None:
    """Raise RewriteError unless `compiled` (the rewritten module as XLA compiled
    it, combiner off) has exactly the plan's all-reduces: each bucket of several
    gradients as one all-reduce of their elements, and the others as XLA
    compiles the original (`_expected_all_reduce_elements`), or as the original
    has them less at most as many as XLA drops there. XLA drops an all-reduce
    whose operand computes what another's does (its CSE: on resnet50 the offset
    gradients of a block's last batch norm and of its shortcut's are one sum, so
    each block with a shortcut sends one all-reduce fewer); a bucket that takes
    one of such a pair leaves the other to be sent (`_only_duplicates_kept`)."""
    expected = _expected_all_reduce_elements(original, plan)
    got = _all_reduce_elements(compiled)
    if plan.prefetched_all_gathers:
        several = {
            sum(original.instruction(name).shape.elements for name in bucket)
            for bucket in plan.all_reduce_buckets
            if len(bucket) > 1
        }
        _check_sizes_only("all-reduces", got, expected, several)
        return
    if got != expected and not _only_duplicates_kept(original, plan, got):
        raise RewriteError(
            f"the compiled module has all-reduces of {got} elements, the plan asks for {expected}"
        )


def check_all_gathers(original: HloModule, plan: Plan, compiled: HloModule) -> None:
    """Raise RewriteError if `compiled` (the rewritten module as XLA compiled it)
    has more all-gathers than the plan's buckets and the all-gathers a plan does
    not bucket (`plan.all_gathers`): a bucket that XLA split again. (Fewer is
    XLA's own doing: it may drop an all-gather whose result is unused.) Where
    the plan prefetches, the count is not fixed (`_check_sizes_only`)."""
    if plan.prefetched_all_gathers:
        expected = _all_gather_elements_planned(original, plan)
        got = _elements(compiled, ("all-gather", "all-gather-start"))
        _check_sizes_only("all-gathers", got, expected, set())
        return
    if not plan.all_gather_buckets:
        return
    unbucketed = sum(1 for i in original.instructions() if i.opcode == "all-gather") - len(
        all_gathers(original)
    )
    expected = len(plan.all_gather_buckets) + unbucketed
    expected += sum(chunks - 1 for _, chunks in _chunk_sizes(original, plan, "all-gather"))
    got = sum(1 for i in compiled.instructions() if i.opcode in ("all-gather", "all-gather-start"))
    if got > expected:
        raise RewriteError(
            f"the compiled module has {got} all-gathers, the plan's buckets make {expected}"
        )


def _check_sizes_only(what: str, got: list[int], expected: list[int], required: set[int]) -> None:
    """The census of a plan that prefetches: its loops run one trip fewer, and
    their last trip runs after them as a copy of the body, with the body's
    collectives (`prefetch_all_gathers`), and XLA may unroll a loop left with
    one trip. How many collectives of each size the compiled module holds then
    depends on XLA, but no size may be new (XLA split or merged a bucket), and
    each of the `required` sizes (buckets of several) must be there. Raises
    RewriteError otherwise."""
    new = sorted(set(got) - set(expected))
    missing = sorted(required - set(got))
    if new or missing:
        raise RewriteError(
            f"the compiled module's {what} have sizes {new} the plan does not make"
            if new
            else f"the compiled module has no {what} of sizes {missing}, the plan's buckets"
        )


def _elements(module: HloModule, opcodes: tuple[str, ...]) -> list[int]:
    """The element counts of the results of a module's instructions of `opcodes`
    (of an asynchronous start: its largest tuple element, the gathered result)."""
    return [
        max(leaf.elements for leaf in instr.shape.leaves())
        for instr in module.instructions()
        if instr.opcode in opcodes
    ]


def _all_gather_elements_planned(original: HloModule, plan: Plan) -> list[int]:
    """The result sizes of the all-gathers a plan makes: each bucket's (each
    all-gather's where it has none), and those of the all-gathers it does not
    bucket."""
    by_name = {instr.name: instr for instr in all_gathers(original)}
    buckets = plan.all_gather_buckets or tuple((name,) for name in by_name)
    chunked = dict(plan.chunked_collectives)
    sizes = [
        sum(by_name[name].shape.elements for name in bucket) // chunked.get(bucket[0], 1)
        for bucket in buckets
    ]
    sizes += [
        instr.shape.elements
        for instr in original.instructions()
        if instr.opcode == "all-gather" and instr.name not in by_name
    ]
    return sizes


def _only_duplicates_kept(original: HloModule, plan: Plan, got: list[int]) -> bool:
    """Whether the compiled all-reduces `got` are the plan's buckets of several
    gradients, each once, and otherwise the original's other all-reduces less
    at most as many as XLA drops from the original (duplicates it merges: where
    a bucket took one of a pair, the other stays, and the exact count of
    `_expected_all_reduce_elements` is one too low)."""
    several = [bucket for bucket in plan.all_reduce_buckets if len(bucket) > 1]
    bucketed = {name for bucket in several for name in bucket}
    buckets = Counter(
        sum(original.instruction(name).shape.elements for name in bucket) for bucket in several
    )
    others = Counter(
        sum(leaf.elements for leaf in original.instruction(a.name).shape.leaves())
        for a in original.all_reduces
        if a.name not in bucketed
    )
    dropped = len(original.all_reduces) - len(compile_module(original, NO_COMBINER).all_reduces)
    found = Counter(got)
    rest = found - buckets
    return (
        not buckets - found
        and not rest - others
        and others.total() - rest.total() <= max(dropped, 0)
    )


def _all_reduce_elements(module: HloModule) -> list[int]:
    """The element counts of a module's all-reduces (elements, not bytes: XLA:CPU
    reduces bf16 in f32)."""
    return sorted(
        sum(leaf.elements for leaf in module.instruction(a.name).shape.leaves())
        for a in module.all_reduces
    )


def _expected_all_reduce_elements(module: HloModule, plan: Plan) -> list[int]:
    """The all-reduce sizes the rewritten module must compile to: those of the
    original as XLA compiles it with the combiner off (XLA may already drop or
    merge duplicates there), with each bucket of several gradients in place of
    its members."""
    sizes = Counter(_all_reduce_elements(compile_module(module, NO_COMBINER)))
    for bucket in plan.all_reduce_buckets:
        if len(bucket) < 2:
            continue
        members = [module.instruction(name).shape.elements for name in bucket]
        for size in members:
            if sizes[size] > 0:
                sizes[size] -= 1
        sizes[sum(members)] += 1
    for size, chunks in _chunk_sizes(module, plan, "all-reduce"):
        if sizes[size] > 0:
            sizes[size] -= 1
        sizes[size // chunks] += chunks
    return sorted(sizes.elements())


def _chunk_sizes(module: HloModule, plan: Plan, opcode: str) -> list[tuple[int, int]]:
    """(elements, chunks) of each of the plan's chunked collectives of `opcode`."""
    found = []
    for name, chunks in plan.chunked_collectives:
        instr = module.instruction(name)
        if instr.opcode == opcode:
            found.append((instr.shape.elements, chunks))
    return found


@dataclass(frozen=True)
class OutputComparison:
    equal: bool  # bit-equal, or every output within the tolerance
    bit_equal: bool
    max_abs_diff: float
    max_rel_diff: float  # largest |a - b| / max|a| over the outputs
    tolerance_used: float  # largest |a - b| / (1e-6 · (max|a| + typical scale)); equal if <= 1


def differing_outputs(expected: Sequence[np.ndarray], got: Sequence[np.ndarray]) -> list[int]:
    """The positions of the outputs that `compare_outputs` would not count as
    equal (each judged against the typical scale of all of `expected`)."""
    typical = _typical_scale(expected)
    found = []
    for index, (a, b) in enumerate(zip(expected, got, strict=True)):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a.shape != b.shape or _difference(a, b, typical)[2] > 1.0:
            found.append(index)
    return found


def compare_outputs(expected: Sequence[np.ndarray], got: Sequence[np.ndarray]) -> OutputComparison:
    """The one equivalence rule: bit-equal, or every output within 1e-6 of its own
    scale plus the typical (median) output scale of `expected`. Scales and
    differences are over finite values; a NaN or an infinity must be where it
    was, and the same (random inputs can make an optimizer's outputs NaN: once
    a NaN made every tolerance NaN, and so passed any difference)."""
    if len(expected) != len(got):
        raise RewriteError(f"the rewritten step has {len(got)} outputs, not {len(expected)}")
    expected = [np.asarray(a) for a in expected]
    got = [np.asarray(b) for b in got]
    typical = _typical_scale(expected)
    bit_equal, max_abs, max_rel, used = True, 0.0, 0.0, 0.0
    for a, b in zip(expected, got, strict=True):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise RewriteError(
                f"an output changed from {a.dtype}{list(a.shape)} to {b.dtype}{list(b.shape)}"
            )
        if np.array_equal(a, b, equal_nan=a.dtype.kind in "fcV"):
            continue
        bit_equal = False
        diff, relative, ratio = _difference(a.astype(np.float64), b.astype(np.float64), typical)
        max_abs, max_rel, used = max(max_abs, diff), max(max_rel, relative), max(used, ratio)
    return OutputComparison(
        equal=bit_equal or used <= 1.0,
        bit_equal=bit_equal,
        max_abs_diff=max_abs,
        max_rel_diff=max_rel,
        tolerance_used=used,
    )


def _typical_scale(outputs: Sequence[np.ndarray]) -> float:
    """The median of the outputs' scales (`_finite_scale`)."""
    scales = [_finite_scale(np.asarray(a, np.float64)) for a in outputs if np.size(a)]
    return float(np.median(scales)) if scales else 0.0


def _finite_scale(values: np.ndarray) -> float:
    """The largest magnitude among the finite values (0 where there are none)."""
    return float(np.max(np.abs(values[np.isfinite(values)]), initial=0.0))


def _difference(a: np.ndarray, b: np.ndarray, typical: float) -> tuple[float, float, float]:
    """(largest |a - b|, that over a's scale, that over the tolerance) of two
    outputs of one shape, over their finite values. A NaN or an infinity that
    is not where it was, and the same, is an infinite difference."""
    finite = np.isfinite(a)
    if not np.array_equal(finite, np.isfinite(b)) or not np.array_equal(
        a[~finite], b[~finite], equal_nan=True
    ):
        return math.inf, math.inf, math.inf
    diff = float(np.max(np.abs(a[finite] - b[finite]), initial=0.0))
    scale = _finite_scale(a)
    return (
        diff,
        diff / max(scale, 1e-30),
        diff / max(RELATIVE_TOLERANCE * (scale + typical), 1e-30),
    )


@dataclass(frozen=True)
class VerifiedRewrite:
    """What `verify_rewrite` found: the rewritten step's outputs against the
    original's, and both programs' step times."""

    equal: bool  # bit-equal, or every output within the tolerance
    bit_equal: bool
    max_abs_diff: float
    max_rel_diff: float  # largest |a - b| / max|a| over the outputs
    tolerance_used: float  # largest |a - b| / (1e-6 · (max|a| + typical scale)); equal if <= 1
    original_s: float  # median step time
    rewritten_s: float
    rounds: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def verify_rewrite(
    original: HloModule,
    rewritten: HloModule,
    devices: int,
    rounds: int = 5,
    seed: int = 0,
    platform: str = "cpu",
) -> VerifiedRewrite:
    """Run both modules on the same random inputs on `devices` devices of `platform`."""
    original_s, results = time_candidates(
        original, {"rewritten": rewritten}, devices, rounds, seed, platform=platform
    )
    result = results["rewritten"]
    return VerifiedRewrite(
        **result.outputs.__dict__,
        original_s=original_s,
        rewritten_s=result.seconds,
        rounds=rounds,
    )


@dataclass(frozen=True)
class CandidateResult:
    seconds: float  # median step time
    outputs: OutputComparison  # against the original's


def time_candidates(
    original: HloModule,
    candidates: dict[str, HloModule],
    devices: int,
    rounds: int = 5,
    seed: int = 0,
    original_disabled_passes: Sequence[str] | None = None,
    budget_s: float | None = None,
    platform: str = "cpu",
) -> tuple[float, dict[str, CandidateResult]]:
    """Run the original and each candidate (a rewrite of it) on the same random
    inputs on `devices` devices of `platform`; compare each candidate's outputs
    with the original's, and time all of them in paired rounds whose order
    rotates (the machine is noisy). Candidates compile with XLA's all-reduce
    combiner off (it would merge their buckets again); the original with
    `original_disabled_passes` off (`()`: XLA's own program; None: the
    combiner, as for the candidates). `budget_s` caps the timed rounds' wall
    time (fewer rounds, at least one; compiling and the first runs are not
    counted). Returns the original's median step time and each candidate's result."""
    programs = _compiled_programs(original, candidates, devices, original_disabled_passes, platform)
    arguments = random_arguments(programs[""].parameters, seed)
    inputs = {label: _inputs(program, arguments) for label, program in programs.items()}
    outputs = {
        label: [a for per_device in program.run(inputs[label]) for a in per_device]
        for label, program in programs.items()
    }
    # Step times on arguments already on the devices, without host copies.
    runners = {label: program.device_runner(inputs[label]) for label, program in programs.items()}
    steps, rounds = _agreed_steps_and_rounds(runners, rounds, budget_s)
    times = _rotating_rounds_s(runners, steps, rounds)
    results = {
        label: CandidateResult(
            float(np.median(times[label])), compare_outputs(outputs[""], outputs[label])
        )
        for label in candidates
    }
    return float(np.median(times[""])), results


def _compiled_programs(
    original: HloModule,
    candidates: dict[str, HloModule],
    devices: int,
    original_disabled_passes: Sequence[str] | None,
    platform: str,
) -> dict:
    """The original's program (under the label "") and each candidate's, as
    `time_candidates` compiles them; raises RewriteError if a candidate takes
    other parameters than the original."""
    combiner_off = no_combiner(platform)
    if original_disabled_passes is None:
        original_disabled_passes = combiner_off
    programs = {"": program_for(original, devices, original_disabled_passes, platform)}
    for label, module in candidates.items():
        programs[label] = program_for(module, devices, combiner_off, platform)
    parameters = [str(s) for s in programs[""].parameters]
    for label, program in programs.items():
        if [str(s) for s in program.parameters] != parameters:
            raise RewriteError(f"the {label} module takes different parameters")
    return programs


def _agreed_steps_and_rounds(runners: dict, rounds: int, budget_s: float | None) -> tuple[int, int]:
    """Run each program once (warm-up), time one step of the original (label
    ""), and return `_steps_and_rounds` for it. Over several processes every
    rank must run the same steps and rounds (their collectives pair up), so
    rank 0's counts are used."""
    for run in runners.values():
        run()
    start = time.perf_counter()
    runners[""]()
    step_s = time.perf_counter() - start
    steps, rounds = map(
        int,
        broadcast(
            _next_topic("time_candidates/steps"),
            lambda: "{},{}".format(*_steps_and_rounds(step_s, len(runners), rounds, budget_s)),
        ).split(","),
    )
    return steps, rounds


def _rotating_rounds_s(runners: dict, steps: int, rounds: int) -> dict[str, list[float]]:
    """Each program's mean step time in each of `rounds` rounds of `steps`
    steps; round k starts with the k-th program (mod their number), so no
    program always runs first."""
    labels = list(runners)
    times: dict[str, list[float]] = {label: [] for label in labels}
    for round_index in range(rounds):
        shift = round_index % len(labels)
        for label in labels[shift:] + labels[:shift]:
            start = time.perf_counter()
            for _ in range(steps):
                runners[label]()
            times[label].append((time.perf_counter() - start) / steps)
    return times


def _steps_and_rounds(
    step_s: float, programs: int, rounds: int, budget_s: float | None
) -> tuple[int, int]:
    """(steps a round times each program over, rounds) for a step of `step_s`:
    about ROUND_S a program a round, and no more rounds than fit `budget_s`."""
    steps = max(1, min(MAX_STEPS_PER_ROUND, int(ROUND_S / max(step_s, 1e-9))))
    if budget_s is not None:
        rounds = max(1, min(rounds, int(budget_s / (programs * steps * max(step_s, 1e-9)))))
    return steps, rounds


_topics_used: Counter[str] = Counter()


def _next_topic(name: str) -> str:
    """A topic for `agreement`, new on each call (each is used once per job);
    every rank makes the same calls in the same order, so the names match."""
    _topics_used[name] += 1
    return f"{name}/{_topics_used[name]}"


def _inputs(program, arguments):
    """What `program.run` takes: global arguments for partitions, or the same
    arguments on every replica."""
    if isinstance(program, PartitionedProgram):
        return arguments
    return [arguments] * len(program.devices)


def compile_separately(module: HloModule) -> HloModule:
    """XLA's compile of `module` with its all-reduce combiner off (NO_COMBINER):
    XLA's own fusion, every all-reduce apart. What the baselines and the
    search's bounds are built from (`search.pipeline.plan_module`)."""
    return compile_module(module, NO_COMBINER)
