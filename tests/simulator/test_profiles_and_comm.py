"""Cluster profiles, the all-reduce model, and calibration on this machine."""

from __future__ import annotations

import pytest
import yaml

from disco_xla import DiscoInputError
from disco_xla.profiling.cpu_profile import fit_ring_model
from disco_xla.simulator.comm import all_reduce_s, ring_all_reduce_s
from disco_xla.simulator.profiles import (
    Link,
    available_profiles,
    load_profile,
)
from tests.conftest import run_cli, simulate_plans

SHIPPED = [
    "a100-2x8-100g", "cpu-local", "h100-32x8-eth100", "h100-32x8-ib400", "h100-128x8-ib400",
    "h200-1x8-nvlink", "h200-8x8-ib400", "h200-32x8-ib400", "h200-128x8-ib400",
    "horovod-local", "v100-2x8-25g", "h100-a3-tcpx",
]  # fmt: skip


def test_every_shipped_profile_loads():
    assert set(SHIPPED) <= set(available_profiles())
    for name in SHIPPED:
        profile = load_profile(name)
        assert profile.name == name and profile.workers >= 2
        assert all(value > 0 for value in profile.peak_flops.values())
    assert load_profile("cpu-local").execution == "cpu-threads"
    assert load_profile("h200-8x8-ib400").workers == 64
    assert load_profile("h200-128x8-ib400").workers == load_profile("h100-128x8-ib400").workers
    assert load_profile("h100-128x8-ib400").workers == 1024
    # The Ethernet's one adapter per node is shared by the node's 8 GPUs.
    assert load_profile("h100-32x8-eth100").inter_node.shared_by_node
    horovod = load_profile("horovod-local")
    assert horovod.collectives_after_compute and not horovod.overlap
    assert horovod.for_workers(4).workers == 4 and horovod.for_workers(4).all_reduce_points
    assert not load_profile("cpu-local").collectives_after_compute


def test_ring_formula():
    link = Link(bandwidth_bytes_per_s=1e9, latency_s=1e-5)
    # 2(p-1)·alpha + 2(p-1)/p · S/B with p = 4, S = 1 MB
    assert ring_all_reduce_s(1e6, 4, link) == pytest.approx(6 * 1e-5 + 1.5 * 1e-3)
    assert ring_all_reduce_s(1e6, 1, link) == 0.0


def test_hierarchical_beats_a_flat_ring_over_a_slow_network():
    hierarchical = load_profile("v100-2x8-25g")
    flat = hierarchical.__class__(**{**hierarchical.__dict__, "all_reduce": "ring"})
    size = 100e6
    assert all_reduce_s(size, hierarchical) < all_reduce_s(size, flat)
    inside = 2 * (7 * 5e-6 + 7 / 8 * size / 150e9)
    # One 25 Gbit/s adapter per node: the 8 rings across nodes, each on 1/8 of the
    # bytes, share it.
    assert hierarchical.inter_node.shared_by_node
    across = 2 * 25e-6 + size / 3.125e9
    assert all_reduce_s(size, hierarchical) == pytest.approx(inside + across)


def test_an_adapter_per_device_gives_each_ring_across_nodes_its_own_link():
    # 8 nodes x 8 GPUs, 50 GB/s per GPU, priced by the ring formulas (without
    # the profile's NCCL figures, `test_nccl` tests those).
    profile = load_profile("h200-8x8-ib400")
    profile = profile.__class__(**{**profile.__dict__, "nccl": None})
    assert not profile.inter_node.shared_by_node
    size = 100e6
    inside = 2 * (7 * 3e-6 + 7 / 8 * size / 450e9)
    across = 2 * 7 * 5e-6 + 2 * 7 / 8 * (size / 8) / 50e9
    assert all_reduce_s(size, profile) == pytest.approx(inside + across)
    shared = profile.__class__(
        **{**profile.__dict__, "inter_node": Link(50e9, 5e-6, shared_by_node=True)}
    )
    assert all_reduce_s(size, shared) - inside == pytest.approx(
        2 * 7 * 5e-6 + 2 * 7 / 8 * size / 50e9
    )


def test_a_calibrated_profile_reads_its_measured_points():
    import dataclasses

    points = ((4096.0, 4e-4), (65536.0, 3e-3), (262144.0, 1e-3), (1048576.0, 2e-3))
    profile = dataclasses.replace(load_profile("cpu-local"), all_reduce_points=points)
    assert all_reduce_s(4096, profile) == pytest.approx(4e-4)
    assert all_reduce_s(1024, profile) == pytest.approx(4e-4)  # latency-bound below
    # The stall at 64 KB is more than a larger message took: it is lowered to 1 ms.
    assert all_reduce_s(65536, profile) == pytest.approx(1e-3)
    assert all_reduce_s((262144 + 1048576) / 2, profile) == pytest.approx(1.5e-3)
    slope = (2e-3 - 1e-3) / (1048576 - 262144)
    assert all_reduce_s(2 * 1048576, profile) == pytest.approx(2e-3 + slope * 1048576)
    # The shipped CPU profiles were calibrated: they carry their points.
    assert load_profile("cpu-local").all_reduce_points
    assert not load_profile("a100-2x8-100g").all_reduce_points


