"""What one kernel boundary added to XLA's fusion costs on this machine: the
profile's `fusion_boundary_s`, measured by `disco-xla calibrate`.

The probe is a jitted function of independent chains of elementwise ops, which
XLA fuses into one loop kernel each. The plan that splits every chain into its
ops is realised the way every plan is (`hlo_passes.fusion_boundaries`: each
departing group outlined into a non-inlineable call), and both programs run on
one CPU device in paired rounds whose order rotates. The cost model already
charges the split's extra kernels (the roofline of each, with its launch
overhead and its reads and writes); the boundary cost is what the measured
difference adds beyond that, per boundary:

    fusion_boundary_s = max(0, ((T_split - T_xla) - (C_split - C_xla)) / boundaries)

with T measured step times and C the roofline's kernel times summed. The probe
runs alone on one device, so the profile's kernel_time_scale (workers sharing
cores) is not in it; the simulator scales the charge with the kernel it joins.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from disco_xla.capture import capture_jax
from disco_xla.plan import Plan, departing_groups
from disco_xla.runtime.apply import apply_plan
from disco_xla.runtime.candidate_timing import time_candidates
from disco_xla.runtime.xla_runner import compile_module, no_combiner
from disco_xla.search.xla_fusion import xla_fusion_plan
from disco_xla.simulator.cost_models import RooflineCostModel
from disco_xla.simulator.kernels import TaskGraph, kernel_for
from disco_xla.simulator.profiles import ClusterProfile

# The probe: this many chains of CHAIN_OPS elementwise ops on f32[ELEMENTS] each.
CHAINS = 32
CHAIN_OPS = 4
ELEMENTS = 16384


@dataclass(frozen=True)
class BoundaryCost:
    fusion_boundary_s: float
    boundaries: int  # departing groups of the probe's split plan
    xla_s: float  # median step time of XLA's program
    split_s: float  # median step time of the split plan's program
    modelled_extra_s: float  # what the cost model charges the split's extra kernels
    equal: bool  # the split program's outputs against XLA's


def _probe_module():
    def chains(*xs):
        results = []
        for x in xs:
            y = x
            for op in range(CHAIN_OPS):
                y = jnp.tanh(y) * 1.5 if op % 2 == 0 else y + 0.25
            results.append(y)
        return tuple(results)

    args = [np.full((ELEMENTS,), 0.1 * (n + 1), np.float32) for n in range(CHAINS)]
    return capture_jax(jax.jit(chains), *args)


def measure_fusion_boundary_s(
    profile: ClusterProfile, rounds: int = 9, platform: str = "cpu"
) -> BoundaryCost:
    """Measure the probe (see the module docstring) on one device of
    `platform`; the roofline of `profile` gives the modelled part."""
    module = _probe_module()
    own = xla_fusion_plan(module, compile_module(module, no_combiner(platform), platform))
    split = Plan(
        own.module_name,
        own.fingerprint,
        tuple((name,) for group in own.fusion_groups for name in group),
        own.all_reduce_buckets,
    )
    boundaries = len(departing_groups(module, split, own.fusion_groups))
    rewritten = apply_plan(module, split, "split probe", check=False, left_to_xla=own.fusion_groups)
    xla_s, results = time_candidates(module, {"split": rewritten}, 1, rounds, platform=platform)
    split_s = results["split"].seconds

    by_name = {i.name: i for i in module.instructions()}
    roofline = RooflineCostModel(profile)

    def kernels_s(plan: Plan) -> float:
        kernels = [kernel_for([by_name[n] for n in group]) for group in plan.fusion_groups]
        return sum(roofline.kernels_s(TaskGraph(kernels, [], [], [])))

    modelled = kernels_s(split) - kernels_s(own)
    return BoundaryCost(
        fusion_boundary_s=max(0.0, ((split_s - xla_s) - modelled) / max(boundaries, 1)),
        boundaries=boundaries,
        xla_s=xla_s,
        split_s=split_s,
        modelled_extra_s=modelled,
        equal=results["split"].outputs.equal,
    )
