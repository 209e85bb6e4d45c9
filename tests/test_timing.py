"""`disco_xla.timing`: `cpus_kept_awake` (the PM QoS request it writes, and what it
does where it may not write one), `traced_events` and `thunk_seconds`."""

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


def _thunk(name, start_us, seconds_us, flow=None, device=0):
    stats = {"hlo_op": name, "run_id": 1, "device_ordinal": device, "start_ns": start_us * 1e3}
    if flow is not None:
        stats["_p"] = flow
    return (name, stats, seconds_us * 1e-6)


def _completion(name, at_us, flow):
    return (f"end: {name}", {"_c": flow, "start_ns": at_us * 1e3}, 0.0)


def test_each_moment_counts_once_and_asynchronous_tails_share_the_rest():
    from disco_xla.timing import thunk_seconds

    events = [
        # Two convolutions launched at 0 and 10 us, whose events last 1 us and
        # whose work completes at 100 and 110 us; a fusion runs from 50 to 60
        # meanwhile, and another alone from 110 to 130.
        _thunk("conv.1", 0, 1, flow=7),
        _thunk("conv.2", 10, 1, flow=8),
        _thunk("fusion.4", 50, 10),
        _thunk("fusion.3", 110, 20, flow=9),
        _completion("conv.1", 100, 7),
        _completion("conv.2", 110, 8),
        _completion("fusion.3", 129, 9),  # inside its own event: synchronous
        # The other device's thunk, in flight at the same time, shares nothing.
        _thunk("conv.1", 0, 50, device=1),
        ("PjitFunction(f)", {"start_ns": 0.0}, 1.0),
    ]
    seconds = {(n, s.get("device_ordinal")): t * 1e6 for n, s, t in thunk_seconds(events)}
    # conv.1: its 1 us event, its tail alone from 1 to 10, then half of 11-50 and of 60-100.
    assert seconds["conv.1", 0] == pytest.approx(1 + 9 + (39 + 40) / 2)
    # conv.2: its event, half of 11-50 and 60-100, then alone from 100 to 110.
    assert seconds["conv.2", 0] == pytest.approx(1 + (39 + 40) / 2 + 10)
    assert seconds["fusion.4", 0] == pytest.approx(10)
    assert seconds["fusion.3", 0] == pytest.approx(20)
    # Every moment of device 0's 130 us counted once.
    assert sum(t for (n, d), t in seconds.items() if d == 0) == pytest.approx(130)
    assert seconds["conv.1", 1] == pytest.approx(50)
    assert seconds["PjitFunction(f)", None] == pytest.approx(1e6)
    assert seconds["end: conv.1", None] == 0


def test_a_thunk_running_others_inside_it_keeps_its_own_time_and_blocks_nothing():
    from disco_xla.timing import thunk_seconds

    events = [
        _thunk("while.1", 0, 100),
        _thunk("conv.2", 10, 1, flow=3),  # completes at 40
        _thunk("fusion.3", 50, 30),
        _completion("conv.2", 40, 3),
    ]
    seconds = [t * 1e6 for _, _, t in thunk_seconds(events)]
    assert seconds[:3] == pytest.approx([100, 30, 30])


def test_kernel_times_of_a_grouped_convolutions_gradient_account_for_its_step():
    """XLA:CPU runs a grouped convolution's gradient asynchronously, and its
    thunk's own event ends at launch: 13-15% of the step measured; until its
    completion, 92-102%."""
    import jax
    import jax.numpy as jnp

    from disco_xla.profiling.kernel_times import profile_kernel_times
    from disco_xla.timing import median_seconds

    def loss(weights, images):
        out = jax.lax.conv_general_dilated(
            images,
            weights,
            (1, 1),
            "SAME",
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
            feature_group_count=4,
        )
        return jnp.sum(jnp.tanh(out))

    images = jnp.ones((2, 16, 16, 64))
    weights = jnp.full((3, 3, 16, 64), 0.01)
    step = jax.jit(jax.grad(loss, argnums=(0, 1)))

    def run():
        return jax.block_until_ready(step(weights, images))

    step_s = median_seconds(run, 10)
    kernels_s = sum(profile_kernel_times(run, repeats=5).values())
    assert kernels_s > 0.5 * step_s, (kernels_s, step_s)
