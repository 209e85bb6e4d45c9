"""The event simulator on small modules whose timelines can be worked out by hand,
and `disco-xla simulate` on a captured training step."""

from __future__ import annotations

import dataclasses

import pytest

from disco_xla.hlo.hlo_io import module_from_text
from disco_xla.plan import Plan, verify_plan
from disco_xla.simulator.comm import all_reduce_s
from disco_xla.simulator.cost_models import RooflineCostModel, TableCostModel
from disco_xla.simulator.events import simulate
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.profiles import load_profile
from disco_xla.simulator.trace import chrome_trace, plot_gantt

# forward -> two gradients -> two all-reduces -> two updates
TWO_GRADIENTS = """HloModule two_gradients

sum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}

ENTRY main {
  x = f32[1024] parameter(0)
  w1 = f32[1024] parameter(1)
  w2 = f32[1024] parameter(2)
  forward = f32[1024] tanh(x)
  grad1 = f32[1024] multiply(forward, w1)
  grad2 = f32[1024] exponential(forward)
  mean1 = f32[1024] all-reduce(grad1), replica_groups={{0,1}}, to_apply=sum
  mean2 = f32[1024] all-reduce(grad2), replica_groups={{0,1}}, to_apply=sum
  update1 = f32[1024] subtract(w1, mean1)
  update2 = f32[1024] subtract(w2, mean2)
  ROOT out = (f32[1024], f32[1024]) tuple(update1, update2)
}
"""
KERNEL_S = {"forward": 3e-3, "grad1": 2e-3, "grad2": 4e-3, "update1": 1e-3, "update2": 1e-3}


@pytest.fixture(scope="module")
def module():
    return module_from_text(TWO_GRADIENTS)


def timed(module, plan, profile):
    """A table cost model with the hand-chosen time of each kernel."""
    graph = build_task_graph(module, plan)
    table = {k.structural_hash: KERNEL_S[k.name] for k in graph.kernels}
    return graph, TableCostModel(table, RooflineCostModel(profile))


def test_gpu_streams_overlap_the_first_all_reduce_with_the_second_gradient(module):
    profile = load_profile("a100-2x8-100g")
    plan = Plan.unfused(module)
    verify_plan(plan, module)
    graph, costs = timed(module, plan, profile)
    result = simulate(graph, profile, costs)
    assert costs.misses == 0
    comm = all_reduce_s(4096, profile)
    assert comm < 4e-3  # the first all-reduce hides fully behind grad2
    # forward, grad1, grad2, update1 back to back; mean2 starts after grad2 and after
    # mean1 on the same stream; update2 follows it.
    mean2_end = max(3e-3 + 2e-3 + 4e-3, 3e-3 + 2e-3 + comm) + comm
    expected = max(3e-3 + 2e-3 + 4e-3 + 1e-3, mean2_end) + 1e-3
    assert result.iteration_s == pytest.approx(expected)
    assert result.comm_s == pytest.approx(2 * comm)
    # mean1 hides behind grad2, mean2 behind update1: nothing is exposed.
    assert mean2_end < 3e-3 + 2e-3 + 4e-3 + 1e-3
    assert result.exposed_comm_s == pytest.approx(0.0, abs=1e-12)
    assert result.overlap_ratio == pytest.approx(1.0)
    assert result.compute_s == pytest.approx(sum(KERNEL_S.values()))
    assert result.critical_path[-1] == "update2"


def test_collectives_that_block_compute_hold_the_stream_until_they_end(module):
    # XLA:GPU without its latency-hiding scheduler: each all-reduce runs as soon
    # as its gradient is ready, and the next kernel waits for it.
    profile = load_profile("a100-2x8-100g")
    plan = Plan.unfused(module)
    graph, costs = timed(module, plan, profile)
    blocking = dataclasses.replace(graph, collectives_block_compute=True)
    result = simulate(blocking, profile, costs)
    comm = all_reduce_s(4096, profile)
    # forward, grad1, mean1, grad2, mean2, update1, update2, one after another
    assert result.iteration_s == pytest.approx(sum(KERNEL_S.values()) + 2 * comm)
    assert result.exposed_comm_s == pytest.approx(2 * comm)
    starts = {e.name: e.start_s for e in result.events}
    assert starts["grad2"] == pytest.approx(3e-3 + 2e-3 + comm)
    assert simulate(graph, profile, costs).iteration_s < result.iteration_s


