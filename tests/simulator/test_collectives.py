"""Every collective is a communication task: all-gather, reduce-scatter,
all-to-all, collective-permute and the asynchronous start/done pairs are costed
by the ring ratios of the all-reduce model, kernels that read them wait for them,
and the incremental simulation stays equal to the full one."""

from __future__ import annotations

import json

import pytest

from disco_xla import save_module
from disco_xla.hlo.collectives import collective_bytes, collective_kind
from disco_xla.hlo.hlo_io import module_from_text
from disco_xla.plan import Plan, verify_plan
from disco_xla.search.backtracking import greedy_fusion_plan
from disco_xla.simulator.comm import all_reduce_s, collective_s, ring_all_reduce_s
from disco_xla.simulator.cost_models import RooflineCostModel
from disco_xla.simulator.events import PS_PER_S, simulate, to_ps
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.profiles import load_profile
from tests.conftest import run_cli
from tests.simulator.incremental_checks import local_changes_match_full_simulation

RING = "source_target_pairs={{0,1},{1,2},{2,3},{3,0}}"
COLLECTIVES = """HloModule collectives, replica_count=4

sum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}

ENTRY main {
  x = f32[1024] parameter(0)
  w = f32[4096] parameter(1)
  gathered = f32[4096] all-gather(x), replica_groups={{0,1,2,3}}, dimensions={0}
  y = f32[4096] multiply(gathered, w)
  scattered = f32[1024] reduce-scatter(y), replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=sum
  z = f32[1024] tanh(scattered)
  exchanged = f32[1024] all-to-all(z), replica_groups={{0,1,2,3}}, dimensions={0}
  shifted = f32[1024] collective-permute(exchanged), RING
  start = (f32[1024], f32[4096]) all-gather-start(shifted), replica_groups={{0,1,2,3}},
      dimensions={0}
  done = f32[4096] all-gather-done(start)
  pstart = (f32[4096], f32[4096], u32[], u32[]) collective-permute-start(done), RING
  pdone = f32[4096] collective-permute-done(pstart)
  out = f32[4096] add(pdone, w)
  g = f32[4096] multiply(out, w)
  mean = f32[4096] all-reduce(g), replica_groups={{0,1,2,3}}, to_apply=sum
  h = f32[4096] sine(w)
  mean2 = f32[4096] all-reduce(h), replica_groups={{0,1,2,3}}, to_apply=sum
  ROOT result = (f32[4096], f32[4096], f32[4096]) tuple(out, mean, mean2)
}
""".replace("RING", RING)

EXPECTED = {  # name -> (kind, bytes of the whole buffer)
    "gathered": ("all-gather", 4096 * 4),
    "scattered": ("reduce-scatter", 4096 * 4),
    "exchanged": ("all-to-all", 1024 * 4),
    "shifted": ("collective-permute", 1024 * 4),
    "start": ("all-gather", 4096 * 4),
    "pstart": ("collective-permute", 4096 * 4),
    "mean": ("all-reduce", 4096 * 4),
    "mean2": ("all-reduce", 4096 * 4),
}


@pytest.fixture(scope="module")
def module():
    return module_from_text(COLLECTIVES)


def test_each_collective_has_its_kind_and_the_size_of_its_whole_buffer(module):
    found = {
        i.name: (collective_kind(i), collective_bytes(i))
        for i in module.instructions()
        if i.name in EXPECTED
    }
    assert found == EXPECTED


def test_collectives_are_tasks_and_done_halves_are_not_kernels(module):
    plan = Plan.unfused(module)
    verify_plan(plan, module)
    graph = build_task_graph(module, plan)
    names = [k.name for k in graph.kernels]
    assert "done" not in names and "pdone" not in names
    tasks = {c[0]: (graph.communication_kind(n), c[1]) for n, c in enumerate(graph.communications)}
    assert tasks == EXPECTED
    # The kernel that reads the permuted buffer waits for the permute's start.
    task_of = {c[0]: len(graph.kernels) + n for n, c in enumerate(graph.communications)}
    assert graph.dependencies[names.index("out")] == [task_of["pstart"]]
    assert graph.dependencies[task_of["pstart"]] == [task_of["start"]]
    assert graph.dependencies[names.index("y")] == [task_of["gathered"]]


