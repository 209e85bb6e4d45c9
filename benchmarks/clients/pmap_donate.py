"""A `jax.pmap` data-parallel loop as JAX's pmap tutorials write one: params and
an optax state replicated one copy per device, a step that averages grads with
`lax.pmean` and donates params and optimizer state, batches reshaped to
[devices, per_device, ...]. Synthetic data; prints one JSON line of results."""

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax


def init_params(key, sizes):
    params = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=True):
        key, sub = jax.random.split(key)
        params.append((jax.random.normal(sub, (n_in, n_out)) / np.sqrt(n_in), jnp.zeros(n_out)))
    return params


def loss_fn(params, inputs, labels):
    activations = inputs
    for weights, bias in params[:-1]:
        activations = jax.nn.relu(activations @ weights + bias)
    weights, bias = params[-1]
    logits = activations @ weights + bias
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


optimizer = optax.adam(1e-3)


def step(params, opt_state, inputs, labels):
    loss, grads = jax.value_and_grad(loss_fn)(params, inputs, labels)
    grads = jax.lax.pmean(grads, axis_name="batch")
    loss = jax.lax.pmean(loss, axis_name="batch")
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


p_step = jax.pmap(step, axis_name="batch", donate_argnums=(0, 1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args()

    devices = jax.local_devices()
    n = len(devices)
    rng = np.random.RandomState(0)
    batches = min(args.steps, 24)  # a small data set, gone through again and again
    count = batches * args.batch_size
    images = rng.rand(count, 784).astype(np.float32)
    labels = rng.randint(0, 10, count).astype(np.int32)

    params = init_params(jax.random.key(0), [784, args.hidden, args.hidden, 10])
    opt_state = optimizer.init(params)
    # jax.device_put_replicated is gone from JAX 0.10: stack one copy per device.
    params, opt_state = jax.tree.map(lambda x: jnp.stack([x] * n), (params, opt_state))

    step_s = []
    for i in range(args.steps):
        started = time.perf_counter()
        part = slice((i % batches) * args.batch_size, (i % batches + 1) * args.batch_size)
        inputs = images[part].reshape(n, args.batch_size // n, 784)
        targets = labels[part].reshape(n, args.batch_size // n)
        params, opt_state, loss = p_step(params, opt_state, inputs, targets)
        jax.block_until_ready((params, opt_state))  # a sync per step (see README)
        step_s.append(time.perf_counter() - started)
    final = jax.tree.map(lambda x: np.asarray(x[0]), params)  # replica 0
    flat = np.concatenate([np.ravel(leaf) for leaf in jax.tree.leaves(final)])
    result = {
        "loss": float(loss[0]),
        "params": flat[:: max(1, flat.size // 512)].tolist(),
        "step_s": step_s,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
