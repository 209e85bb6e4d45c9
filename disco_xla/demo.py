"""`make demo`: capture a small pmap'd training step, inspect it, print what we found.

The step is a two-layer MLP regression with an optax SGD-with-momentum update and
one `lax.pmean` per gradient, replicated over 4 CPU devices. Later work extends
this demo to search, rewrite and measure.
"""

from __future__ import annotations

import os
import sys

DEVICES = 4
OUTPUT_DIR = os.path.join("build", "demo")


def build_step():
    """A data-parallel training step and its arguments, stacked for pmap."""
    import jax
    import jax.numpy as jnp
    import optax

    optimizer = optax.sgd(learning_rate=0.01, momentum=0.9)

    def loss_fn(params, batch):
        inputs, targets = batch
        hidden = jax.nn.relu(inputs @ params["hidden_w"] + params["hidden_b"])
        predictions = hidden @ params["output_w"] + params["output_b"]
        return jnp.mean((predictions - targets) ** 2)

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        grads = jax.tree_util.tree_map(lambda g: jax.lax.pmean(g, "data"), grads)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, jax.lax.pmean(loss, "data")

    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {
        "hidden_w": jax.random.normal(keys[0], (64, 256)) * 0.05,
        "hidden_b": jnp.zeros((256,)),
        "output_w": jax.random.normal(keys[1], (256, 10)) * 0.05,
        "output_b": jnp.zeros((10,)),
    }
    opt_state = optimizer.init(params)
    batch = (jax.random.normal(keys[2], (32, 64)), jnp.zeros((32, 10)))

    def replicate(tree):
        return jax.tree_util.tree_map(lambda x: jnp.stack([x] * DEVICES), tree)

    def shard(tree):
        return jax.tree_util.tree_map(lambda x: x.reshape((DEVICES, -1) + x.shape[1:]), tree)

    batch = (jnp.tile(batch[0], (DEVICES, 1)), jnp.tile(batch[1], (DEVICES, 1)))
    step = jax.pmap(train_step, axis_name="data")
    return step, (replicate(params), replicate(opt_state), shard(batch)), len(params)


def main() -> int:
    import jax

    jax.config.update("jax_num_cpu_devices", DEVICES)
    from disco_xla import capture_jax, load_module, save_module
    from disco_xla.hlo_passes.summary import format_summary, summarize

    step, args, parameter_tensors = build_step()
    print(f"capturing a pmap'd MLP training step on {DEVICES} CPU devices ...")
    module = capture_jax(step, *args)
    os.makedirs(OUTPUT_DIR, exist_ok=True)
    path = os.path.join(OUTPUT_DIR, "mlp_step.hlo.pb")
    save_module(module, path)
    reloaded = load_module(path)
    print(format_summary(summarize(reloaded)))
    found = len(reloaded.gradient_all_reduces)
    print(
        f"\n{found} gradient all-reduces found for {parameter_tensors} parameter tensors "
        f"({'as expected' if found == parameter_tensors else 'MISMATCH'}); module saved to {path}"
    )
    return 0 if found == parameter_tensors else 1


if __name__ == "__main__":
    sys.exit(main())