def test_the_ring_ratios_of_the_collectives():
    profile = load_profile("a100-2x8-100g")
    size = 64 * 2**20
    whole = all_reduce_s(size, profile)
    for kind in ("all-gather", "reduce-scatter", "all-to-all"):
        assert collective_s(kind, size, profile) == pytest.approx(whole / 2)
    workers = profile.workers
    assert collective_s("collective-permute", size, profile) == pytest.approx(
        whole * workers / (2 * (workers - 1))
    )
    # On one ring, a permute's bandwidth term is S/B, the formula's.
    link = profile.intra_node
    ring = ring_all_reduce_s(size, workers, link)
    bandwidth_term = ring * workers / (2 * (workers - 1)) - workers * link.latency_s
    assert bandwidth_term == pytest.approx(size / link.bandwidth_bytes_per_s)


def test_measured_collective_points_replace_the_ratio_on_one_node():
    import dataclasses

    measured = ((4096.0, 3e-4), (65536.0, 1e-4), (1048576.0, 2e-3))
    one_node = dataclasses.replace(
        load_profile("h200-1x8-nvlink"), collective_points={"all-gather": measured}, nccl=None
    )
    # Read off the points (the 4 KB stall lowered to the larger size's time) ...
    assert collective_s("all-gather", 4096, one_node) == pytest.approx(1e-4)
    assert collective_s("all-gather", 65536 + (1048576 - 65536) / 2, one_node) == pytest.approx(
        1.05e-3
    )
    # ... for the kind measured only: the others keep the ring ratio.
    half = all_reduce_s(4096, one_node) / 2
    assert collective_s("reduce-scatter", 4096, one_node) == pytest.approx(half)
    # A caller's own all-reduce model gets the ratio from that model.
    assert collective_s("all-gather", 4096, one_node, lambda size, p: 1.0) == pytest.approx(0.5)
    # Points measured on one node say nothing of a cluster of several.
    several = dataclasses.replace(
        load_profile("a100-2x8-100g"), collective_points={"all-gather": measured}
    )
    assert collective_s("all-gather", 4096, several) == pytest.approx(
        all_reduce_s(4096, several) / 2
    )


@pytest.mark.parametrize("cluster", ["a100-2x8-100g", "h200-8x8-ib400"])
def test_the_simulator_costs_every_collective_by_its_kind(module, cluster):
    profile = load_profile(cluster)
    graph = build_task_graph(module, Plan.unfused(module))
    result = simulate(graph, profile, RooflineCostModel(profile))
    expected_ps = sum(to_ps(collective_s(kind, size, profile)) for kind, size in EXPECTED.values())
    assert result.comm_s == pytest.approx(expected_ps / PS_PER_S)
    kinds = {span[2] for span in result.spans_ps}
    assert {"all-gather", "reduce-scatter", "all-to-all", "collective-permute"} <= kinds


def test_the_thread_model_runs_every_collective_too(module):
    profile = load_profile("cpu-local")
    graph = build_task_graph(module, Plan.unfused(module))
    result = simulate(graph, profile, RooflineCostModel(profile))
    expected_ps = sum(to_ps(collective_s(kind, size, profile)) for kind, size in EXPECTED.values())
    # Each collective also waits for the slowest worker there (`worker_lag`).
    assert result.comm_s >= expected_ps / PS_PER_S
    assert {"all-gather", "collective-permute"} <= {span[2] for span in result.spans_ps}


@pytest.mark.parametrize("cluster", ["a100-2x8-100g", "h200-8x8-ib400"])
def test_incremental_evaluation_equals_a_full_simulation_with_every_collective(module, cluster):
    profile = load_profile(cluster)
    cost_model = RooflineCostModel(profile)
    for plan in (Plan.unfused(module), greedy_fusion_plan(module)):
        evaluated = local_changes_match_full_simulation(
            module, plan, profile, cost_model, seed=4, bucket_moves=False
        )
        assert evaluated > 0