def test_updates_run_in_the_order_their_gradients_are_computed():
    # update2 comes first in the program, but its all-reduce is fed last: a
    # latency-hiding order runs update1 first, while mean2 is still on the wire.
    text = TWO_GRADIENTS.replace(
        "  update1 = f32[1024] subtract(w1, mean1)\n  update2 = f32[1024] subtract(w2, mean2)\n",
        "  update2 = f32[1024] subtract(w2, mean2)\n  update1 = f32[1024] subtract(w1, mean1)\n",
    )
    assert text != TWO_GRADIENTS
    reordered = module_from_text(text)
    graph = build_task_graph(reordered, Plan.unfused(reordered))
    names = [kernel.name for kernel in graph.kernels]
    assert names.index("update1") < names.index("update2")


def test_one_bucket_waits_for_both_gradients_and_pays_the_copies(module):
    profile = load_profile("a100-2x8-100g")
    plan = dataclasses.replace(Plan.unfused(module), all_reduce_buckets=(("mean1", "mean2"),))
    verify_plan(plan, module)
    graph, costs = timed(module, plan, profile)
    result = simulate(graph, profile, costs)
    copy = 2 * 8192 / profile.memory_bandwidth_bytes_per_s + profile.kernel_launch_s
    comm = all_reduce_s(8192, profile)
    expected = 3e-3 + 2e-3 + 4e-3 + copy + comm + copy + 1e-3 + 1e-3
    assert result.iteration_s == pytest.approx(expected)
    assert result.exposed_comm_s == pytest.approx(comm)
    assert [e.kind for e in result.events].count("copy") == 2


def test_a_tuple_bucket_copies_nothing_and_pays_for_each_tensor_after_the_first(module):
    profile = dataclasses.replace(load_profile("a100-2x8-100g"), tuple_all_reduce_element_s=5e-4)
    plan = dataclasses.replace(Plan.unfused(module), all_reduce_buckets=(("mean1", "mean2"),))
    graph = build_task_graph(module, plan, tuple_buckets=True)
    assert graph.tuple_elements(0) == (4096, 4096)
    table = {k.structural_hash: KERNEL_S[k.name] for k in graph.kernels}
    result = simulate(graph, profile, TableCostModel(table, RooflineCostModel(profile)))
    comm = all_reduce_s(8192, profile) + 5e-4
    assert result.iteration_s == pytest.approx(3e-3 + 2e-3 + 4e-3 + comm + 1e-3 + 1e-3)
    assert [e.kind for e in result.events].count("copy") == 0
    # The same bucket as the rewrite sends it: concatenated, one message.
    assert build_task_graph(module, plan).tuple_elements(0) == ()


def test_a_tuple_bucket_pays_for_its_tensors_one_by_one_not_for_one_large_buffer(module):
    """Where measured points make a large buffer dearer per byte than small
    ones, a tuple all-reduce costs its largest tensor's collective plus the
    size-dependent part of each other tensor's: XLA:CPU sends them one after
    another, never as one buffer of their summed bytes."""
    points = ((1024.0, 1e-4), (4096.0, 2e-4), (8192.0, 4e-3))  # 8 KB: 20x dearer
    profile = dataclasses.replace(
        load_profile("h200-1x8-nvlink"), all_reduce_points=points, tuple_all_reduce_element_s=5e-5
    )
    plan = dataclasses.replace(Plan.unfused(module), all_reduce_buckets=(("mean1", "mean2"),))
    model = RooflineCostModel(profile)
    (sent,) = [
        e
        for e in simulate(build_task_graph(module, plan, True), profile, model).events
        if e.kind == "all-reduce"
    ]
    assert sent.end_s - sent.start_s == pytest.approx(2e-4 + (2e-4 - 1e-4) + 5e-5)
    # Concatenated, the same bytes are one buffer of 8 KB.
    (concatenated,) = [
        e
        for e in simulate(build_task_graph(module, plan), profile, model).events
        if e.kind == "all-reduce"
    ]
    assert concatenated.end_s - concatenated.start_s == pytest.approx(4e-3)