def test_unknown_profile_name_lists_the_valid_ones():
    with pytest.raises(DiscoInputError, match="unknown cluster profile; choose from a100-2x8-100g"):
        load_profile("tpu-v9")


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda d: d.pop("links"), "missing key 'links'"),
        (lambda d: d.update(colour="blue"), "unknown key 'colour'"),
        (lambda d: d["device"]["peak_flops"].update(f32="fast"), "device.peak_flops.f32"),
        (lambda d: d.update(all_reduce="tree"), "bad key 'all_reduce'"),
        (lambda d: d["links"]["inter_node"].update(per="rack"), "links.inter_node.per"),
        (lambda d: d["topology"].update(nodes=0), "topology.nodes"),
        (lambda d: d.update(tuple_all_reduce_element_s=-1), "tuple_all_reduce_element"),
        (lambda d: d.update(step_overhead_s=-1e-6), "step_overhead_s"),
        (lambda d: d.update(step_buffer_s="slow"), "step_buffer_s"),
        (lambda d: d.update(kernel_time_scale=0), "kernel_time"),
        (lambda d: d.update(worker_lag=-0.5), "worker_lag"),
        (lambda d: d.update(collectives_after_compute="yes"), "collectives_after_compute"),
        (lambda d: d.update(calibration={"points": [{"bytes": 4096}]}), "calibration.points"),
        (
            lambda d: d.update(calibration={"collective_points": {"broadcast": [[4096, 1e-4]]}}),
            "calibration.collective_points.broadcast",
        ),
        (
            lambda d: d.update(calibration={"collective_points": {"all-gather": [[4096]]}}),
            "each point is",
        ),
        (
            lambda d: d.update(calibration={"collective_points": {"all-to-all": [[4096, -1]]}}),
            "all-to-all.seconds",
        ),
    ],
)
def test_a_malformed_profile_names_the_bad_key(tmp_path, edit, problem):
    data = yaml.safe_load(open(load_profile("a100-2x8-100g").source).read())
    edit(data)
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(DiscoInputError) as raised:
        load_profile(str(path))
    assert problem in str(raised.value) and str(path) in str(raised.value)


def test_the_fit_recovers_alpha_and_bandwidth_from_exact_times():
    alpha, bandwidth, workers = 50e-6, 2e9, 4
    link = Link(bandwidth, alpha)
    measured = [(s, ring_all_reduce_s(s, workers, link)) for s in (4096 * 4**k for k in range(9))]
    fit = fit_ring_model(measured, workers)
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-6)
    assert fit.bandwidth_bytes_per_s == pytest.approx(bandwidth, rel=1e-6)
    assert fit.max_relative_residual < 1e-6


def _cpu_local_with(tmp_path, sections: dict) -> str:
    """cpu-local's profile with `sections` as its figures by worker count (none
    when empty) written to a file: the path."""
    data = yaml.safe_load(open(load_profile("cpu-local").source).read())
    data.pop("other_worker_counts", None)
    if sections:
        data["other_worker_counts"] = sections
    path = tmp_path / f"by-count-{len(sections)}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def _four_workers(section: dict) -> dict:
    return {4: {"topology": {"devices_per_node": 4, "nodes": 1}, **section}}


# Every all-reduce costs at least 5 ms at 4 workers: far above cpu-local's own.
SLOW_AT_FOUR = {
    "calibration": {
        "points": [{"bytes": 4096, "measured_s": 5e-3}, {"bytes": 2**28, "measured_s": 1.0}]
    },
    "worker_lag": 0.5,
}


def test_a_profile_prices_a_module_at_the_worker_count_it_was_measured_at(tmp_path):
    path = _cpu_local_with(tmp_path, _four_workers(SLOW_AT_FOUR))
    own = load_profile(path)
    at_four = load_profile(path, workers=4)
    assert own.workers == 2 and at_four.workers == 4
    assert all_reduce_s(4096, at_four) == pytest.approx(5e-3)
    assert all_reduce_s(4096, own) == pytest.approx(all_reduce_s(4096, load_profile("cpu-local")))
    assert all_reduce_s(4096, own) < 1e-3
    # The section replaces what it holds and nothing else.
    assert at_four.worker_lag == 0.5 and own.worker_lag == load_profile("cpu-local").worker_lag
    assert at_four.peak_flops == own.peak_flops and at_four.name == own.name
    assert at_four.tuple_all_reduce_element_s == own.tuple_all_reduce_element_s
    # A count it has no figures for is priced with its own.
    assert load_profile(path, workers=8) is not at_four
    assert load_profile(path, workers=8).workers == 2


def test_simulate_prices_a_four_device_module_with_the_figures_for_four(tmp_path, module_files):
    module = module_files["jax_pmap_step"]  # a pmap step over 4 devices
    slow = _cpu_local_with(tmp_path, _four_workers(SLOW_AT_FOUR))
    at_four = simulate_plans(module, slow, ["xla"])["xla"]
    own = simulate_plans(module, _cpu_local_with(tmp_path, {}), ["xla"])["xla"]
    assert at_four["buckets"] >= 1
    assert at_four["comm_s"] >= at_four["buckets"] * 5e-3
    assert own["comm_s"] < at_four["buckets"] * 5e-3


@pytest.mark.parametrize(
    "section, problem",
    [
        ({"name": "other"}, "'other_worker_counts.4.name': not measured by count"),
        ({"topology": {"devices_per_node": 3, "nodes": 1}}, "expected 4 devices on one node"),
        ({"worker_lag": -1.0}, "'worker_lag'"),
    ],
)
def test_a_bad_worker_count_section_is_a_one_line_error(tmp_path, module_files, section, problem):
    path = _cpu_local_with(tmp_path, _four_workers(section))
    with pytest.raises(DiscoInputError, match=problem) as error:
        load_profile(path)
    assert path in str(error.value) and "\n" not in str(error.value)
    path = _cpu_local_with(tmp_path, {2: {"topology": {"devices_per_node": 2, "nodes": 1}}})
    with pytest.raises(DiscoInputError, match="the profile's own count"):
        load_profile(path)
    result = run_cli("simulate", module_files["jax_pmap_step"], "--cluster", path)
    assert result.returncode == 2 and path in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
