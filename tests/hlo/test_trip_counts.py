"""Trip counts of `while` loops: from the induction variable of scan / fori_loop
loops, from XLA's backend config, and unknown (counted once); FLOPs and
`inspect` count a loop body once per trip."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from disco_xla import capture_jax, save_module
from disco_xla.hlo.graph import HloModule
from disco_xla.hlo.trip_counts import executions, loop_trip_counts, trip_count
from tests.conftest import run_cli


def _loop_module(trips: int, start: int = 0) -> HloModule:
    def body(i, h):
        return jnp.tanh(h @ jnp.ones((16, 16), jnp.float32))

    fn = jax.jit(lambda x: jax.lax.fori_loop(start, start + trips, body, x))
    return capture_jax(fn, jnp.ones((4, 16), jnp.float32))


@pytest.mark.parametrize(("trips", "start"), [(1, 0), (3, 0), (5, 2)])
def test_a_fori_loop_trip_count_comes_from_its_induction_variable(trips, start):
    module = _loop_module(trips, start)
    (loop,) = [i for i in module.instructions() if i.opcode == "while"]
    assert trip_count(loop).count == trips
    assert trip_count(loop).source == "induction variable"
    body = next(c for c in loop.called_computations if c.id == loop.proto.called_computation_ids[0])
    assert executions(module)[body.name] == trips


def test_flops_count_the_body_once_per_trip():
    one, five = _loop_module(1), _loop_module(5)
    body_dot_flops = 2 * 4 * 16 * 16
    assert five.total_flops - one.total_flops >= 4 * body_dot_flops


def test_a_known_trip_count_in_the_backend_config_wins_and_unknown_counts_once():
    module = _loop_module(3)
    (loop,) = [i for i in module.instructions() if i.opcode == "while"]
    loop.proto.backend_config = json.dumps({"known_trip_count": {"n": "7"}}).encode()
    assert trip_count(loop).count == 7 and trip_count(loop).source == "backend config"
    loop.proto.ClearField("backend_config")
    # Break the pattern: the loop now starts from a parameter, not a constant.
    module = capture_jax(
        jax.jit(lambda x, n: jax.lax.fori_loop(0, n, lambda i, h: h * 2, x)),
        jnp.ones(4),
        jnp.int32(3),
    )
    (loop,) = [i for i in module.instructions() if i.opcode == "while"]
    assert trip_count(loop).count == 1 and trip_count(loop).source == "unknown"


def test_inspect_lists_the_loops_of_a_scan_with_their_trip_counts(tmp_path):
    def step(carry, x):
        return jnp.tanh(carry @ x), None

    fn = jax.jit(lambda c, xs: jax.lax.scan(step, c, xs)[0])
    module = capture_jax(fn, jnp.ones((2, 8)), jnp.ones((6, 8, 8)))
    assert [t.count for t in loop_trip_counts(module).values()] == [6]
    path = tmp_path / "scan.hlo.pb"
    save_module(module, path)
    summary = json.loads(run_cli("inspect", "--json", str(path)).stdout)
    ((name, loop),) = summary["loops"].items()
    assert loop == {"trip_count": 6, "source": "induction variable"}
    assert f"{name} x6" in run_cli("inspect", str(path)).stdout
    assert np.isfinite(summary["flops"])
