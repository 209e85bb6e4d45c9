"""Data-parallel JAX training steps for the zoo models.

A step is: forward, loss and `jax.grad`; one `lax.pmean` per parameter tensor
(except in the sharded form); an optax update (SGD with momentum for the CNNs,
Adam for the transformers).
It is built with `jax.pmap`, with `jax.jit` over `jax.shard_map`, or, as most
JAX users write data parallelism today, with `jax.jit` over arguments sharded
on a mesh (`mode='sharded'`): parameters replicated, the batch split along its
first axis, and no pmean in the step; XLA's SPMD partitioner inserts the
gradient all-reduces while it compiles.

`precision='bf16'` is the mixed-precision variant: the step keeps f32 master
parameters and optimizer state, computes forward and backward with bf16 copies
of the parameters and of the float inputs, averages the bf16 gradients across
devices (bf16 all-reduces, half the bytes) and casts them to f32 for the update.
It is offered for the transformers: the CNNs' batch norm computed in bf16
gives NaN (its variance, a difference of bf16 means, can come out negative),
and keeping batch norm in f32 would need a per-module precision policy.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from disco_xla.zoo import cnn
from disco_xla.zoo import transformers as tr

AXIS = "data"


@dataclass(frozen=True)
class JaxStep:
    """A training step and arguments to call (or lower) it with."""

    fn: Any  # the pmap'd or jitted step
    args: tuple  # (params, state, opt_state, batch), stacked per device for pmap
    parameter_tensors: int
    parameter_count: int
    mode: str  # 'pmap', 'shard_map', or 'sharded' (jax.jit with sharded arguments)
    replicas: int
    precision: str = "f32"  # or 'bf16' (mixed precision, see the module docstring)


_IMAGE_SIDE = {"resnet50": (224, 32), "vgg19": (224, 32), "inception_v3": (299, 75)}
_CNNS = {"resnet50": cnn.resnet50, "vgg19": cnn.vgg19, "inception_v3": cnn.inception_v3}
_TRANSFORMERS = {
    "bert_base": (tr.bert, tr.bert_batch, tr.BERT_BASE, tr.BERT_BASE_TINY),
    "bert_large": (tr.bert, tr.bert_batch, tr.BERT_LARGE, tr.BERT_LARGE_TINY),
    "transformer_base": (
        tr.transformer,
        tr.transformer_batch,
        tr.TRANSFORMER_BASE,
        tr.TRANSFORMER_TINY,
    ),
    "gpt2_small": (tr.gpt2, tr.gpt2_batch, tr.GPT2_SMALL, tr.GPT2_TINY),
}
JAX_MODELS = tuple(_CNNS) + tuple(_TRANSFORMERS)
PRECISIONS = ("f32", "bf16")
BF16_MODELS = tuple(_TRANSFORMERS)  # the models with a bf16 variant


def _in_bf16(tree):
    """Float arrays of `tree` as bf16; integers (labels, token ids) unchanged."""
    return jax.tree_util.tree_map(
        lambda x: x.astype(jnp.bfloat16) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree
    )


def _model(name: str, size: str, batch: int, rng: np.random.Generator):
    """(haiku transformed loss, example batch, optimizer)."""
    if name in _CNNS:
        side = _IMAGE_SIDE[name][0 if size == "full" else 1]
        classes = 1000 if size == "full" else 10
        forward = _CNNS[name](size, classes)

        def loss(batch):
            images, labels = batch
            logits = forward(images, True)
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], -1))

        example = (
            rng.standard_normal((batch, side, side, 3)).astype(np.float32),
            rng.integers(0, classes, (batch,), dtype=np.int32),
        )
        return hk.transform_with_state(loss), example, optax.sgd(0.1, momentum=0.9)
    build, make_batch, full, tiny = _TRANSFORMERS[name]
    config = full if size == "full" else tiny
    return (
        hk.transform_with_state(build(config)),
        make_batch(config, batch, rng),
        optax.adam(1e-4),
    )


def build_jax_step(
    name: str,
    size: str = "tiny",
    replicas: int = 2,
    global_batch: int = 4,
    mode: str = "pmap",
    concrete: bool = True,
    seed: int = 0,
    precision: str = "f32",
    donate: bool = False,
) -> JaxStep:
    """The data-parallel training step of zoo model `name` over `replicas` devices,
    in f32 or mixed bf16 `precision`.

    With `concrete=False` the arguments are `jax.ShapeDtypeStruct`s: enough to
    lower and capture the step without allocating full-size weights. With
    `donate` (mode 'sharded' only), the step donates its parameters, state and
    optimizer state, as training loops do.
    """
    if donate and mode != "sharded":
        raise ValueError("donate is for mode='sharded'")
    _check_step(name, replicas, global_batch, precision)
    transformed, example, optimizer = _model(name, size, global_batch, np.random.default_rng(seed))
    per_device = global_batch // replicas
    if concrete and size == "full":
        variables = jax.jit(_initializer(name, size, global_batch, per_device, seed))()
    elif concrete:  # fresh device arrays: a step may donate its arguments
        host = _initial_variables(name, size, global_batch, per_device, seed)
        variables = jax.tree_util.tree_map(jnp.asarray, host)
    else:
        variables = jax.eval_shape(_initializer(name, size, global_batch, per_device, seed))
    leaves = jax.tree_util.tree_leaves(variables[0])
    train = _train_function(transformed, optimizer, precision)
    if mode == "pmap":
        fn, args = _pmap_form(train, variables, example, replicas, per_device, concrete)
    elif mode == "shard_map":
        fn, args = _shard_map_form(train, variables, example, replicas, concrete)
    elif mode == "sharded":
        fn, args = _sharded_form(train, variables, example, replicas, concrete, donate)
    else:
        raise ValueError(f"unknown mode {mode!r}: use 'pmap', 'shard_map' or 'sharded'")
    return JaxStep(
        fn=fn,
        args=args,
        parameter_tensors=len(leaves),
        parameter_count=sum(int(np.prod(x.shape)) for x in leaves),
        mode=mode,
        replicas=replicas,
        precision=precision,
    )


def _initializer(name: str, size: str, global_batch: int, per_device: int, seed: int):
    """init() -> (params, state, optimizer state) of one device's model."""
    transformed, example, optimizer = _model(name, size, global_batch, np.random.default_rng(seed))
    device_batch = jax.tree_util.tree_map(lambda x: x[:per_device], example)

    def init():
        params, state = transformed.init(jax.random.PRNGKey(seed), device_batch)
        return params, state, optimizer.init(params)

    return init


