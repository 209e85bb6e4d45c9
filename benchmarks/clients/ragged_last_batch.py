"""An epoch loop with a data loader that keeps the last, smaller batch, as JAX's
"Training a simple neural network, with PyTorch data loading" tutorial loads
data (a `DataLoader` with `drop_last=False`): each epoch shuffles, ends on a
short batch, and so calls the jitted step with a second batch shape, which JAX
traces and compiles again. Params and an optax SGD-with-momentum state are
replicated and donated; each batch is sharded on a "batch" mesh axis with
`jax.device_put`. Synthetic data; prints one JSON line of results."""

import argparse
import json
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


def init_network_params(sizes, key):
    keys = jax.random.split(key, len(sizes))
    return [
        (jax.random.normal(k, (n, m)) / np.sqrt(m), jnp.zeros(n))
        for m, n, k in zip(sizes[:-1], sizes[1:], keys, strict=False)
    ]


def predict(params, images):
    activations = images
    for w, b in params[:-1]:
        activations = jax.nn.relu(jnp.dot(activations, w.T) + b)
    final_w, final_b = params[-1]
    logits = jnp.dot(activations, final_w.T) + final_b
    return logits - jax.nn.logsumexp(logits, axis=1, keepdims=True)


def loss(params, images, targets):
    return -jnp.mean(predict(params, images) * targets) * targets.shape[1]


optimizer = optax.sgd(learning_rate=0.05, momentum=0.9)


@partial(jax.jit, donate_argnums=(0, 1))
def train_step(params, opt_state, x, y):
    loss_value, grads = jax.value_and_grad(loss)(params, x, y)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss_value


@jax.jit
def accuracy(params, images, targets):
    return jnp.mean(jnp.argmax(predict(params, images), axis=1) == jnp.argmax(targets, axis=1))


def data_loader(images, labels, batch_size, rng):
    """Shuffled batches; the last one holds what is left (drop_last=False)."""
    order = rng.permutation(len(images))
    for start in range(0, len(images), batch_size):
        rows = order[start : start + batch_size]
        yield images[rows], labels[rows]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=200)  # 3 batches of 64 and one of 8
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args()

    mesh = jax.make_mesh((jax.device_count(),), ("batch",))
    replicated = NamedSharding(mesh, P())
    data_sharding = NamedSharding(mesh, P("batch"))
    rng = np.random.RandomState(0)
    images = rng.rand(args.samples, 784).astype(np.float32)
    labels = np.eye(10, dtype=np.float32)[rng.randint(0, 10, args.samples)]

    params = init_network_params([784, args.hidden, args.hidden, 10], jax.random.key(0))
    opt_state = optimizer.init(params)
    params, opt_state = jax.device_put((params, opt_state), replicated)
    shuffle = np.random.RandomState(1)
    epoch_s = []
    for _ in range(args.epochs):
        started = time.perf_counter()
        for x, y in data_loader(images, labels, args.batch_size, shuffle):
            x, y = jax.device_put((x, y), data_sharding)
            params, opt_state, loss_value = train_step(params, opt_state, x, y)
            jax.block_until_ready((params, opt_state))  # a sync per step (see README)
        epoch_s.append(time.perf_counter() - started)
    everything = jax.device_put((images, labels), data_sharding)
    train_accuracy = float(accuracy(params, *everything))
    flat = np.concatenate([np.ravel(np.asarray(leaf)) for leaf in jax.tree.leaves(params)])
    result = {
        "last_batch_loss": float(loss_value),
        "accuracy": train_accuracy,
        "params": flat[:: max(1, flat.size // 512)].tolist(),
        "epoch_s": epoch_s,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
