"""JAX's persistent compilation cache, turned on by the user: a rerun captures a
sharded step again (the partitioner's dump is not skipped by a cache hit), and
disco-xla's own compiles are not written to the user's cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys

_SCRIPT = r"""
import json, os, sys
import jax
jax.config.update("jax_num_cpu_devices", 2)
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from disco_xla.capture import lowered_module
from disco_xla.runtime.xla_runner import program_for

mesh = Mesh(np.array(jax.devices()), ("data",))
w = jax.device_put(jnp.ones((16, 8)), NamedSharding(mesh, P()))
x = jax.device_put(jnp.ones((4, 16)), NamedSharding(mesh, P("data")))

def step(w, x):
    return w - 0.1 * jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)

jax.jit(step)(w, x).block_until_ready()  # the user's own run: JAX writes it to the cache
before = len(os.listdir(sys.argv[1]))
module = lowered_module(jax.jit(step).lower(w, x), "<step>")  # same key: not served from it
program = program_for(module)
opcodes = sorted({i.opcode for i in module.instructions()})
(out,), _ = program.run([[np.ones((16, 8), np.float32), np.ones((2, 16), np.float32)]] * 2)
print(json.dumps({"opcodes": opcodes, "written": len(os.listdir(sys.argv[1])) - before,
                  "out": float(np.asarray(out).sum())}))
"""


def _run(cache: str) -> dict:
    env = dict(os.environ)
    env.update(JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT, cache],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_rerun_with_the_users_cache_captures_the_sharded_step_again(tmp_path):
    cache = str(tmp_path / "jax_cache")
    os.makedirs(cache)
    first = _run(cache)
    assert "all-reduce" in first["opcodes"]  # the partitioner's module, dumped
    assert first["written"] == 0  # our compile from HLO stays out of the user's cache
    again = _run(cache)
    assert again["opcodes"] == first["opcodes"]  # dumped again, not skipped by a hit
    assert again["out"] == first["out"]