@functools.lru_cache(maxsize=16)
def _initial_variables(name: str, size: str, global_batch: int, per_device: int, seed: int):
    """The tiny models' initial variables on the host, computed once a process
    for each model and batch (the values depend on nothing else). The
    initializer (a random draw per tensor) is compiled without the backend's
    optimisation: XLA:CPU then compiles Inception's in 14 s instead of 53 s,
    and it runs once. Its values differ from an optimised compile's at f32
    rounding."""
    init = _initializer(name, size, global_batch, per_device, seed)
    compiled = jax.jit(init).lower().compile(compiler_options=_QUICK_COMPILE)
    return jax.device_get(compiled())


# Compiler options for a program that runs once (`_initial_variables`).
_QUICK_COMPILE = {"xla_backend_optimization_level": 0}


def _check_step(name: str, replicas: int, global_batch: int, precision: str) -> None:
    """KeyError for a model not in the zoo, ValueError for a step it cannot build."""
    if name not in JAX_MODELS:
        raise KeyError(name)
    if global_batch % replicas:
        raise ValueError(f"the batch {global_batch} does not split over {replicas} replicas")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}: use 'f32' or 'bf16'")
    if precision == "bf16" and name not in BF16_MODELS:
        raise ValueError(f"{name} has batch norm, which needs f32: bf16 is for the transformers")


