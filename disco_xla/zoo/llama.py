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
128256, sequences of 8192 tokens as MaxText's `llama3_8b.yml` trains it), and
`LLAMA2_7B` Llama 2 7B's (32 layers, hidden 4096, 32 heads, MLP 11008,
vocabulary 32000, sequences of 4096 tokens), and `LLAMA2_70B` Llama 2 70B's
(80 layers, hidden 8192, 64 query and 8 key/value heads, MLP 28672); they
are lowered from shapes only, never run here. `LLAMA_TINY` is for tests.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.ad_checkpoint import checkpoint_name
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
# Llama 2 7B (Touvron et al. 2023, table 1 and the released config): 32 layers,
# hidden 4096, 32 heads without grouping, MLP 11008, vocabulary 32000,
# sequences of 4096 tokens as MaxText's A3 scripts train it.
LLAMA2_7B = LlamaConfig(32000, 4096, 32, 32, 32, 11008, 4096)
# Llama 2 70B: 80 layers, hidden 8192, 64 query and 8 key/value heads, MLP
# 28672, vocabulary 32000, sequences of 4096 tokens.
LLAMA2_70B = LlamaConfig(32000, 8192, 80, 64, 8, 28672, 4096)
LLAMA_TINY = LlamaConfig(128, 32, 2, 4, 2, 64, 16)
# The full size of each zoo name (`--size full`); `--size tiny` is LLAMA_TINY.
FULL_SIZES = {
    "llama": LLAMA_1B,
    "llama3_8b": LLAMA3_8B,
    "llama2_7b": LLAMA2_7B,
    "llama2_70b": LLAMA2_70B,
}


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


@dataclass(frozen=True)
class TrainingChoices:
    """How a published run trains, where it changes what the step computes.

    - `attention`: 'plain' (scores in memory, softmax, a second product) or
      'cudnn': one fused causal attention call forward and one backward, as
      cuDNN's flash attention runs (MaxText's `attention=cudnn_flash_te`). It
      lowers to XLA:GPU's custom-call targets (`__cudnn$fmhaSoftmax`, and
      `...Backward`), so such a step is for pricing only: it has no CPU kernel
      and is never compiled or run here.
    - `remat`: 'full' recomputes each block in the backward pass; 'minimal'
      keeps the products without batch dimensions (the projections) and the
      attention's output, as MaxText's `remat_policy=minimal_flash` does.
    - `shard_activations`: below.
    """

    attention: str = "plain"
    remat: str = "full"
    # Keep activations split by batch over the whole mesh, as MaxText's logical
    # axis rules do (`with_sharding_constraint` on each block's values): the
    # partitioner then gathers weights and splits no activation otherwise.
    shard_activations: bool = False


PLAIN = TrainingChoices()


def _cudnn_attention_call(q, k, v):
    """The fused attention's result: XLA:GPU's cuDNN flash-attention target."""
    result = jax.ShapeDtypeStruct(q.shape, q.dtype)
    statistics = jax.ShapeDtypeStruct((q.shape[0], q.shape[2], q.shape[1]), jnp.float32)
    call = jax.ffi.ffi_call("__cudnn$fmhaSoftmax", (result, statistics))
    return call(q, k, v, mask_type="causal")


@jax.custom_vjp
def _cudnn_attention(q, k, v):
    return _cudnn_attention_call(q, k, v)[0]


def _cudnn_attention_forward(q, k, v):
    out, statistics = _cudnn_attention_call(q, k, v)
    # Named so that the 'minimal' remat policy keeps them: the backward call
    # reads them, and recomputing them would run the attention twice.
    out, statistics = checkpoint_name(out, "context"), checkpoint_name(statistics, "context")
    return out, (q, k, v, out, statistics)


def _cudnn_attention_backward(residuals, d_out):
    q, k, v, out, statistics = residuals
    shapes = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v))
    call = jax.ffi.ffi_call("__cudnn$fmhaSoftmaxBackward", shapes)
    return tuple(call(q, k, v, out, d_out, statistics, mask_type="causal"))


_cudnn_attention.defvjp(_cudnn_attention_forward, _cudnn_attention_backward)


def _sharded_attention(mesh: Mesh):
    """The fused attention call on each device's part of the batch: the SPMD
    partitioner cannot split a custom call, and would gather whole tensors."""
    batch = P((DATA_AXIS, FSDP_AXIS))
    return jax.shard_map(
        _cudnn_attention,
        mesh=mesh,
        in_specs=(batch, batch, batch),
        out_specs=batch,
        check_vma=False,  # the library call carries no varying-axes types
    )


