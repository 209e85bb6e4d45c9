"""`disco-xla launch`: 2 jax.distributed processes on loopback agree on one plan,
train like a single process, run the original where they captured different
modules, and a failing rank stops the job instead of hanging it."""

from __future__ import annotations

import json
import textwrap

import numpy as np

from disco_xla.driver.trial import TIMING_ROUNDS
from disco_xla.frontends.jax_background import CONFIRM_CALLS, READY_CHECK_EVERY
from tests.conftest import run_cli

_STEP = """
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import disco_xla

    rank = jax.process_index()
    learning_rate = float(sys.argv[2]) if rank == 1 and len(sys.argv) > 2 else 0.1
    mesh = Mesh(np.array(jax.devices()), ("d",))

    def step(w, b, x):
        def loss(w, b):
            return jnp.mean(jnp.tanh(x @ w + b) ** 2)
        gw, gb = jax.grad(loss, argnums=(0, 1))(w, b)
        gw, gb = jax.lax.pmean(gw, "d"), jax.lax.pmean(gb, "d")
        return w - learning_rate * gw, b - learning_rate * gb

    fn = disco_xla.jit(
        jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P(), P(), P("d")),
                              out_specs=(P(), P()), check_vma=False)),
        max_evaluations=20, cache_dir=sys.argv[1], check_speed=False, background=False)
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((8, 4)).astype(np.float32) * 0.3
    b0 = np.zeros((4,), np.float32)
    batch = rng.standard_normal((2, 3, 8)).astype(np.float32)  # one shard per rank
    replicated = NamedSharding(mesh, P())
    w = jax.make_array_from_process_local_data(replicated, w0)
    b = jax.make_array_from_process_local_data(replicated, b0)
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), batch[rank])
    for _ in range(3):
        w, b = fn(w, b, x)
    plan = fn.plans()[0].to_json() if fn.plans() else None
    print("RESULT " + json.dumps({"rank": rank, "status": fn.status(), "plan": plan,
                                  "w": np.asarray(w.addressable_shards[0].data).tolist()}))
"""


# The form most JAX users write: jax.jit over sharded global arrays, no pmean;
# XLA's SPMD partitioner inserts the all-reduces.
_SHARDED_STEP = """
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import disco_xla

    rank = jax.process_index()
    mesh = Mesh(np.array(jax.devices()), ("d",))
    replicated, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("d"))

    def step(w, b, x):
        def loss(w, b):
            return jnp.mean(jnp.tanh(x @ w + b) ** 2)
        gw, gb = jax.grad(loss, argnums=(0, 1))(w, b)
        return w - 0.1 * gw, b - 0.1 * gb

    fn = disco_xla.jit(
        jax.jit(step, in_shardings=(replicated, replicated, split),
                out_shardings=(replicated, replicated)),
        max_evaluations=20, cache_dir=sys.argv[1] + f"/rank{rank}", background=BACKGROUND)
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((8, 4)).astype(np.float32) * 0.3
    b0 = np.zeros((4,), np.float32)
    batch = rng.standard_normal((2, 3, 8)).astype(np.float32)  # one shard per rank
    w = jax.make_array_from_process_local_data(replicated, w0)
    b = jax.make_array_from_process_local_data(replicated, b0)
    x = jax.make_array_from_process_local_data(split, batch[rank], (6, 8))
    for index in range(STEPS):
        w, b = jax.block_until_ready(fn(w, b, x))
        if index == 1:
            assert fn.wait(600)  # the background work, when there is any
    plan = fn.plans()[0].to_json() if fn.plans() else None
    print("RESULT " + json.dumps({"rank": rank, "status": fn.status(), "plan": plan,
                                  "measurements": fn.measurements(),
                                  "w": np.asarray(w.addressable_shards[0].data).tolist()}))
"""


def _reference_weights(steps: int = 3) -> np.ndarray:
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 4)).astype(np.float32) * 0.3
    b = np.zeros((4,), np.float32)
    batch = rng.standard_normal((2, 3, 8)).astype(np.float32)
    for _ in range(steps):
        grads = [
            jax.grad(lambda w, b, x=x: jnp.mean(jnp.tanh(x @ w + b) ** 2), argnums=(0, 1))(w, b)
            for x in batch
        ]
        w = w - 0.1 * (grads[0][0] + grads[1][0]) / 2
        b = b - 0.1 * (grads[0][1] + grads[1][1]) / 2
    return np.asarray(w)


def _results(stdout: str) -> dict[int, dict]:
    found = {}
    for line in stdout.splitlines():
        _, _, rest = line.partition("RESULT ")
        if rest:
            result = json.loads(rest)
            found[result["rank"]] = result
    return found


