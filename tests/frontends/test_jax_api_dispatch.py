"""Once a signature's program is settled, `disco_xla.jit` costs a call nothing
of its own: a rewritten program runs behind JAX's own dispatch, and a step that
runs the original calls it directly. A new signature is still seen, recorded
and optimised, and every result is JAX's."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import disco_xla
from disco_xla.frontends.jax_api import DiscoFallbackWarning, OptimizedFunction
from tests.frontends.test_jax_api_donation import _assert_same, _state, _update


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2,), ("d",))


@pytest.fixture
def signatures_taken(monkeypatch) -> list[int]:
    """Counts the calls that computed a signature of ours (the records' way)."""
    taken = [0]
    real = OptimizedFunction._signature

    def counted(self, args, kwargs):
        taken[0] += 1
        return real(self, args, kwargs)

    monkeypatch.setattr(OptimizedFunction, "_signature", counted)
    return taken


def _small_batch(mesh):
    rng = np.random.default_rng(1)
    batch = (rng.standard_normal((2, 8), np.float32), rng.standard_normal((2, 2), np.float32))
    return jax.device_put(batch, NamedSharding(mesh, P("d")))


def test_a_rewritten_program_runs_behind_jax_dispatch_and_a_new_signature_is_still_seen(
    mesh, tmp_path, signatures_taken
):
    optimized = disco_xla.jit(
        _update,
        donate_argnums=0,
        cache_dir=str(tmp_path),
        max_evaluations=10,
        check_speed=False,
        start_after=0,
    )
    plain = jax.jit(_update, donate_argnums=0)
    ours, theirs = _state(mesh)[0], _state(mesh)[0]
    _, batches = _state(mesh)
    calls = [batches[i % 4] for i in range(3)]

    def both(batch):
        nonlocal ours, theirs
        ours = jax.block_until_ready(optimized(ours, batch))
        theirs = jax.block_until_ready(plain(theirs, batch))

    with warnings.catch_warnings():
        warnings.simplefilter("error", DiscoFallbackWarning)
        for batch in calls:
            both(batch)
        assert optimized.wait(timeout_s=600)
        both(batches[3])  # the switch: the records' way, once more
        (status,) = optimized.status()
        assert status.startswith("optimized"), status
        before = signatures_taken[0]
        for index in range(12):
            both(batches[index % 4])
        assert signatures_taken[0] == before  # JAX's dispatch ran every call
        # Another signature: refused there, so the records see it first.
        both(_small_batch(mesh))
        assert signatures_taken[0] > before
        assert len(optimized.status()) == 2
        for index in range(4):
            both(batches[index % 4])
    _assert_same(jax.tree.map(np.asarray, theirs), jax.tree.map(np.asarray, ours))
    assert optimized.status()[0] == status


def test_a_step_that_runs_the_original_is_called_directly_and_sees_new_shapes(
    tmp_path, signatures_taken
):
    def scale(x, factor):
        return jnp.sin(x) * factor

    optimized = disco_xla.jit(scale, cache_dir=str(tmp_path), static_argnums=1, start_after=0)
    plain = jax.jit(scale, static_argnums=1)
    x = jnp.arange(6.0)
    for _ in range(2):  # the second call starts the work
        np.testing.assert_array_equal(optimized(x, 2.0), plain(x, 2.0))
    assert optimized.wait(timeout_s=600)
    np.testing.assert_array_equal(optimized(x, 2.0), plain(x, 2.0))
    assert optimized.status() == ["not data-parallel"]
    before = signatures_taken[0]
    for _ in range(10):
        np.testing.assert_array_equal(optimized(x, 2.0), plain(x, 2.0))
    assert signatures_taken[0] == before  # the original, called directly
    # A new shape, and new static arguments: JAX compiles anew, and they are recorded.
    np.testing.assert_array_equal(optimized(jnp.arange(4.0), 2.0), plain(jnp.arange(4.0), 2.0))
    np.testing.assert_array_equal(optimized(x, 3.0), plain(x, 3.0))
    assert len(optimized.status()) == 3
    assert signatures_taken[0] > before
