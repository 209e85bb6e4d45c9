"""A multi-process `jax.distributed` loop as JAX's multi-process guide writes one:
a mesh over all processes' devices, each process feeding its slice of the global
batch via `jax.make_array_from_process_local_data`, a jitted step donating its
replicated params. Run under a launcher that initializes jax.distributed, or alone."""

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


def init_params(key, sizes):
    params = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=True):
        key, sub = jax.random.split(key)
        params.append((jax.random.normal(sub, (n_in, n_out)) / np.sqrt(n_in), jnp.zeros(n_out)))
    return params


def loss_fn(params, inputs, labels):
    activations = inputs
    for weights, bias in params[:-1]:
        activations = jnp.tanh(activations @ weights + bias)
    weights, bias = params[-1]
    logits = activations @ weights + bias
    log_probs = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(log_probs, labels[:, None], axis=1))


@jax.jit(donate_argnums=0)
def train_step(params, inputs, labels):
    loss, grads = jax.value_and_grad(loss_fn)(params, inputs, labels)
    return jax.tree.map(lambda p, g: p - 0.05 * g, params, grads), loss


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args()

    mesh = Mesh(np.array(jax.devices()), ("data",))
    replicated = NamedSharding(mesh, P())
    data_sharding = NamedSharding(mesh, P("data"))
    rng = np.random.RandomState(0)  # every process draws the same global data
    batches = min(args.steps, 24)  # a small data set, gone through again and again
    count = batches * args.global_batch
    images = rng.rand(count, 784).astype(np.float32)
    labels = rng.randint(0, 10, count).astype(np.int32)
    per_process = args.global_batch // jax.process_count()
    mine = jax.process_index() * per_process

    params = init_params(jax.random.key(0), [784, args.hidden, args.hidden, 10])
    params = jax.device_put(params, replicated)
    step_s = []
    for i in range(args.steps):
        started = time.perf_counter()
        first = (i % batches) * args.global_batch + mine
        rows = slice(first, first + per_process)
        inputs, targets = (
            jax.make_array_from_process_local_data(
                data_sharding, local, (args.global_batch,) + local.shape[1:]
            )
            for local in (images[rows], labels[rows])
        )
        params, loss = train_step(params, inputs, targets)
        jax.block_until_ready(params)  # a sync per step (see README)
        step_s.append(time.perf_counter() - started)
    if jax.process_index() == 0:
        flat = np.concatenate([np.ravel(np.asarray(leaf)) for leaf in jax.tree.leaves(params)])
        result = {
            "loss": float(loss),
            "params": flat[:: max(1, flat.size // 512)].tolist(),
            "step_s": step_s,
        }
        print(json.dumps(result))


if __name__ == "__main__":
    main()
