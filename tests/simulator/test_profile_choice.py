"""`cluster="auto"`: the device kinds JAX reports map to the shipped profile of
that GPU at the job's scale, a node per process (no GPU needed: the rule is a
pure function of the device description); CPU jobs map to the profile of their
runtime; anything else to no profile and one line on how to write one."""

from __future__ import annotations

import pytest

from disco_xla.errors import DiscoInputError
from disco_xla.simulator.profile_choice import (
    GPU_FAMILIES,
    DeviceDescription,
    ProfileChoice,
    choose_profile,
)
from disco_xla.simulator.profiles import available_profiles, load_profile


def _gpu(kind: str, per_process: int = 8, processes: int = 1) -> ProfileChoice:
    return choose_profile(DeviceDescription("gpu", kind, per_process, processes))


@pytest.mark.parametrize(
    "kind, per_process, processes, cluster",
    [
        # One process: one node, the NVLink-only profile where one is shipped.
        ("NVIDIA H200", 8, 1, "h200-1x8-nvlink"),
        ("NVIDIA H200", 4, 1, "h200-1x8-nvlink@1x4"),
        ("NVIDIA H100 80GB HBM3", 8, 1, "h100-32x8-ib400@1x8"),
        ("NVIDIA A100-SXM4-80GB", 8, 1, "a100-2x8-100g@1x8"),
        ("Tesla V100-SXM2-32GB", 8, 1, "v100-2x8-25g@1x8"),
        # Several processes: a node each, the GPU's multi-node profile at that scale.
        ("NVIDIA H100 80GB HBM3", 8, 4, "h100-32x8-ib400@4x8"),
        ("NVIDIA H100 80GB HBM3", 8, 32, "h100-32x8-ib400"),
        ("NVIDIA H200", 8, 8, "h200-8x8-ib400"),
        ("NVIDIA H200", 8, 16, "h200-8x8-ib400@16x8"),
        ("NVIDIA A100-SXM4-80GB", 8, 2, "a100-2x8-100g"),
        ("NVIDIA A100-SXM4-80GB", 4, 3, "a100-2x8-100g@3x4"),
        ("Tesla V100-SXM2-16GB", 8, 2, "v100-2x8-25g"),
        ("Tesla V100-SXM2-16GB", 1, 16, "v100-2x8-25g@16x1"),
    ],
)
def test_a_known_gpu_gets_its_profile_at_the_jobs_scale(kind, per_process, processes, cluster):
    choice = _gpu(kind, per_process, processes)
    assert choice.cluster == cluster
    profile = load_profile(choice.cluster)
    assert (profile.nodes, profile.devices_per_node) == (processes, per_process)
    assert kind.split()[-1] in choice.reason or kind in choice.reason


def test_several_h100_processes_say_which_network_is_assumed_and_how_to_name_another():
    choice = _gpu("NVIDIA H100 80GB HBM3", 8, 4)
    assert choice.describe() == (
        "profile h100-32x8-ib400@4x8 (auto: 8 x NVIDIA H100 80GB HBM3 per process, 4 "
        "processes, a node each; network assumed InfiniBand NDR 400G, one adapter per GPU, "
        "which the devices do not tell (for another, name cluster='h100-32x8-eth100@4x8' or "
        "cluster='h100-a3-tcpx@4x8'))"
    )
    for named in ("h100-32x8-eth100@4x8", "h100-a3-tcpx@4x8"):
        assert load_profile(named).workers == 32


@pytest.mark.parametrize(
    "platform, kind",
    [
        ("gpu", "NVIDIA GH200 480GB"),
        ("gpu", "NVIDIA H100 PCIe"),
        ("gpu", "NVIDIA H200 NVL"),
        ("gpu", "NVIDIA A100-SXM4-40GB"),  # HBM2 at 1.6 TB/s, not the profile's 2.0
        ("gpu", "NVIDIA A100 80GB PCIe"),
        ("gpu", "AMD Instinct MI300X"),
        ("tpu", "TPU v5 lite"),
    ],
)
def test_an_unknown_device_gets_no_profile_and_one_line_on_writing_one(platform, kind):
    choice = choose_profile(DeviceDescription(platform, kind, 8, 2))
    assert choice.cluster is None
    text = choice.describe()
    assert text.startswith("no profile (auto: no shipped profile for 8 x ")
    assert kind in text and "cluster='my.yaml'" in text and "\n" not in text


def test_a_process_with_mixed_gpus_gets_no_profile():
    choice = _gpu("NVIDIA H100 80GB HBM3 + NVIDIA A100-SXM4-80GB", 2)
    assert choice.cluster is None and "differ" in choice.reason


def test_cpu_jobs_get_the_profile_calibrated_on_their_runtime():
    in_process = choose_profile(DeviceDescription("cpu", "cpu", 4, 1))
    assert in_process == ProfileChoice("cpu-local-inprocess", "4 CPU devices in one process")
    processes = choose_profile(DeviceDescription("cpu", "cpu", 1, 2))
    assert processes.cluster == "cpu-local" and "2 processes" in processes.reason
    for choice in (in_process, processes):
        assert load_profile(choice.cluster).execution == "cpu-threads"


def test_every_family_names_shipped_profiles_of_its_gpu():
    shipped = set(available_profiles())
    for family in GPU_FAMILIES:
        named = {family.one_node, family.several_nodes, *family.other_networks}
        assert named <= shipped
        gpus = {load_profile(name).device_name for name in named}
        assert len(gpus) == 1, gpus


def test_a_shipped_profile_named_by_its_scale_has_that_topology():
    # `choose_profile` names a profile plainly where the job has the scale its
    # name says ('h100-32x8-ib400': 32 nodes of 8): the name must not lie.
    for name in available_profiles():
        scales = [p for p in name.split("-") if "x" in p and p.replace("x", "").isdigit()]
        if scales:
            nodes, per_node = map(int, scales[0].split("x"))
            profile = load_profile(name)
            assert (profile.nodes, profile.devices_per_node) == (nodes, per_node), name


def test_a_rescaled_profile_keeps_one_adapter_per_gpu_at_most():
    profile = load_profile("h100-32x8-ib400@2x4")
    assert profile.name == "h100-32x8-ib400@2x4" and profile.nccl.nics_per_node == 4
    assert load_profile("h100-32x8-eth100@2x4").nccl.nics_per_node == 1
    assert load_profile("h100-32x8-ib400@32x8") == load_profile("h100-32x8-ib400")


def test_a_measured_profile_is_not_rescaled_and_auto_is_not_a_profile():
    with pytest.raises(DiscoInputError, match="measured at 2 workers"):
        load_profile("cpu-local@2x2")
    with pytest.raises(DiscoInputError, match="read from the devices only where a step runs"):
        load_profile("auto")
    with pytest.raises(DiscoInputError, match="at least one node"):
        load_profile("h100-32x8-ib400@0x8")
