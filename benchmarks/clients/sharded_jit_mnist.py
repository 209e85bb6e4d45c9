"""A sharded `jax.jit` training loop written the way JAX's SPMD examples write
one: an Explicit mesh, `jax.set_mesh`, each batch placed with `jax.device_put`
and a `NamedSharding`, and a step that donates its parameters. It knows nothing
of disco-xla. Synthetic MNIST-shaped data; prints one JSON line of results."""

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P


def init_params(key, sizes):
    params = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=True):
        key, sub = jax.random.split(key)
        params.append((jax.random.normal(sub, (n_in, n_out)) / np.sqrt(n_in), jnp.zeros(n_out)))
    return params


def predict(params, inputs):
    activations = inputs
    for weights, bias in params[:-1]:
        activations = jnp.tanh(activations @ weights + bias)
    weights, bias = params[-1]
    logits = activations @ weights + bias
    return logits - jax.nn.logsumexp(logits, axis=1, keepdims=True)


def loss(params, batch):
    inputs, targets = batch
    return -jnp.mean(jnp.sum(predict(params, inputs) * targets, axis=1))


@jax.jit(donate_argnums=0)
def update(params, batch):
    grads = jax.grad(loss)(params, batch)
    return [(w - 0.05 * dw, b - 0.05 * db) for (w, b), (dw, db) in zip(params, grads, strict=True)]


@jax.jit
def accuracy(params, batch):
    inputs, targets = batch
    return jnp.mean(jnp.argmax(predict(params, inputs), 1) == jnp.argmax(targets, 1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args()

    mesh = jax.make_mesh((jax.device_count(),), ("batch",), axis_types=(AxisType.Explicit,))
    rng = np.random.RandomState(0)
    count = args.batches * args.batch_size
    images = rng.rand(count, 784).astype(np.float32)
    labels = np.eye(10, dtype=np.float32)[rng.randint(0, 10, count)]
    with jax.set_mesh(mesh):
        params = init_params(jax.random.key(0), [784, args.hidden, args.hidden, 10])
        replicated = NamedSharding(mesh, P())
        params = jax.device_put(params, replicated)
        data_sharding = NamedSharding(mesh, P("batch"))
        epoch_s = []
        for _ in range(args.epochs):
            started = time.perf_counter()
            for i in range(args.batches):
                part = slice(i * args.batch_size, (i + 1) * args.batch_size)
                batch = jax.device_put((images[part], labels[part]), data_sharding)
                params = update(params, batch)
                jax.block_until_ready(params)  # a sync per step (see README)
            epoch_s.append(time.perf_counter() - started)
            everything = jax.device_put((images, labels), data_sharding)
            train_accuracy = float(accuracy(params, everything))
    flat = np.concatenate([np.ravel(np.asarray(leaf)) for leaf in jax.tree.leaves(params)])
    print(
        json.dumps(
            {
                "accuracy": train_accuracy,
                "params": flat[:: max(1, flat.size // 512)].tolist(),
                "epoch_s": epoch_s,
            }
        )
    )


if __name__ == "__main__":
    main()
