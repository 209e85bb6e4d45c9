"""Gradient accumulation as Optax's "Gradient Accumulation" example writes it:
a Flax Linen MLP applied with `net.apply`, an `optax.chain` of global-norm
clipping and AdamW on a warmup-cosine schedule wrapped in `optax.MultiSteps`
(the update applied every k-th step), and `build_train_step` returning a
`@jax.jit` step (no donation), each batch sharded on a "batch" mesh axis.
Synthetic data; prints one JSON line of results."""

import argparse
import json
import time

import flax.linen as nn
import jax
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


class MLP(nn.Module):
    """A simple multilayer perceptron model."""

    hidden: int = 64

    @nn.compact
    def __call__(self, x):
        x = x.reshape((x.shape[0], -1))
        x = nn.relu(nn.Dense(features=self.hidden)(x))
        x = nn.relu(nn.Dense(features=self.hidden)(x))
        return nn.Dense(features=10)(x)


def build_train_step(net, optimizer):
    def loss_fn(params, batch):
        logits = net.apply(params, batch["image"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()

    @jax.jit
    def train_step(params, opt_state, batch):
        loss_value, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, loss_value

    return train_step


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--accumulate", type=int, default=4)
    args = parser.parse_args()

    mesh = jax.make_mesh((jax.device_count(),), ("batch",))
    rng = np.random.RandomState(0)
    batches = min(args.steps, 24)  # a small data set, gone through again and again
    count = batches * args.batch_size
    images = rng.rand(count, 28, 28, 1).astype(np.float32)
    labels = rng.randint(0, 10, count).astype(np.int32)

    net = MLP(args.hidden)
    params = net.init(jax.random.key(0), images[:1])
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=3e-3,
        warmup_steps=2,
        decay_steps=max(3, args.steps // args.accumulate),
    )
    optimizer = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(learning_rate=schedule, weight_decay=1e-4),
    )
    optimizer = optax.MultiSteps(optimizer, every_k_schedule=args.accumulate)
    opt_state = optimizer.init(params)
    params, opt_state = jax.device_put((params, opt_state), NamedSharding(mesh, P()))
    data_sharding = NamedSharding(mesh, P("batch"))
    train_step = build_train_step(net, optimizer)

    losses = []
    step_s = []
    for i in range(args.steps):
        started = time.perf_counter()
        part = slice((i % batches) * args.batch_size, (i % batches + 1) * args.batch_size)
        batch = jax.device_put({"image": images[part], "label": labels[part]}, data_sharding)
        params, opt_state, loss_value = train_step(params, opt_state, batch)
        jax.block_until_ready((params, opt_state))  # a sync per step (see README)
        step_s.append(time.perf_counter() - started)
        losses.append(float(loss_value))
    flat = np.concatenate([np.ravel(np.asarray(leaf)) for leaf in jax.tree.leaves(params)])
    result = {
        "loss": sum(losses[-args.accumulate :]) / args.accumulate,
        "updates_applied": int(opt_state.gradient_step),
        "params": flat[:: max(1, flat.size // 512)].tolist(),
        "step_s": step_s,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