def test_a_tuple_shaped_all_reduce_is_a_tuple_all_reduce():
    text = TWO_GRADIENTS.replace(
        """  mean1 = f32[1024] all-reduce(grad1), replica_groups={{0,1}}, to_apply=sum
  mean2 = f32[1024] all-reduce(grad2), replica_groups={{0,1}}, to_apply=sum""",
        "  both = (f32[1024], f32[1024]) all-reduce(grad1, grad2), "
        "replica_groups={{0,1}}, to_apply=sum\n"
        "  mean1 = f32[1024] get-tuple-element(both), index=0\n"
        "  mean2 = f32[1024] get-tuple-element(both), index=1",
    )
    combined = module_from_text(text)
    graph = build_task_graph(combined, Plan.unfused(combined))
    assert [graph.tuple_elements(c) for c in range(len(graph.communications))] == [(4096, 4096)]


def test_cpu_threads_run_independent_work_side_by_side_unless_overlap_is_off(module):
    # Two executor threads, as where a worker has two cores to itself (and no
    # calibrated step costs or kernel time scale, to keep the sums by hand).
    profile = dataclasses.replace(
        load_profile("cpu-local"), compute_threads=2, step_overhead_s=0.0, kernel_time_scale=1.0
    )
    plan = Plan.unfused(module)
    graph, costs = timed(module, plan, profile)
    parallel = simulate(graph, profile, costs)
    serial_profile = dataclasses.replace(profile, overlap=False)
    serial = simulate(graph, serial_profile, costs)
    total = sum(KERNEL_S.values()) + 2 * all_reduce_s(4096, profile)
    assert serial.iteration_s == pytest.approx(total)
    assert parallel.iteration_s < serial.iteration_s
    assert serial.exposed_comm_s == pytest.approx(serial.comm_s)


@pytest.mark.parametrize("name", ["jax_pmap_step", "tf_train_step"])
def test_the_one_thread_scheduler_equals_the_general_one_with_one_thread(captured, name):
    from disco_xla.hlo.graph import HloModule
    from disco_xla.simulator import cpu_threads, events

    step = HloModule.from_bytes(captured[name][0], name)
    profile = dataclasses.replace(load_profile("cpu-local"), compute_threads=1)
    graph = build_task_graph(step, Plan.unfused(step))
    kernel_ps = [events.to_ps(s) for s in RooflineCostModel(profile).kernels_s(graph)]
    comm_ps, copy_ps = [], []
    for c, (_, size, members) in enumerate(graph.communications):
        comm, copy = events.communication_ps(
            size, len(members), profile, all_reduce_s, graph.tuple_elements(c)
        )
        comm_ps.append(comm)
        copy_ps.append(copy)
    general = cpu_threads.run_threads(graph, kernel_ps, comm_ps, copy_ps, profile)
    one = cpu_threads.run_one_thread(graph, kernel_ps, comm_ps, copy_ps, profile)
    assert one == general
    assert len(general[0]) == graph.task_count


def test_roofline_is_the_slower_of_compute_and_memory_plus_launch(module):
    profile = load_profile("h200-1x8-nvlink")
    graph = build_task_graph(module, Plan.unfused(module))
    kernel = next(k for k in graph.kernels if k.name == "grad1")
    assert (kernel.flops, kernel.bytes) == (1024, 3 * 4096)
    memory_s = kernel.bytes / (profile.memory_bandwidth_bytes_per_s * 0.5)
    assert RooflineCostModel(profile).kernel_s(kernel) == pytest.approx(
        memory_s + profile.kernel_launch_s
    )


