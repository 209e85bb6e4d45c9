"""Kernel times from the JAX profiler, into the table cost model."""

from __future__ import annotations

import numpy as np

from disco_xla.hlo.graph import HloModule
from disco_xla.plan import Plan
from disco_xla.profiling.kernel_times import kernel_time_table, profile_kernel_times
from disco_xla.runtime.xla_runner import NO_COMBINER, PartitionedProgram, random_arguments
from disco_xla.simulator.cost_models import RooflineCostModel, TableCostModel
from disco_xla.simulator.events import simulate
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.profiles import load_profile


def test_every_compiled_kernel_gets_a_measured_time(captured):
    module = HloModule.from_bytes(captured["jax_pmap_step"][0])
    program = PartitionedProgram(module, 4, NO_COMBINER)
    run = program.device_runner(random_arguments(program.parameters, seed=0))
    times = profile_kernel_times(run, repeats=3)
    compiled = program.compiled_module()
    graph = build_task_graph(compiled, Plan.unfused(compiled))
    assert {k.name for k in graph.kernels} <= set(times)
    assert all(value > 0 for value in times.values())
    assert any(name.startswith("psum") for name in times)  # collectives are traced too
    table = kernel_time_table(compiled, times)
    profile = load_profile("cpu-local")
    cost_model = TableCostModel(table, RooflineCostModel(profile))
    result = simulate(graph, profile, cost_model)
    assert cost_model.misses == 0
    kernel_sum = sum(table[k.structural_hash] for k in graph.kernels)
    assert np.isclose(sum(cost_model.kernels_s(graph)), kernel_sum)
    assert result.compute_s > 0