def test_simulate_and_optimize_work_on_a_module_with_every_collective(module, tmp_path):
    path = tmp_path / "collectives.hlo.pb"
    save_module(module, str(path))
    done = run_cli("simulate", str(path), "--cluster", "a100-2x8-100g", "--json")
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    # Buckets: the two all-reduces and the reduce-scatter (sums of non-scalars,
    # taken as gradients in a module without backward marks).
    assert (found["buckets"], found["collectives"]) == (3, 8)
    assert {"gathered", "start", "pstart"} <= set(found["collective_ready_s"])
    done = run_cli("simulate", str(path), "--cluster", "a100-2x8-100g")
    assert "in 3 buckets and 5 other collectives" in done.stdout
    done = run_cli(
        "optimize",
        str(path),
        "--cluster",
        "a100-2x8-100g",
        "-o",
        str(tmp_path / "out.hlo.pb"),
        "--json",
    )
    assert done.returncode == 0, done.stderr


NODE_GROUPS = "replica_groups={{0,1,2,3,4,5,6,7},{8,9,10,11,12,13,14,15}}"
ACROSS_GROUPS = "replica_groups=" + "{" + ",".join(f"{{{d},{d + 8}}}" for d in range(8)) + "}"
MESH = """HloModule mesh, replica_count=16

sum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}

ENTRY main {
  x = f32[65536] parameter(0)
  w = f32[524288] parameter(1)
  gathered = f32[524288] all-gather(x), NODE_GROUPS, dimensions={0}
  y = f32[524288] multiply(gathered, w)
  across = f32[524288] all-reduce(y), ACROSS_GROUPS, to_apply=sum
  everyone = f32[524288] all-reduce(across), replica_groups={}, to_apply=sum
  ROOT out = f32[524288] add(everyone, w)
}
""".replace("NODE_GROUPS", NODE_GROUPS).replace("ACROSS_GROUPS", ACROSS_GROUPS)


def test_a_collective_over_part_of_a_mesh_is_priced_over_the_nodes_its_group_spans():
    """On a module of the profile's own 16 devices (2 nodes of 8), an all-gather
    inside each node runs one ring over the node's 8 devices, an all-reduce over
    one device in each node one ring across the 2 nodes, and one over every
    device the profile's whole hierarchy."""
    module = module_from_text(MESH)
    profile = load_profile("a100-2x8-100g")
    assert profile.workers == 16 and profile.devices_per_node == 8
    size = 524288 * 4
    inside = ring_all_reduce_s(size, 8, profile.intra_node) / 2
    link = profile.inter_node
    across_link = link.bandwidth_bytes_per_s / (8 if link.shared_by_node else 1)
    across = ring_all_reduce_s(size, 2, type(link)(across_link, link.latency_s))
    everyone = all_reduce_s(size, profile)
    assert inside < everyone / 2 and across != everyone  # the groups change the price
    result = simulate(
        build_task_graph(module, Plan.unfused(module)), profile, RooflineCostModel(profile)
    )
    durations: dict[str, list[int]] = {}
    for _, _, kind, start, end in result.spans_ps:
        durations.setdefault(kind, []).append(end - start)
    assert durations["all-gather"] == [to_ps(inside)]
    assert sorted(durations["all-reduce"]) == sorted([to_ps(across), to_ps(everyone)])
    # A step captured on fewer devices than the profile has keeps every worker.
    small = module_from_text(
        MESH.replace("replica_count=16", "replica_count=4")
        .replace(NODE_GROUPS, "replica_groups={{0,1},{2,3}}")
        .replace(ACROSS_GROUPS, "replica_groups={{0,2},{1,3}}")
    )
    graph = build_task_graph(small, Plan.unfused(small))
    spans = simulate(graph, profile, RooflineCostModel(profile)).spans_ps
    gathers = [end - start for _, _, kind, start, end in spans if kind == "all-gather"]
    assert gathers == [to_ps(collective_s("all-gather", size, profile))]