def test_plans_that_share_a_group_share_its_kernel_and_the_others_are_their_own():
    from disco_xla.simulator.kernels import kernel_for

    step = module_from_text(TWO_GRADIENTS)
    unfused = Plan.unfused(step)
    fused = dataclasses.replace(
        unfused,
        fusion_groups=(("forward", "grad1"), ("grad2",), ("update1",), ("update2",)),
    )
    verify_plan(fused, step)
    first = build_task_graph(step, fused)
    second = build_task_graph(step, unfused)
    for graph in (first, second):
        for kernel in graph.kernels:
            assert kernel == kernel_for(kernel.instructions, kernel.name)
    assert [k.name for k in second.kernels] == ["forward", "grad1", "grad2", "update1", "update2"]
    fused_in = {k.name: k for k in first.kernels}
    # Both plans name a kernel "forward"; only the fused one holds grad1.
    assert (fused_in["forward"].flops, fused_in["forward"].bytes) == (2048, 4 * 4096)
    assert (second.kernels[0].flops, second.kernels[0].bytes) == (1024, 2 * 4096)
    assert next(k for k in second.kernels if k.name == "grad2") is fused_in["grad2"]


def test_trace_and_gantt_chart_are_written(module, tmp_path):
    profile = load_profile("v100-2x8-25g")
    result = simulate(
        build_task_graph(module, Plan.unfused(module)), profile, RooflineCostModel(profile)
    )
    trace = chrome_trace(result)
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == len(result.events) == 7
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert names == {"compute", "comm 0"}
    path = tmp_path / "gantt.png"
    plot_gantt({"none": result, "again": result}, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_convolutions_of_equal_shapes_and_other_dimension_labels_hash_apart():
    """A measured table keyed by the structural hash must not give one
    convolution the time of another that only shares its shapes."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    def fn(images, filters):
        return [
            lax.conv_general_dilated(images, filters, (1, 1), "SAME", dimension_numbers=labels)
            for labels in (("NHWC", "HWIO", "NHWC"), ("NCHW", "HWIO", "NCHW"))
        ]

    lowered = jax.jit(fn).lower(jnp.zeros((2, 8, 8, 8)), jnp.zeros((3, 3, 8, 8)))
    module = module_from_text(lowered.as_text(dialect="hlo"))
    graph = build_task_graph(module, Plan.unfused(module))
    kernels = [k for k in graph.kernels if k.instructions[0].opcode == "convolution"]
    first, second = (k.instructions[0] for k in kernels)
    assert first.shape == second.shape
    assert [o.shape for o in first.operands] == [o.shape for o in second.operands]
    assert kernels[0].structural_hash != kernels[1].structural_hash


def test_the_table_prices_kernels_it_has_not_measured_with_its_fallback(module):
    """Measured times first; a kernel the table lacks gets the roofline's time
    (batched or one at a time alike) and is counted as a miss."""
    profile = load_profile("cpu-local")
    roofline = RooflineCostModel(profile)
    graph = build_task_graph(module, Plan.unfused(module))
    measured = {k.structural_hash: 1.0 for k in graph.kernels if k.name.startswith("grad")}
    table = TableCostModel(measured, roofline)
    expected = [
        1.0 if k.structural_hash in measured else roofline.kernel_s(k) for k in graph.kernels
    ]
    assert table.kernels_s(graph) == pytest.approx(expected)
    assert [table.kernel_s(k) for k in graph.kernels] == pytest.approx(expected)
    unseen = sum(k.structural_hash not in measured for k in graph.kernels)
    assert 0 < unseen < len(graph.kernels) and table.misses == 2 * unseen
