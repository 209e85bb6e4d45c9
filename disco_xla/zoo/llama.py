"""A decoder-only language model in the style of Llama (Touvron et al. 2023), in
dm-haiku, and its training step as large-model JAX training writes it.

The model: token embeddings; decoder blocks with RMSNorm before attention and
before the MLP, rotary position embeddings on queries and keys, grouped-query
attention (fewer key/value heads than query heads), and a SwiGLU MLP; a final
RMSNorm and an untied output projection. No biases.

The step:
- the blocks run as one `jax.lax.scan` over stacked layer parameters
  (`hk.layer_stack`), each block under `jax.checkpoint` (`hk.remat`), so the
  module has `while` loops, forward and backward;
- parameters are bf16, and the optimizer keeps an f32 master copy and f32 Adam
  moments: gradients are cast to f32, Adam updates the master, and the new bf16
  parameters are cast from it;
- `jax.jit` over a mesh with a data axis and an FSDP axis: the batch is split
  over both, and every parameter, master copy and moment is split along its
  largest dimension over the FSDP axis. XLA's SPMD partitioner writes the
  collectives: all-gathers of parameters, gradient reduce-scatters and
  all-reduces.

`LLAMA_1B` follows TinyLlama 1.1B's shapes (22 layers, hidden 2048, 32 query
and 4 key/value heads, MLP 5632, vocabulary 32000), and `LLAMA3_8B` Llama-3 8B's
(32 layers, hidden 4096, 32 query and 8 key/value heads, MLP 14336, vocabulary
128256, sequences of 8192 tokens as MaxText's `llama3_8b.yml` trains it); they
are lowered from shapes only, never run here. `LLAMA_TINY` is for tests.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

DATA_AXIS, FSDP_AXIS = "data", "fsdp"


@dataclass(frozen=True)
class LlamaConfig:
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    feedforward: int
    sequence: int  # of the synthetic training batch


LLAMA_1B = LlamaConfig(32000, 2048, 22, 32, 4, 5632, 512)
LLAMA3_8B = LlamaConfig(128256, 4096, 32, 32, 8, 14336, 8192)
LLAMA_TINY = LlamaConfig(128, 32, 2, 4, 2, 64, 16)
# The full size of each zoo name (`--size full`); `--size tiny` is LLAMA_TINY.
FULL_SIZES = {"llama": LLAMA_1B, "llama3_8b": LLAMA3_8B}


def _rotary(x, positions):
    """Rotate each (first half, second half) pair of features by a
    position-dependent angle (x: [batch, sequence, heads, head size])."""
    half = x.shape[-1] // 2
    frequencies = 1.0 / (10000.0 ** (jnp.arange(half, dtype=jnp.float32) / half))
    angles = positions[:, None].astype(jnp.float32) * frequencies[None, :]
    cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
    first, second = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    rotated = jnp.concatenate([first * cos - second * sin, first * sin + second * cos], -1)
    return rotated.astype(x.dtype)


def _block(x, config: LlamaConfig):
    batch, sequence, _ = x.shape
    size = config.hidden // config.heads
    h = hk.RMSNorm(-1, name="attention_norm")(x)
    q = hk.Linear(config.heads * size, with_bias=False, name="query")(h)
    k = hk.Linear(config.kv_heads * size, with_bias=False, name="key")(h)
    v = hk.Linear(config.kv_heads * size, with_bias=False, name="value")(h)
    positions = jnp.arange(sequence)
    q = _rotary(q.reshape(batch, sequence, config.heads, size), positions)
    k = _rotary(k.reshape(batch, sequence, config.kv_heads, size), positions)
    v = v.reshape(batch, sequence, config.kv_heads, size)
    # Grouped-query attention: each key/value head serves heads // kv_heads queries.
    k = jnp.repeat(k, config.heads // config.kv_heads, axis=2)
    v = jnp.repeat(v, config.heads // config.kv_heads, axis=2)
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / np.sqrt(size)
    causal = jnp.tril(jnp.ones((sequence, sequence), bool))
    weights = jax.nn.softmax(jnp.where(causal, logits, -1e9), axis=-1).astype(x.dtype)
    attended = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(batch, sequence, -1)
    x = x + hk.Linear(config.hidden, with_bias=False, name="attention_output")(attended)
    h = hk.RMSNorm(-1, name="mlp_norm")(x)
    gate = hk.Linear(config.feedforward, with_bias=False, name="gate")(h)
    up = hk.Linear(config.feedforward, with_bias=False, name="up")(h)
    return x + hk.Linear(config.hidden, with_bias=False, name="down")(jax.nn.silu(gate) * up)


def llama(config: LlamaConfig):
    """`forward((tokens, targets)) -> mean next-token cross-entropy`, for hk.transform."""

    def forward(batch):
        tokens, targets = batch
        x = hk.Embed(config.vocab, config.hidden, name="embed")(tokens)
        blocks = hk.layer_stack(config.layers)(hk.remat(lambda x: _block(x, config)))
        x = hk.RMSNorm(-1, name="final_norm")(blocks(x))
        logits = hk.Linear(config.vocab, with_bias=False, name="output")(x)
        log_probabilities = jax.nn.log_softmax(logits.astype(jnp.float32))
        return -jnp.mean(jnp.take_along_axis(log_probabilities, targets[..., None], -1))

    return forward


def llama_batch(config: LlamaConfig, batch: int, rng: np.random.Generator):
    tokens = rng.integers(0, config.vocab, (batch, config.sequence + 1), dtype=np.int32)
    return tokens[:, :-1], tokens[:, 1:]


def _fsdp_spec(shape: tuple[int, ...], fsdp: int, stacked: bool) -> P:
    """Split the largest dimension divisible by the FSDP axis (not the layer
    axis of stacked block parameters); replicate what does not split."""
    start = 1 if stacked else 0
    choices = [d for d in range(start, len(shape)) if shape[d] % fsdp == 0 and shape[d] >= fsdp]
    if fsdp < 2 or not choices:
        return P()
    axis = max(choices, key=lambda d: (shape[d], -d))
    return P(*([None] * axis + [FSDP_AXIS]))


def _mixed_precision_init(transformed, optimizer, example, seed: int):
    """`init() -> (bf16 parameters, (f32 master copy, Adam state))`."""

    def init():
        master = transformed.init(jax.random.PRNGKey(seed), example)
        return jax.tree_util.tree_map(lambda m: m.astype(jnp.bfloat16), master), (
            master,
            optimizer.init(master),
        )

    return init


def _mixed_precision_step(transformed, optimizer):
    """`step(params, (master, adam), batch) -> (params, (master, adam), loss)`:
    bf16 gradients cast to f32, Adam updates the f32 master copy, and the new
    bf16 parameters are cast from it."""

    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(lambda p: transformed.apply(p, batch))(params)
        master, adam = opt_state
        grads = jax.tree_util.tree_map(lambda g: g.astype(jnp.float32), grads)
        updates, adam = optimizer.update(grads, adam, master)
        master = optax.apply_updates(master, updates)
        params = jax.tree_util.tree_map(lambda m: m.astype(jnp.bfloat16), master)
        return params, (master, adam), loss

    return step


def _state_shardings(shapes, mesh: Mesh, fsdp: int):
    """A NamedSharding for each leaf of the step's state (`shapes`): scalars
    replicated, the rest split over the FSDP axis (`_fsdp_spec`)."""

    def sharding_of(path, leaf):
        stacked = any("layer_stack" in str(getattr(k, "key", "")) for k in path)
        if not leaf.shape:
            return NamedSharding(mesh, P())
        return NamedSharding(mesh, _fsdp_spec(leaf.shape, fsdp, stacked))

    return jax.tree_util.tree_map_with_path(sharding_of, shapes)


def _step_state_and_batch(init, example, shapes, state_shardings, batch_sharding, concrete: bool):
    """The step's state and batch, placed on the mesh; with `concrete=False`,
    `jax.ShapeDtypeStruct`s of them carrying their shardings."""
    if concrete:
        state = jax.jit(init, out_shardings=state_shardings)()
        batch = jax.device_put(example, batch_sharding)
        return state, batch
    state = jax.tree_util.tree_map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
        shapes,
        state_shardings,
    )
    batch = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=batch_sharding) for x in example)
    return state, batch


def build_llama_step(
    size: str = "tiny",
    devices: int = 4,
    global_batch: int = 8,
    fsdp: int = 2,
    concrete: bool = True,
    seed: int = 0,
    model: str = "llama",
    sequence: int | None = None,
):
    """(jitted step, args, parameter tensors, parameter count) over `devices`
    devices as a (devices // fsdp) x fsdp mesh: zoo model `model` ('llama' or
    'llama3_8b') at `size` ('tiny' or 'full'), with `sequence` tokens a sequence
    (default the size's own). `concrete=False` gives `jax.ShapeDtypeStruct`
    arguments: enough to lower the full size."""
    if devices % fsdp or global_batch % devices:
        raise ValueError(f"{devices} devices, FSDP {fsdp}, batch {global_batch} do not split")
    config = FULL_SIZES[model] if size == "full" else LLAMA_TINY
    if sequence is not None:
        config = replace(config, sequence=sequence)
    transformed = hk.without_apply_rng(hk.transform(llama(config)))
    example = llama_batch(config, global_batch, np.random.default_rng(seed))
    optimizer = optax.adam(3e-4)
    init = _mixed_precision_init(transformed, optimizer, example, seed)
    step = _mixed_precision_step(transformed, optimizer)
    shapes = jax.eval_shape(init)
    grid = np.array(jax.devices()[:devices]).reshape(devices // fsdp, fsdp)
    mesh = Mesh(grid, (DATA_AXIS, FSDP_AXIS))
    state_shardings = _state_shardings(shapes, mesh, fsdp)
    batch_sharding = NamedSharding(mesh, P((DATA_AXIS, FSDP_AXIS)))
    fn = jax.jit(
        step,
        in_shardings=(*state_shardings, batch_sharding),
        out_shardings=(*state_shardings, NamedSharding(mesh, P())),
    )
    state, batch = _step_state_and_batch(
        init, example, shapes, state_shardings, batch_sharding, concrete
    )
    leaves = jax.tree_util.tree_leaves(shapes[0])
    return (
        fn,
        (*state, batch),
        len(leaves),
        sum(int(np.prod(x.shape)) for x in leaves),
    )
