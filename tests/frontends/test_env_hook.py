"""DISCO_XLA_FLAGS: flags parsed with absl, bad flags stop with one line and exit
code 2, and an unmodified JAX script gets its data-parallel steps optimised."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import replace

import numpy as np
import pytest

from disco_xla.frontends.env_hook import parse_flags
from disco_xla.settings import DEFAULTS, WRAPPED_STEP_DEFAULTS


def test_flags_are_parsed_with_their_defaults():
    flags = parse_flags("--disco_enable --disco_cluster=v100-2x8-25g --disco_budget_s=5")
    assert flags.enable and flags.cluster == "v100-2x8-25g" and flags.budget_s == 5.0
    assert flags.use_cache and flags.cache_dir is None
    # Every other setting is the one default of `settings.DEFAULTS`.
    assert flags.settings() == replace(DEFAULTS, cluster="v100-2x8-25g", budget_s=5.0)
    assert not parse_flags("").enable
    # Unless named, the profile is read from the devices each step runs on.
    assert parse_flags("--disco_enable").settings() == WRAPPED_STEP_DEFAULTS
    assert WRAPPED_STEP_DEFAULTS.cluster == "auto"
    measured = parse_flags("--disco_candidates=2 --disco_measure_budget_s=7.5").settings()
    assert (measured.candidates, measured.measure_budget_s) == (2, 7.5)


@pytest.mark.parametrize(
    "text, named",
    [
        ("--disco_enable --disco_bogus=1", "--disco_bogus"),
        ("--disco_budget_s=fast", "--disco_budget_s"),
        ("--disco_max_evaluations=0", "--disco_max_evaluations"),
        ("--disco_candidates=0", "--disco_candidates"),
        ("disco_enable", "disco_enable"),
        ("--disco_report=/no/such/folder/report.json", "--disco_report"),
    ],
)
def test_a_bad_flag_is_named(text, named):
    with pytest.raises(ValueError, match=named):
        parse_flags(text)


def _python(code: str, flags: str | None, timeout_s: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("DISCO_XLA_FLAGS", None)
    if flags is not None:
        env["DISCO_XLA_FLAGS"] = flags
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
    )


def test_an_unknown_flag_stops_any_python_with_one_line_and_exit_code_2():
    # The .pth hook runs at start-up: the script does not even import disco_xla.
    result = _python("print('ran')", "--disco_enable --disco_colour=blue")
    assert result.returncode == 2
    assert "ran" not in result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--disco_colour" in lines[0] and "DISCO_XLA_FLAGS" in lines[0]


_UNMODIFIED_SCRIPT = """
    import sys
    import jax
    import numpy as np
    jax.config.update("jax_num_cpu_devices", 4)
    from disco_xla.demo import build_step  # calls jax.pmap, as a user script would

    step, args, _ = build_step()
    outputs = step(*args)
    outputs = step(*args)
    sine = jax.jit(jax.numpy.sin)
    sine(1.0)
    def first_words(function):  # 'optimized (buckets only ...)' -> 'optimized'
        return [s.split(" (")[0] for s in getattr(function, "status", lambda: ["plain jax"])()]
    print("STATUS", first_words(step), first_words(sine))
    print("PROFILE", step.profile() if hasattr(step, "profile") else "plain jax")
    np.savez("{out}", *[np.asarray(x) for x in jax.tree_util.tree_leaves(outputs)])
"""


def test_an_unmodified_script_runs_optimized_and_computes_the_same(tmp_path):
    from disco_xla.runtime.output_comparison import compare_outputs

    flags = (
        f"--disco_enable --disco_max_evaluations=10 --nodisco_check_speed --nodisco_background "
        f"--disco_cache_dir={tmp_path}"
    )
    optimized = _python(_UNMODIFIED_SCRIPT.format(out=tmp_path / "hook.npz"), flags)
    assert optimized.returncode == 0, optimized.stderr[-2000:]
    assert "STATUS ['optimized'] ['not data-parallel']" in optimized.stdout
    # --disco_cluster defaults to auto: 4 CPU devices in one process.
    assert (
        "PROFILE profile cpu-local-inprocess (auto: 4 CPU devices in one process)"
        in optimized.stdout
    )
    plain = _python(_UNMODIFIED_SCRIPT.format(out=tmp_path / "plain.npz"), None)
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert "STATUS ['plain jax'] ['plain jax']" in plain.stdout
    hooked, reference = np.load(tmp_path / "hook.npz"), np.load(tmp_path / "plain.npz")
    assert compare_outputs(
        [reference[k] for k in reference.files], [hooked[k] for k in hooked.files]
    ).equal


_NESTED_JIT_SCRIPT = """
    import jax
    import jax.numpy as jnp
    import numpy as np
    jax.config.update("jax_num_cpu_devices", 4)
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("fsdp",))
    shard = NamedSharding(mesh, P("fsdp", None))
    weights = [jax.device_put(jnp.full((8, 8), 0.1 * (i + 1)), shard) for i in range(3)]

    def loss(weights, x):
        for w in weights:
            x = jnp.tanh(x @ w)
        return jnp.mean(x ** 2)

    @jax.jit
    def update(weights, x):
        value, grads = jax.value_and_grad(loss)(weights, x)
        return [w - 0.1 * g for w, g in zip(weights, grads)], value

    step = jax.jit(update, donate_argnums=(0,))  # a jit of a jit, donating its state
    x = jax.device_put(jnp.ones((8, 8)), NamedSharding(mesh, P("fsdp")))
    values = []
    for _ in range(3):
        weights, value = step(weights, x)
        values.append(float(value))
    print("VALUES", values)
"""


def test_a_jit_of_a_jit_that_donates_runs_under_the_hook_as_without_it(tmp_path):
    flags = (
        "--disco_enable --disco_max_evaluations=10 --nodisco_check_speed --nodisco_background "
        f"--disco_cache_dir={tmp_path}"
    )
    hooked = _python(_NESTED_JIT_SCRIPT, flags)
    assert hooked.returncode == 0, hooked.stderr[-2000:]
    plain = _python(_NESTED_JIT_SCRIPT, None)
    assert plain.returncode == 0, plain.stderr[-2000:]
    values = [
        [float(v) for v in line.split("[")[1].rstrip("]").split(",")]
        for line in (hooked.stdout, plain.stdout)
        for line in line.splitlines()
        if line.startswith("VALUES")
    ]
    assert len(values) == 2
    np.testing.assert_allclose(values[0], values[1], rtol=1e-6)
