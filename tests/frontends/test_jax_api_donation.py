"""`disco_xla.jit` on steps that donate their state, as training loops do: the
first call never reads a donated buffer, the rewritten program consumes what
JAX's consumes, and every failure on our side, before or after the original
has consumed its arguments, runs the original with one warning."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import disco_xla
from disco_xla.frontends.jax_api import CALLED_ONCE, DiscoFallbackWarning

SEARCH = {"max_evaluations": 10, "budget_s": 60.0, "check_speed": False, "background": False}


def _update(params, batch):
    inputs, targets = batch

    def loss(params):
        hidden = jnp.tanh(inputs @ params["w1"] + params["b1"])
        return jnp.mean((hidden @ params["w2"] - targets) ** 2)

    grads = jax.grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)


def _state(mesh):
    rng = np.random.default_rng(0)
    params = {
        "w1": rng.standard_normal((8, 16), np.float32) * 0.3,
        "b1": np.zeros((16,), np.float32),
        "w2": rng.standard_normal((16, 2), np.float32) * 0.3,
    }
    batches = [
        (rng.standard_normal((4, 8), np.float32), rng.standard_normal((4, 2), np.float32))
        for _ in range(4)
    ]
    return jax.device_put(params, NamedSharding(mesh, P())), [
        jax.device_put(batch, NamedSharding(mesh, P("d"))) for batch in batches
    ]


def _train(step, mesh) -> tuple[dict, list[bool]]:
    """Train on four batches; the final params, and whether each call consumed
    the params it was given."""
    params, batches = _state(mesh)
    consumed = []
    for batch in batches:
        given = params
        params = jax.block_until_ready(step(params, batch))
        consumed.append(all(leaf.is_deleted() for leaf in jax.tree.leaves(given)))
    return jax.tree.map(np.asarray, params), consumed


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2,), ("d",))


@pytest.fixture(scope="module")
def plain(mesh):
    return _train(jax.jit(_update, donate_argnums=0), mesh)


def _assert_same(expected: dict, got: dict) -> None:
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-6)


def test_a_donating_step_runs_rewritten_and_consumes_what_jax_consumes(mesh, plain, tmp_path):
    optimized = disco_xla.jit(_update, donate_argnums=0, cache_dir=str(tmp_path), **SEARCH)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiscoFallbackWarning)
        params, consumed = _train(optimized, mesh)
    _assert_same(plain[0], params)
    assert consumed == plain[1] == [True] * 4
    (status,) = optimized.status()
    assert status.startswith("optimized") and status.endswith("; donates args[0]"), status
    (report,) = optimized.measurements()
    chosen = next(label for label, entry in report.items() if entry["chosen"])
    assert report[chosen]["peak_bytes"] <= 1.02 * report["original"]["peak_bytes"], report


def test_a_weakly_typed_result_comes_back_weak_and_the_step_is_traced_once(mesh, tmp_path):
    """A step counter kept as a weakly typed scalar (as Flax's TrainState
    keeps `step`): the rewritten program returns it weak, as JAX does, so
    the next call has the same signature."""

    def counted(state, batch):
        params, step = state
        return _update(params, batch), step + 1

    optimized = disco_xla.jit(counted, donate_argnums=0, cache_dir=str(tmp_path), **SEARCH)
    params, batches = _state(mesh)
    state = (params, jax.device_put(jnp.asarray(0), NamedSharding(mesh, P())))
    plain = jax.jit(counted)(state, batches[0])[1]
    assert state[1].weak_type and plain.weak_type
    for batch in batches:
        state = optimized(state, batch)
    assert state[1].weak_type and int(state[1]) == len(batches)
    (status,) = optimized.status()  # one signature
    assert status.startswith("optimized"), status


def test_the_speed_check_times_a_donating_step_on_copies(mesh, plain, tmp_path):
    optimized = disco_xla.jit(
        _update, donate_argnums=0, cache_dir=str(tmp_path), max_evaluations=10, background=False
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiscoFallbackWarning)
        params, consumed = _train(optimized, mesh)
    _assert_same(plain[0], params)
    assert consumed == [True] * 4
    (report,) = optimized.measurements()
    assert "measured_s" in report["original"] and len(report) >= 2, report


def _fails(*_args, **_kwargs):
    raise RuntimeError("injected failure")


# Where a failure is injected (the module that calls it, attribute), and the
# words of the warning.
FAILURES = {
    "capture": ("disco_xla.frontends.jax_api", "lowered_module", "could not capture the step"),
    "search": ("disco_xla.frontends.jax_trial", "find_plan", "injected failure"),
    "rewrite": ("disco_xla.frontends.jax_trial", "rewrite", "injected failure"),
    # After the original has run on (and consumed) the user's arguments:
    "timing": ("disco_xla.driver.trial", "rotating_median_seconds", "injected failure"),
}


@pytest.mark.parametrize("where", list(FAILURES))
def test_a_failure_on_the_first_call_runs_the_original_with_one_warning(
    where, mesh, plain, tmp_path, monkeypatch
):
    module, attribute, words = FAILURES[where]
    monkeypatch.setattr(f"{module}.{attribute}", _fails)
    settings = dict(SEARCH, check_speed=where == "timing")
    optimized = disco_xla.jit(_update, donate_argnums=0, cache_dir=str(tmp_path), **settings)
    with pytest.warns(DiscoFallbackWarning, match=words) as caught:
        params, consumed = _train(optimized, mesh)
    assert len(caught) == 1, [str(w.message) for w in caught]
    _assert_same(plain[0], params)
    assert consumed == [True] * 4
    assert optimized.status()[0].startswith("original: ")


def test_a_later_failure_of_the_rewritten_program_runs_the_original(
    mesh, plain, tmp_path, monkeypatch
):
    from disco_xla.runtime.jax_program import RewrittenStep

    optimized = disco_xla.jit(_update, donate_argnums=0, cache_dir=str(tmp_path), **SEARCH)
    params, batches = _state(mesh)
    params = optimized(params, batches[0])
    assert optimized.status()[0].startswith("optimized")
    monkeypatch.setattr(RewrittenStep, "__call__", _fails)
    with pytest.warns(DiscoFallbackWarning, match="the rewritten program failed") as caught:
        for batch in batches[1:]:
            params = jax.block_until_ready(optimized(params, batch))
    assert len(caught) == 1
    _assert_same(plain[0], jax.tree.map(np.asarray, params))
    assert optimized.status()[0].startswith("original: the rewritten program failed")


def _train_steps(step, mesh, steps: int, after_second=None) -> dict:
    """`steps` steps over the four batches in turn; `after_second()` runs after
    the second."""
    params, batches = _state(mesh)
    for index in range(steps):
        params = jax.block_until_ready(step(params, batches[index % len(batches)]))
        if index == 0 and after_second is not None:
            assert step.status() == [CALLED_ONCE]
        if index == 1 and after_second is not None:
            after_second()
    return jax.tree.map(np.asarray, params)


@pytest.mark.parametrize("check_speed", [False, True])
def test_in_the_background_the_original_runs_until_every_program_is_built_and_judged(
    check_speed, mesh, tmp_path
):
    from disco_xla.driver.trial import TIMING_ROUNDS
    from disco_xla.frontends.jax_background import CONFIRM_CALLS

    optimized = disco_xla.jit(
        _update,
        donate_argnums=0,
        cache_dir=str(tmp_path),
        max_evaluations=10,
        check_speed=check_speed,
        background=True,
        start_after=0,  # on the second call
    )

    def second_call_started_the_work():
        assert optimized.status() == ["original: optimising in the background"]
        assert optimized.wait(timeout_s=600)

    # The trial's call, then (with the speed check) every program in rotation:
    # at most the plan, its buckets, 3 more candidates and a baseline, and the
    # original, over a warm-up round and TIMING_ROUNDS timed ones; then a
    # winner's confirmation in three blocks.
    steps = 3 + (7 * (TIMING_ROUNDS + 1) + 3 * CONFIRM_CALLS[1] if check_speed else 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiscoFallbackWarning)
        got = _train_steps(optimized, mesh, steps, second_call_started_the_work)
    _assert_same(_train_steps(jax.jit(_update, donate_argnums=0), mesh, steps), got)
    (status,) = optimized.status()
    assert status.startswith(("optimized", "original: faster here")), status
    assert status.endswith("; donates args[0]"), status
    (report,) = optimized.measurements()
    if check_speed:
        timed = [label for label, entry in report.items() if "measured_s" in entry]
        assert "original" in timed and len(timed) >= 2, report


def test_in_the_background_the_work_waits_until_the_run_is_long_enough(mesh, plain, tmp_path):
    """A run shorter than `start_after` times the first call's time starts no
    background work; once the loop has run that long, the next call starts it."""
    import threading
    import time

    optimized = disco_xla.jit(
        _update, donate_argnums=0, cache_dir=str(tmp_path), max_evaluations=10, start_after=3
    )
    params, batches = _state(mesh)
    started = time.perf_counter()
    params = jax.block_until_ready(optimized(params, batches[0]))
    first_call_s = time.perf_counter() - started
    params = jax.block_until_ready(optimized(params, batches[1]))
    (status,) = optimized.status()
    assert status.startswith("original: not optimised yet") and "3x" in status, status
    assert not any(t.name == "disco-xla" for t in threading.enumerate())
    time.sleep(3 * first_call_s)
    params = jax.block_until_ready(optimized(params, batches[2]))
    assert optimized.status() == ["original: optimising in the background"]
    assert optimized.wait(timeout_s=600)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiscoFallbackWarning)
        params = jax.block_until_ready(optimized(params, batches[3]))
    _assert_same(plain[0], jax.tree.map(np.asarray, params))


def test_in_the_background_a_rotation_winner_slower_call_after_call_is_not_run(
    mesh, plain, tmp_path, monkeypatch
):
    """The rotation's winner (here forced) is timed again in blocks of
    consecutive calls against the original; slower there (here slowed by 20 ms
    a call), it is refused without a warning and the original runs."""
    import time

    import disco_xla.driver.trial as trial_module
    from disco_xla.driver.trial import TIMING_ROUNDS
    from disco_xla.frontends.jax_background import CONFIRM_CALLS, BackgroundTrial

    real_rule, confirmed = trial_module.fastest_label, []

    def rotation_winner(measured_s, labels):  # the rotation's pick, then the real rule
        return labels[0] if not confirmed else real_rule(measured_s, labels)

    def slowed_confirmation(self, chosen):
        program = self._trial.programs[chosen]

        def slow(leaves):
            time.sleep(0.02)
            return program(leaves)

        self._trial.programs[chosen] = slow
        confirmed.append(chosen)
        real_confirm(self, chosen)

    real_confirm = BackgroundTrial._confirm
    monkeypatch.setattr(trial_module, "fastest_label", rotation_winner)
    monkeypatch.setattr(BackgroundTrial, "_confirm", slowed_confirmation)
    optimized = disco_xla.jit(
        _update,
        donate_argnums=0,
        cache_dir=str(tmp_path),
        max_evaluations=10,
        start_after=0,
    )
    steps = 3 + 7 * (TIMING_ROUNDS + 1) + 3 * CONFIRM_CALLS[1]
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiscoFallbackWarning)
        got = _train_steps(optimized, mesh, steps, lambda: optimized.wait(timeout_s=600))
    _assert_same(_train_steps(jax.jit(_update, donate_argnums=0), mesh, steps), got)
    assert len(confirmed) == 1, confirmed
    (status,) = optimized.status()
    assert status.startswith("original: faster here"), status
    (report,) = optimized.measurements()
    timed = {label for label, entry in report.items() if "measured_s" in entry}
    assert timed == {"original", confirmed[0]}, report


def test_a_failure_in_the_background_runs_the_original_with_one_warning(
    mesh, plain, tmp_path, monkeypatch
):
    monkeypatch.setattr("disco_xla.frontends.jax_trial.find_plan", _fails)
    optimized = disco_xla.jit(
        _update,
        donate_argnums=0,
        cache_dir=str(tmp_path),
        max_evaluations=10,
        background=True,
        start_after=0,
    )

    def second_call_started_the_work():
        assert optimized.wait(timeout_s=600)

    with pytest.warns(DiscoFallbackWarning, match="injected failure") as caught:
        got = _train_steps(optimized, mesh, 4, second_call_started_the_work)
    assert len(caught) == 1, [str(w.message) for w in caught]
    _assert_same(plain[0], got)
    (status,) = optimized.status()
    assert status.startswith("original: ") and "injected failure" in status, status


@pytest.mark.parametrize("recorded", ["plan", "original"])
def test_in_the_background_a_choice_the_plan_cache_recorded_is_not_timed_again(
    recorded, mesh, plain, tmp_path
):
    """A measured choice in the plan cache (here written into it) is found
    from the traced step on the first call, and the second call starts the
    work, however short the run so far; it is checked and run without timing
    anything again. A recorded 'original' is final on the first call: nothing
    is captured, built or timed."""
    import dataclasses
    import sqlite3
    import threading

    from disco_xla.driver.plan_cache import PlanCache

    _train(disco_xla.jit(_update, donate_argnums=0, cache_dir=str(tmp_path), **SEARCH), mesh)
    with sqlite3.connect(tmp_path / "plans.sqlite") as connection:
        (key,) = [row[0] for row in connection.execute("SELECT key FROM candidates")]
    cache = PlanCache(str(tmp_path))
    faster, slower = ("plan", "original") if recorded == "plan" else ("original", "plan")
    measured_s = {faster: 1e-3, slower: 2e-3}
    cache.put_candidates(
        key,
        dataclasses.replace(cache.get_candidates(key), chosen=recorded, measured_s=measured_s),
    )
    optimized = disco_xla.jit(
        _update,
        donate_argnums=0,
        cache_dir=str(tmp_path),
        **{**SEARCH, "check_speed": True, "background": True},
    )

    params, batches = _state(mesh)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiscoFallbackWarning)
        for index, batch in enumerate(batches):
            params = jax.block_until_ready(optimized(params, batch))
            if index == 0 and recorded == "original":
                assert optimized.status()[0].startswith("original: faster here")
                assert not any(t.name == "disco-xla" for t in threading.enumerate())
            if index == 1 and recorded == "plan":  # the second call started the work
                assert optimized.status() == ["original: optimising in the background"]
                assert optimized.wait(timeout_s=600)
    _assert_same(plain[0], jax.tree.map(np.asarray, params))
    (status,) = optimized.status()
    (report,) = optimized.measurements()
    assert not any("measured_s" in entry for entry in report.values()), report
    if recorded == "original":
        assert status == (
            "original: faster here (1.000 ms per step against 2.000 ms for optimized (plan), "
            "from the plan cache); donates args[0]"
        )
        assert list(report) == ["original"] and report["original"]["from_cache"], report
    else:
        assert status.startswith("optimized") and status.endswith("; donates args[0]"), status
        assert report["plan"]["from_cache"] and report["plan"]["chosen"], report
