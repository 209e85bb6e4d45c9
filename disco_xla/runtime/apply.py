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


def apply_plan(module: HloModule, plan: Plan, plan_source: str = "<plan>") -> HloModule:
    """A rewritten copy of `module` that runs `plan`; raises RewriteError if the
    result does not compile to the plan's all-reduces."""
    verify_plan(plan, module, source=plan_source)
    rewritten = HloModule.from_bytes(module.to_bytes(), f"{module.source} + {plan_source}")
    outline_fusion_groups(rewritten, plan)
    bucket_all_reduces(rewritten, plan)
    by_name = {i.name: i for i in module.instructions()}
    expected = sorted(
        [sum(by_name[n].shape.bytes for n in bucket) for bucket in plan.all_reduce_buckets]
        + [a.bytes for a in module.all_reduces if not a.is_gradient]
    )
    try:
        compiled = compile_module(rewritten, NO_COMBINER)
    except Exception as error:  # noqa: BLE001 - any XLA failure is a failed rewrite
        raise RewriteError(f"the rewritten module does not compile: {error}") from None
    got = sorted(a.bytes for a in compiled.all_reduces)
    if got != expected:
        raise RewriteError(
            f"the compiled module has all-reduces of {got} bytes, the plan asks for {expected}"
        )
    return rewritten


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
    scales = [
        float(np.max(np.abs(a.astype(np.float64))))
        for outputs in outputs_first
        for a in outputs
        if a.size
    ]
    typical = float(np.median(scales)) if scales else 0.0
    bit_equal, max_abs, max_rel, used = True, 0.0, 0.0, 0.0
    for mine, theirs in zip(outputs_first, outputs_second, strict=True):
        for a, b in zip(mine, theirs, strict=True):
            if a.shape != b.shape:
                raise RewriteError(f"an output changed shape: {a.shape} -> {b.shape}")
            if np.array_equal(a, b):
                continue
            bit_equal = False
            diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
            scale = float(np.max(np.abs(a.astype(np.float64))))
            max_abs, max_rel = max(max_abs, diff), max(max_rel, diff / max(scale, 1e-30))
            used = max(used, diff / max(RELATIVE_TOLERANCE * (scale + typical), 1e-30))
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
        equal=bit_equal or used <= 1.0,
        bit_equal=bit_equal,
        max_abs_diff=max_abs,
        max_rel_diff=max_rel,
        tolerance_used=used,
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