def _two_ranks(tmp_path, name: str, step: str) -> dict[int, dict]:
    """Run the step script on 2 ranks; each rank's RESULT, by rank."""
    script = tmp_path / name
    script.write_text(textwrap.dedent(step))
    result = run_cli(
        "launch", "-n", "2", "--timeout-s", "240", str(script), str(tmp_path), timeout_s=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    ranks = _results(result.stdout)
    assert sorted(ranks) == [0, 1]
    return ranks


def test_two_ranks_agree_on_one_plan_and_train_like_one_process(tmp_path):
    ranks = _two_ranks(tmp_path, "step.py", _STEP)
    assert ranks[0]["status"] == ranks[1]["status"] == ["optimized"]
    assert ranks[0]["plan"] is not None and ranks[0]["plan"] == ranks[1]["plan"]
    for rank in ranks.values():
        np.testing.assert_allclose(rank["w"], _reference_weights(), rtol=1e-5, atol=1e-6)


def test_two_ranks_time_the_candidates_of_a_sharded_jit_step_and_agree_on_one(tmp_path):
    """The all-reduces exist only after SPMD partitioning: each rank captures the
    partitioned module, they agree on one plan and its candidates, time them
    together, and reach one verdict from the same averaged times (each rank with
    a cache of its own, so neither reads the other's choice), then train like
    one process."""
    script = _SHARDED_STEP.replace("BACKGROUND", "False").replace("STEPS", "3")
    ranks = _two_ranks(tmp_path, "sharded_step.py", script)
    assert ranks[0]["status"] == ranks[1]["status"], (ranks[0]["status"], ranks[1]["status"])
    (status,) = ranks[0]["status"]
    assert status.startswith(("optimized", "original: faster here")), status
    assert ranks[0]["measurements"] == ranks[1]["measurements"]
    (report,) = ranks[0]["measurements"]
    assert report["plan"]["equal"] and "measured_s" in report["original"], report
    timed = [label for label, entry in report.items() if "measured_s" in entry]
    assert len(timed) >= 3, report  # the original, the plan and another candidate
    plan = json.loads(ranks[0]["plan"])
    assert ranks[0]["plan"] == ranks[1]["plan"] and plan["all_reduce_buckets"]
    for rank in ranks.values():
        np.testing.assert_allclose(rank["w"], _reference_weights(), rtol=1e-5, atol=1e-6)


def test_in_the_background_two_ranks_switch_to_one_program_on_the_same_step(tmp_path):
    """With the work in the background, each rank runs the original until every
    rank has built the candidates (checked on the same calls), judges them on
    the same call, times them in rotation on the training steps, and switches
    on the same call to the same program: the ranks train like one process."""
    # ... and a winner's confirmation in three blocks.
    steps = 3 * READY_CHECK_EVERY + 7 * (TIMING_ROUNDS + 1) + 3 * CONFIRM_CALLS[1]
    script = _SHARDED_STEP.replace("BACKGROUND", "True").replace("STEPS", str(steps))
    ranks = _two_ranks(tmp_path, "background_step.py", script)
    assert ranks[0]["status"] == ranks[1]["status"], (ranks[0]["status"], ranks[1]["status"])
    (status,) = ranks[0]["status"]
    assert status.startswith(("optimized", "original: faster here")), status
    assert ranks[0]["measurements"] == ranks[1]["measurements"]
    (report,) = ranks[0]["measurements"]
    assert len([entry for entry in report.values() if "measured_s" in entry]) >= 2, report
    for rank in ranks.values():
        np.testing.assert_allclose(rank["w"], _reference_weights(steps), rtol=1e-4, atol=1e-5)


def test_ranks_with_different_modules_run_the_original_with_one_warning(tmp_path):
    """Rank 1 steps with another learning rate, so the ranks capture different
    modules: no plan can serve both, and each runs the step as written."""
    script = tmp_path / "step.py"
    script.write_text(textwrap.dedent(_STEP))
    result = run_cli(
        "launch", "-n", "2", "--timeout-s", "240", str(script), str(tmp_path), "0.5", timeout_s=300
    )
    assert result.returncode == 0, result.stdout[-3000:]
    for rank in (0, 1):
        lines = [line for line in result.stdout.splitlines() if line.startswith(f"[{rank}]")]
        assert sum("DiscoFallbackWarning" in line for line in lines) == 1, lines
        (report,) = [json.loads(line.split("RESULT ", 1)[1]) for line in lines if "RESULT" in line]
        (status,) = report["status"]
        assert status.startswith("original: ") and "different modules" in status, status
