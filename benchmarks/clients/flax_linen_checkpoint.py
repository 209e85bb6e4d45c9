"""A Flax Linen loop as Flax's Linen guides write one: an `nn.Module` MLP, a mesh
from `mesh_utils.create_device_mesh`, a `flax.training.train_state.TrainState`
with optax SGD and momentum, a step jitted with `in_shardings`/`out_shardings`
that donates the state and takes the batch as host arrays (jit places them), a
jitted `eval_step` on a held-out set every few steps, and a checkpoint written
with `flax.serialization.to_bytes` every few steps and restored with
`from_bytes` at the end. Synthetic data; prints one JSON line of results."""

import argparse
import json
import os
import tempfile
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import serialization
from flax.training import train_state
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


class MLP(nn.Module):
    hidden: int = 64

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(self.hidden)(x))
        x = nn.relu(nn.Dense(self.hidden)(x))
        return nn.Dense(10)(x)


def create_train_state(rng, hidden, learning_rate, momentum):
    model = MLP(hidden)
    params = model.init(rng, jnp.ones([1, 784]))["params"]
    tx = optax.sgd(learning_rate, momentum)
    return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)


def train_step(state, batch):
    def loss_fn(params):
        logits = state.apply_fn({"params": params}, batch["image"])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
        return loss, logits

    (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    state = state.apply_gradients(grads=grads)
    accuracy = jnp.mean(jnp.argmax(logits, -1) == batch["label"])
    return state, {"loss": loss, "accuracy": accuracy}


@jax.jit
def eval_step(state, batch):
    logits = state.apply_fn({"params": state.params}, batch["image"])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
    return {"loss": loss, "accuracy": jnp.mean(jnp.argmax(logits, -1) == batch["label"])}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--eval-every", type=int, default=8)
    parser.add_argument("--checkpoint-every", type=int, default=8)
    args = parser.parse_args()

    # As Flax's Linen sharding guide builds its mesh (axes of type Auto). On a
    # `jax.make_mesh` mesh (Explicit axes in JAX 0.10) the host batch below would
    # enter the step typed as replicated and every device would compute it all.
    mesh = Mesh(devices=mesh_utils.create_device_mesh((jax.device_count(),)), axis_names=("data",))
    replicated = NamedSharding(mesh, P())
    data_sharding = NamedSharding(mesh, P("data"))
    rng = np.random.RandomState(0)
    batches = min(args.steps, 24)  # a small data set, gone through again and again
    count = batches * args.batch_size
    images = rng.rand(count, 784).astype(np.float32)
    labels = rng.randint(0, 10, count).astype(np.int32)
    test_ds = {
        "image": rng.rand(4 * args.batch_size, 784).astype(np.float32),
        "label": rng.randint(0, 10, 4 * args.batch_size).astype(np.int32),
    }
    test_ds = jax.device_put(test_ds, data_sharding)

    state = create_train_state(jax.random.key(0), args.hidden, 0.05, 0.9)
    state = jax.device_put(state, replicated)
    state_sharding = jax.tree.map(lambda _: replicated, state)
    jit_train_step = jax.jit(
        train_step,
        in_shardings=(state_sharding, data_sharding),
        out_shardings=(state_sharding, replicated),
        donate_argnums=0,
    )

    checkpoint_dir = tempfile.mkdtemp(prefix="flax_linen_checkpoint_")
    checkpoint = os.path.join(checkpoint_dir, "state.msgpack")
    history = []
    step_s = []
    for i in range(args.steps):
        started = time.perf_counter()
        part = slice((i % batches) * args.batch_size, (i % batches + 1) * args.batch_size)
        batch = {"image": images[part], "label": labels[part]}  # host arrays: jit shards them
        state, metrics = jit_train_step(state, batch)
        jax.block_until_ready(state)  # a sync per step (see README)
        step_s.append(time.perf_counter() - started)
        if (i + 1) % args.eval_every == 0:
            evaluation = jax.device_get(eval_step(state, test_ds))
            history.append({"step": i + 1, **{k: float(v) for k, v in evaluation.items()}})
        if (i + 1) % args.checkpoint_every == 0:
            with open(checkpoint, "wb") as file:
                file.write(serialization.to_bytes(state))

    # Restore the last checkpoint into a fresh state, as a resumed run would.
    template = create_train_state(jax.random.key(1), args.hidden, 0.05, 0.9)
    with open(checkpoint, "rb") as file:
        restored = serialization.from_bytes(template, file.read())
    os.remove(checkpoint)
    os.rmdir(checkpoint_dir)
    final = jax.device_get(eval_step(jax.device_put(restored, replicated), test_ds))
    flat = np.concatenate([np.ravel(np.asarray(leaf)) for leaf in jax.tree.leaves(restored.params)])
    result = {
        "eval_loss": float(final["loss"]),
        "train_loss": float(metrics["loss"]),
        "eval_history": [[h["step"], h["loss"], h["accuracy"]] for h in history],
        "restored_step": int(restored.step),
        "params": flat[:: max(1, flat.size // 512)].tolist(),
        "step_s": step_s,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