def _by_batch(mesh: Mesh | None, choices: TrainingChoices):
    """`f(x)`: x constrained to be split by batch over the mesh, where the
    choices ask for it; else x itself."""
    if mesh is None or not choices.shard_activations:
        return lambda x: x
    sharding = NamedSharding(mesh, P((DATA_AXIS, FSDP_AXIS)))
    return lambda x: jax.lax.with_sharding_constraint(x, sharding)


def _block(x, config: LlamaConfig, choices: TrainingChoices = PLAIN, mesh: Mesh | None = None):
    batch, sequence, _ = x.shape
    size = config.hidden // config.heads
    split = _by_batch(mesh, choices)
    x = split(x)
    h = hk.RMSNorm(-1, name="attention_norm")(x)
    q = split(hk.Linear(config.heads * size, with_bias=False, name="query")(h))
    k = split(hk.Linear(config.kv_heads * size, with_bias=False, name="key")(h))
    v = split(hk.Linear(config.kv_heads * size, with_bias=False, name="value")(h))
    positions = jnp.arange(sequence)
    q = _rotary(q.reshape(batch, sequence, config.heads, size), positions)
    k = _rotary(k.reshape(batch, sequence, config.kv_heads, size), positions)
    v = v.reshape(batch, sequence, config.kv_heads, size)
    if choices.attention != "cudnn":  # cuDNN's call takes the key/value heads as they are
        # Grouped-query attention: each key/value head serves heads // kv_heads queries.
        k = jnp.repeat(k, config.heads // config.kv_heads, axis=2)
        v = jnp.repeat(v, config.heads // config.kv_heads, axis=2)
    if choices.attention == "cudnn":
        attended = _sharded_attention(mesh)(q, k, v).reshape(batch, sequence, -1)
    else:
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / np.sqrt(size)
        causal = jnp.tril(jnp.ones((sequence, sequence), bool))
        weights = jax.nn.softmax(jnp.where(causal, logits, -1e9), axis=-1).astype(x.dtype)
        attended = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(batch, sequence, -1)
    attended = checkpoint_name(attended, "context")
    x = split(x + hk.Linear(config.hidden, with_bias=False, name="attention_output")(attended))
    h = hk.RMSNorm(-1, name="mlp_norm")(x)
    gate = split(hk.Linear(config.feedforward, with_bias=False, name="gate")(h))
    up = split(hk.Linear(config.feedforward, with_bias=False, name="up")(h))
    return split(x + hk.Linear(config.hidden, with_bias=False, name="down")(jax.nn.silu(gate) * up))


_REMAT_POLICIES = {
    "full": None,
    "minimal": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
        jax.checkpoint_policies.save_only_these_names("context"),
    ),
}


def llama(config: LlamaConfig, choices: TrainingChoices = PLAIN, mesh: Mesh | None = None):
    """`forward((tokens, targets)) -> mean next-token cross-entropy`, for
    hk.transform; `mesh` is the step's, for cuDNN attention (`TrainingChoices`)."""
    policy = _REMAT_POLICIES[choices.remat]

    def forward(batch):
        tokens, targets = batch
        x = hk.Embed(config.vocab, config.hidden, name="embed")(tokens)
        block = hk.remat(lambda x: _block(x, config, choices, mesh), policy=policy)
        blocks = hk.layer_stack(config.layers)(block)
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
    choices: TrainingChoices = PLAIN,
):
    """(jitted step, args, parameter tensors, parameter count) over `devices`
    devices as a (devices // fsdp) x fsdp mesh: zoo model `model` ('llama' or
    'llama3_8b') at `size` ('tiny' or 'full'), with `sequence` tokens a sequence
    (default the size's own), trained as `choices` says (`TrainingChoices`).
    `concrete=False` gives `jax.ShapeDtypeStruct` arguments: enough to lower
    the full size."""
    if choices.attention == "cudnn" and concrete:
        raise ValueError("cuDNN attention is lowered for pricing only: use concrete=False")
    if devices % fsdp or global_batch % devices:
        raise ValueError(f"{devices} devices, FSDP {fsdp}, batch {global_batch} do not split")
    config = FULL_SIZES[model] if size == "full" else LLAMA_TINY
    if sequence is not None:
        config = replace(config, sequence=sequence)
    grid = np.array(jax.devices()[:devices]).reshape(devices // fsdp, fsdp)
    mesh = Mesh(grid, (DATA_AXIS, FSDP_AXIS))
    transformed = hk.without_apply_rng(hk.transform(llama(config, choices, mesh)))
    example = llama_batch(config, global_batch, np.random.default_rng(seed))
    optimizer = optax.adam(3e-4)
    init = _mixed_precision_init(transformed, optimizer, example, seed)
    step = _mixed_precision_step(transformed, optimizer)
    shapes = jax.eval_shape(init)
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