def _train_function(transformed, optimizer, precision: str):
    """train(params, state, opt_state, batch, mean_over_devices) -> (params,
    state, opt_state, loss): forward, loss, `jax.grad`, `mean_over_devices` on
    each gradient and the loss, and the optimizer's update."""

    def train(params, state, opt_state, batch, mean_over_devices):
        compute_params, compute_batch = params, batch
        if precision == "bf16":
            compute_params, compute_batch = _in_bf16(params), _in_bf16(batch)

        def loss_fn(p):
            loss, new_state = transformed.apply(p, state, None, compute_batch)
            # The state (batch-norm averages) and loss keep their f32 types.
            kept = jax.tree_util.tree_map(lambda new, old: new.astype(old.dtype), new_state, state)
            return loss.astype(jnp.float32), kept

        (loss, new_state), grads = jax.value_and_grad(loss_fn, has_aux=True)(compute_params)
        grads = jax.tree_util.tree_map(mean_over_devices, grads)
        grads = jax.tree_util.tree_map(lambda g, p: g.astype(p.dtype), grads, params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), new_state, opt_state, mean_over_devices(loss)

    return train


def _per_device_step(train):
    """One device's part: one pmean per gradient, written by the user."""

    def step(params, state, opt_state, batch):
        return train(params, state, opt_state, batch, lambda x: jax.lax.pmean(x, AXIS))

    return step


def _abstract(tree):
    """`tree`'s arrays as `jax.ShapeDtypeStruct`s."""
    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def _pmap_form(train, variables: tuple, example, replicas: int, per_device: int, concrete: bool):
    """(`jax.pmap` of the per-device step, its arguments stacked per device)."""

    def per_device_copies(x):
        if isinstance(x, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct((replicas, *x.shape), x.dtype)
        return jnp.broadcast_to(x, (replicas, *x.shape))

    def split(x):
        return np.reshape(x, (replicas, per_device, *x.shape[1:]))

    replicated = jax.tree_util.tree_map(per_device_copies, variables)
    batch = jax.tree_util.tree_map(split, example)
    if not concrete:
        batch = _abstract(batch)
    fn = jax.pmap(_per_device_step(train), axis_name=AXIS, devices=jax.devices()[:replicas])
    return fn, (*replicated, batch)


def _shard_map_form(train, variables: tuple, example, replicas: int, concrete: bool):
    """(`jax.jit` over `jax.shard_map` of the per-device step, its arguments)."""
    mesh = Mesh(np.array(jax.devices()[:replicas]), (AXIS,))
    fn = jax.jit(
        jax.shard_map(
            _per_device_step(train),
            mesh=mesh,
            in_specs=(P(), P(), P(), P(AXIS)),
            out_specs=(P(), P(), P(), P()),
            check_vma=False,  # gradients are reduced explicitly, one pmean each
        )
    )
    return fn, (*variables, example if concrete else _abstract(example))


def _sharded_form(
    train, variables: tuple, example, replicas: int, concrete: bool, donate: bool = False
):
    """(`jax.jit` of the whole batch's step over sharded arguments, the
    arguments placed: variables replicated, the batch split along its first
    axis). XLA's SPMD partitioner splits the step by the arguments' shardings
    and inserts the gradient all-reduces itself."""
    mesh = Mesh(np.array(jax.devices()[:replicas]), (AXIS,))
    whole, split = NamedSharding(mesh, P()), NamedSharding(mesh, P(AXIS))

    def global_step(params, state, opt_state, batch):
        return train(params, state, opt_state, batch, lambda x: x)

    fn = jax.jit(
        global_step,
        in_shardings=(whole, whole, whole, split),
        out_shardings=(whole, whole, whole, whole),
        donate_argnums=(0, 1, 2) if donate else (),
    )

    def place(tree, sharding):
        if not concrete:
            return jax.tree_util.tree_map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree
            )
        return jax.device_put(tree, sharding)

    return fn, (*place(variables, whole), place(example, split))
