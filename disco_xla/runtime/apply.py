"""Apply a plan to a module, and check a rewritten module against its original.

`apply_plan` runs the passes (fusion boundaries, then concat-bucketing) on a copy
of the module, then verifies the result: it still builds as our IR, converts to
StableHLO and compiles (XLA's all-reduce combiner off, for this compile only), and
the compiled module's all-reduces are exactly the plan's buckets.

`verify_rewrite` runs the original and the rewritten module on the same random
inputs on N CPU devices, alternating, and compares outputs and step times.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from disco_xla.hlo_passes.bucket_all_reduces import bucket_all_reduces
from disco_xla.hlo_passes.fusion_boundaries import outline_fusion_groups
from disco_xla.hlo_passes.graph import HloModule
from disco_xla.plan import Plan, verify_plan
from disco_xla.runtime.xla_runner import (
    PartitionedProgram,
    compile_module,
    program_for,
    random_arguments,
)

NO_COMBINER = ("cpu-all-reduce-combiner",)
# Where XLA changed a reduction order, an output may differ by 1e-6 of its own scale
# plus 1e-6 of the step's typical output scale: outputs that are zero in exact
# arithmetic (an attention key bias's gradient) hold only rounding noise.
RELATIVE_TOLERANCE = 1e-6


class RewriteError(RuntimeError):
    """The rewritten module failed its own verification."""


def apply_plan(
    module: HloModule,
    plan: Plan,
    plan_source: str = "<plan>",
    fusion: bool = True,
    check: bool = True,
) -> HloModule:
    """A rewritten copy of `module` that runs `plan`; raises RewriteError if the
    result does not compile to the plan's all-reduces (`check=False` leaves that
    to the caller, who compiles it anyway: `check_all_reduces`). With
    `fusion=False` only the buckets are applied and XLA fuses as it would (its
    results are then bit-equal to the original's, where enforced fusion groups
    may change the order of floating-point reductions)."""
    verify_plan(plan, module, source=plan_source)
    rewritten = HloModule.from_bytes(module.to_bytes(), f"{module.source} + {plan_source}")
    if fusion:
        outline_fusion_groups(rewritten, plan)
    bucket_all_reduces(rewritten, plan)
    if check:
        try:
            compiled = compile_module(rewritten, NO_COMBINER)
        except Exception as error:  # noqa: BLE001 - any XLA failure is a failed rewrite
            raise RewriteError(f"the rewritten module does not compile: {error}") from None
        check_all_reduces(module, plan, compiled)
    return rewritten


def check_all_reduces(original: HloModule, plan: Plan, compiled: HloModule) -> None:
    """Raise RewriteError unless `compiled` (the rewritten module as XLA compiled
    it, combiner off) has exactly the plan's all-reduces."""
    expected = _expected_all_reduce_bytes(original, plan)
    got = sorted(a.bytes for a in compiled.all_reduces)
    if got != expected:
        raise RewriteError(
            f"the compiled module has all-reduces of {got} bytes, the plan asks for {expected}"
        )


def _expected_all_reduce_bytes(module: HloModule, plan: Plan) -> list[int]:
    """The all-reduce sizes the rewritten module must compile to: those of the
    original as XLA compiles it with the combiner off (XLA may already drop or
    merge duplicates there), with each bucket of several gradients in place of
    its members."""
    by_name = {i.name: i for i in module.instructions()}
    sizes = Counter(a.bytes for a in compile_module(module, NO_COMBINER).all_reduces)
    for bucket in plan.all_reduce_buckets:
        if len(bucket) < 2:
            continue
        members = [by_name[name].shape.bytes for name in bucket]
        for size in members:
            if sizes[size] > 0:
                sizes[size] -= 1
        sizes[sum(members)] += 1
    return sorted(sizes.elements())


@dataclass(frozen=True)
class OutputComparison:
    equal: bool  # bit-equal, or every output within the tolerance
    bit_equal: bool
    max_abs_diff: float
    max_rel_diff: float  # largest |a - b| / max|a| over the outputs
    tolerance_used: float  # largest |a - b| / (1e-6 · (max|a| + typical scale)); equal if <= 1


def compare_outputs(expected: Sequence[np.ndarray], got: Sequence[np.ndarray]) -> OutputComparison:
    """The one equivalence rule: bit-equal, or every output within 1e-6 of its own
    scale plus the typical (median) output scale of `expected`."""
    if len(expected) != len(got):
        raise RewriteError(f"the rewritten step has {len(got)} outputs, not {len(expected)}")
    expected = [np.asarray(a) for a in expected]
    got = [np.asarray(b) for b in got]
    scales = [float(np.max(np.abs(a.astype(np.float64)))) for a in expected if a.size]
    typical = float(np.median(scales)) if scales else 0.0
    bit_equal, max_abs, max_rel, used = True, 0.0, 0.0, 0.0
    for a, b in zip(expected, got, strict=True):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise RewriteError(
                f"an output changed from {a.dtype}{list(a.shape)} to {b.dtype}{list(b.shape)}"
            )
        if np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"):
            continue
        bit_equal = False
        diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
        scale = float(np.max(np.abs(a.astype(np.float64))))
        max_abs, max_rel = max(max_abs, diff), max(max_rel, diff / max(scale, 1e-30))
        used = max(used, diff / max(RELATIVE_TOLERANCE * (scale + typical), 1e-30))
    return OutputComparison(
        equal=bit_equal or used <= 1.0,
        bit_equal=bit_equal,
        max_abs_diff=max_abs,
        max_rel_diff=max_rel,
        tolerance_used=used,
    )


@dataclass(frozen=True)
class Comparison:
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
    original: HloModule, rewritten: HloModule, devices: int, rounds: int = 5, seed: int = 0
) -> Comparison:
    """Run both modules on the same random inputs on `devices` CPU devices."""
    first = program_for(original, devices, NO_COMBINER)
    second = program_for(rewritten, devices, NO_COMBINER)
    if [str(s) for s in first.parameters] != [str(s) for s in second.parameters]:
        raise RewriteError("the two modules take different parameters")
    arguments = random_arguments(first.parameters, seed)
    inputs = [_inputs(first, arguments), _inputs(second, arguments)]
    outputs_first, outputs_second = first.run(inputs[0]), second.run(inputs[1])
    outputs = compare_outputs(
        [a for per_device in outputs_first for a in per_device],
        [b for per_device in outputs_second for b in per_device],
    )
    # Step times on arguments already on the devices, without host copies.
    step_first, step_second = first.device_runner(inputs[0]), second.device_runner(inputs[1])
    step_first(), step_second()
    times_first, times_second = [], []
    for round_index in range(rounds):  # paired and alternating: the machine is noisy
        order = [(step_first, times_first), (step_second, times_second)]
        for run, times in order if round_index % 2 == 0 else reversed(order):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
    return Comparison(
        **outputs.__dict__,
        original_s=float(np.median(times_first)),
        rewritten_s=float(np.median(times_second)),
        rounds=rounds,
    )


def _inputs(program, arguments):
    """What `program.run` takes: global arguments for partitions, or the same
    arguments on every replica."""
    if isinstance(program, PartitionedProgram):
        return arguments
    return [arguments] * len(program.devices)
