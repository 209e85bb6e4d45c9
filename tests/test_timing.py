"""`disco_xla.timing`: `cpus_kept_awake` (the PM QoS request it writes, and what it
does where it may not write one) and `traced_events`."""

from __future__ import annotations

import os

import pytest

from disco_xla.timing import CPU_LATENCY_DEVICE, cpus_kept_awake


def test_the_request_is_a_latency_of_zero_held_until_the_block_ends(tmp_path):
    device = tmp_path / "cpu_dma_latency"
    device.write_bytes(b"\xff\xff\xff\x7f")
    with cpus_kept_awake(str(device)) as held:
        assert held
        # A 32-bit 0, as the kernel reads the request.
        assert device.read_bytes() == (0).to_bytes(4, "little")
    open_files = os.listdir("/proc/self/fd")
    assert all(os.path.realpath(f"/proc/self/fd/{fd}") != str(device) for fd in open_files)


def test_without_the_device_timing_goes_on_unheld(tmp_path):
    with cpus_kept_awake(str(tmp_path / "missing")) as held:
        assert held is False


def test_an_error_inside_the_block_still_releases_the_request(tmp_path):
    device = tmp_path / "cpu_dma_latency"
    device.write_bytes(b"")
    with pytest.raises(ZeroDivisionError), cpus_kept_awake(str(device)):
        1 / 0  # noqa: B018
    assert all(
        os.path.realpath(f"/proc/self/fd/{fd}") != str(device) for fd in os.listdir("/proc/self/fd")
    )


@pytest.mark.skipif(
    not os.access(CPU_LATENCY_DEVICE, os.W_OK), reason="needs write access to PM QoS"
)
def test_the_real_request_is_held_on_this_machine():
    with cpus_kept_awake() as held:
        assert held


def test_traced_kernels_carry_their_start_in_run_order():
    import jax
    import jax.numpy as jnp

    from disco_xla.timing import traced_events

    x = jax.block_until_ready(jnp.ones(64))
    step = jax.jit(lambda x: jnp.sin(x) + 1).lower(x).compile()
    kernels = [
        stats
        for _, stats, _ in traced_events(lambda: jax.block_until_ready(step(x)), 3, ("/host:CPU",))
        if "hlo_op" in stats
    ]
    assert kernels
    starts = {}
    for stats in kernels:
        assert stats["start_ns"] >= 0
        starts.setdefault(stats["run_id"], []).append(stats["start_ns"])
    # Three runs, one after another: each run's kernels start after the last one's.
    runs = sorted(starts.values(), key=min)
    assert len(runs) == 3
    assert all(max(a) < min(b) for a, b in zip(runs, runs[1:], strict=False))
