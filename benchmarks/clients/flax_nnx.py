"""A Flax NNX data-parallel loop as Flax's NNX guides write one: an `nnx.Module`
MLP, `nnx.Optimizer` with optax Adam, an `@nnx.jit` step using `nnx.value_and_grad`,
model and optimizer state replicated via `nnx.state`/`nnx.update`, and each batch
sharded on a "batch" mesh axis. Synthetic data; prints one JSON line of results."""

import argparse
import json
import time

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


class MLP(nnx.Module):
    def __init__(self, din, dhidden, dout, *, rngs: nnx.Rngs):
        self.linear1 = nnx.Linear(din, dhidden, rngs=rngs)
        self.linear2 = nnx.Linear(dhidden, dhidden, rngs=rngs)
        self.linear3 = nnx.Linear(dhidden, dout, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.linear1(x))
        x = nnx.relu(self.linear2(x))
        return self.linear3(x)


@nnx.jit
def train_step(model, optimizer, batch):
    inputs, labels = batch

    def loss_fn(model):
        logits = model(inputs)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args()

    mesh = jax.make_mesh((jax.device_count(),), ("batch",))
    rng = np.random.RandomState(0)
    batches = min(args.steps, 24)  # a small data set, gone through again and again
    count = batches * args.batch_size
    images = rng.rand(count, 784).astype(np.float32)
    labels = rng.randint(0, 10, count).astype(np.int32)

    model = MLP(784, args.hidden, 10, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    state = nnx.state((model, optimizer))
    state = jax.device_put(state, NamedSharding(mesh, P()))  # replicated
    nnx.update((model, optimizer), state)
    data_sharding = NamedSharding(mesh, P("batch"))

    step_s = []
    for i in range(args.steps):
        started = time.perf_counter()
        part = slice((i % batches) * args.batch_size, (i % batches + 1) * args.batch_size)
        batch = jax.device_put((images[part], labels[part]), data_sharding)
        loss = train_step(model, optimizer, batch)
        jax.block_until_ready((loss, nnx.state((model, optimizer))))  # a sync per step
        step_s.append(time.perf_counter() - started)
    leaves = jax.tree.leaves(nnx.state(model, nnx.Param))
    flat = np.concatenate([np.ravel(np.asarray(leaf)) for leaf in leaves])
    result = {
        "loss": float(loss),
        "params": flat[:: max(1, flat.size // 512)].tolist(),
        "step_s": step_s,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
