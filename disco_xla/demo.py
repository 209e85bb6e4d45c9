"""`make demo`: the whole loop on an embedded training step, on 4 CPU devices.

The step is a two-layer MLP regression with an optax SGD-with-momentum update and
one `lax.pmean` per gradient, replicated over 4 CPU devices. The demo:

1. captures it and inspects the module;
2. searches for a plan, pricing every plan with the `cpu-local-inprocess`
   profile: this machine calibrated in one process with N CPU devices, the
   runtime steps 3 and 4 measure on;
3. applies the plan as `disco-xla optimize -o` does: the plan, its buckets alone
   and XLA's own program run on the same inputs, and the fastest one that
   computes the same is written (never a slower or different program). Each
   program's simulated time (`cpu-local-inprocess`) is printed beside its
   measured one;
4. runs `jax.pmap` and `disco_xla.jit` (which searches with the same profile and
   settings and runs the fastest of its candidates that computes the same) in
   paired rounds whose order rotates, and prints, for the program each ran, the
   simulated step time (`cpu-local-inprocess`) beside the measured one. When
   `disco_xla.jit` kept the original program it says so and claims no speed-up;
5. writes the HTML report (priced with `cpu-local-inprocess`);
6. runs the same step as most JAX users write it, `jax.jit` over arrays sharded
   on a mesh (no pmean: XLA's SPMD partitioner inserts the all-reduces), on 4
   `jax.distributed` processes on loopback (gloo), one CPU device each:
   `disco_xla.jit` captures it after partitioning, rank 0 searches with the
   `cpu-local` profile (this machine calibrated on gloo processes, the runtime
   measured here), all ranks check the rewritten program against the original,
   and then both are timed in paired rounds whose order rotates. Only rank 0
   prints: simulated (`cpu-local`) beside measured, for the program each ran.

Each step that measures names, on a `profile:` line, the profile its simulated
times come from. A profile calibrated on the other runtime is off by more than
10x here: a small all-reduce adds about 0.06 ms to a step on 4 devices in one
process and about 6 ms on 4 gloo processes (the profiles' `all_reduce_in_step_s`
at 4 workers).

Where the gain comes from here: XLA:CPU's combiner merges the gradients into one
tuple all-reduce, which reduces its tensors one after another (each adds the
profile's `tuple_all_reduce_element_s`); the plan's bucket concatenates them and
reduces one buffer. Over gloo the tuple costs about as much as one all-reduce
per tensor: on 4 processes, zoo resnet50 (tiny) took 268 ms a step with XLA's
tuple, 241 ms with one all-reduce per gradient, and 16.7 ms with one bucket
(`benchmarks/realised_speedup.py --processes 4`, BENCHMARKS.md). The plan keeps
XLA's own fusion (its groups only split XLA's, and none pays off here), so the
program differs from XLA's in its all-reduces alone.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import disco_xla
from disco_xla import capture_jax, load_module, save_module
from disco_xla.cli.report import write_report
from disco_xla.driver.checked_rewrite import checked_rewrite, xla_own_groups
from disco_xla.driver.planning import prepared
from disco_xla.hlo.summary import format_summary, summarize
from disco_xla.plan import departing_groups
from disco_xla.runtime.agreement import gather
from disco_xla.runtime.launch import launch
from disco_xla.runtime.output_comparison import compare_outputs
from disco_xla.runtime.xla_runner import NO_COMBINER, compile_module
from disco_xla.search.baselines import with_buckets
from disco_xla.search.fusion_source import compiled_fusion
from disco_xla.search.pipeline import Pricing, plan_module
from disco_xla.search.summary import format_table
from disco_xla.settings import OptimizeSettings
from disco_xla.simulator.cost_models import RooflineCostModel
from disco_xla.simulator.events import simulate
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.profiles import load_profile
from disco_xla.timing import median_seconds

DEVICES = 4
OUTPUT_DIR = os.path.join("build", "demo")
# The profile that prices each step: the one calibrated on the runtime it measures.
IN_PROCESS_PROFILE = "cpu-local-inprocess"  # steps 2 to 5: one process, N CPU devices
PROCESSES_PROFILE = "cpu-local"  # step 6: jax.distributed processes, gloo on loopback
# The header of the tables that print simulated beside measured step times.
TIME_HEADER = f"   {'program':<36}{'simulated ms':>13}{'measured ms':>14}"


def _mlp_training(mean_over_devices):
    """(optimizer, train_step) of the demo's MLP regression: SGD with momentum,
    `mean_over_devices` applied to each gradient and to the loss."""
    optimizer = optax.sgd(learning_rate=0.01, momentum=0.9)

    def loss_fn(params, batch):
        inputs, targets = batch
        hidden = jax.nn.relu(inputs @ params["hidden_w"] + params["hidden_b"])
        predictions = hidden @ params["output_w"] + params["output_b"]
        return jnp.mean((predictions - targets) ** 2)

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        grads = jax.tree_util.tree_map(mean_over_devices, grads)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, mean_over_devices(loss)

    return optimizer, train_step


def build_step():
    """A data-parallel training step and its arguments, stacked for pmap."""
    optimizer, train_step = _mlp_training(lambda x: jax.lax.pmean(x, "data"))

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
    # Before anything starts JAX's CPU backend (build_step, below, does).
    jax.config.update("jax_num_cpu_devices", DEVICES)

    step, args, parameter_tensors = build_step()
    print(f"1. capturing a pmap'd MLP training step on {DEVICES} CPU devices ...")
    module = capture_jax(step, *args)
    os.makedirs(OUTPUT_DIR, exist_ok=True)
    path = os.path.join(OUTPUT_DIR, "mlp_step.hlo.pb")
    save_module(module, path)
    reloaded = load_module(path)
    print(format_summary(summarize(reloaded)))
    found = len(reloaded.gradient_all_reduces)
    print(
        f"{found} gradient all-reduces found for {parameter_tensors} parameter tensors "
        f"({'as expected' if found == parameter_tensors else 'MISMATCH'}); module saved to {path}"
    )
    if found != parameter_tensors:
        return 1
    return _optimize_apply_measure(reloaded, step, args)


def _optimize_apply_measure(module, step, args) -> int:
    """Steps 2 to 5, all measured in this process and priced with
    IN_PROCESS_PROFILE; then step 6. Returns the demo's exit code."""
    settings = OptimizeSettings(cluster=IN_PROCESS_PROFILE, max_evaluations=300, seed=0)
    module = prepared(module)
    profile = load_profile(settings.cluster, module.worker_count())
    comparison, plan_path = _search(module, profile, settings)
    plan = comparison.found.plan
    written = _apply(module, profile, comparison, plan_path)
    status, measured, entries = _pmap_against_jit(settings, step, args)
    _print_step_times(entries, measured, status)
    report_path = os.path.join(OUTPUT_DIR, "report.html")
    # The report is headed by the profile's `name`; name it by its file, as above.
    named = dataclasses.replace(profile, name=settings.cluster)
    write_report(report_path, module, named, comparison.results, plan, comparison.fusion.note)
    print(f"\n5. report written to {report_path} (priced with {settings.cluster})")
    # The step runs either our program or, where it measured faster, XLA's own.
    single_ok = written.equal and status.startswith(("optimized", "original: faster"))
    return _on_processes() or (0 if single_ok else 1)


def _profile_line(cluster: str, runtime: str) -> str:
    """The line that names the profile a step's simulated times come from."""
    return f"   profile: {cluster} (calibrated on {runtime}, the runtime measured here)"


def _time_row(label: str, simulated_s: float | None, measured_s: float, note: str = "") -> str:
    """One program's row: its simulated and measured step times, in ms."""
    simulated = "n/a" if simulated_s is None else f"{simulated_s * 1e3:.3f}"
    return f"   {label:<36}{simulated:>13}{measured_s * 1e3:>14.3f}  {note}".rstrip()


def _search(module, profile, settings):
    """Step 2: the search and every baseline, simulated; (comparison, plan path)."""
    print(
        f"\n2. searching with the {settings.cluster} profile ({settings.max_evaluations} plans;"
        f" calibrated in one process\n   on {DEVICES} CPU devices, where steps 3 and 4 measure) ..."
    )
    comparison = plan_module(
        module,
        settings,
        Pricing(profile, RooflineCostModel(profile)),  # calibrated here, in one process
        compiled_fusion(module, compile_module(module, NO_COMBINER)),
        ablations=True,
    )
    print(format_table(comparison))
    plan_path = os.path.join(OUTPUT_DIR, "plan.json")
    with open(plan_path, "w") as file:
        file.write(comparison.found.plan.to_json())
    print(f"   plan saved to {plan_path}")
    return comparison, plan_path


def _buckets_alone_s(module, profile, comparison) -> float:
    """The simulated step time of the found plan's buckets over XLA's own fusion
    (the program `checked_rewrite` labels 'buckets')."""
    own = comparison.baselines["xla-nocombine"].plan
    buckets = comparison.found.plan.all_reduce_buckets
    graph = build_task_graph(module, with_buckets(own, buckets))
    return simulate(graph, profile, RooflineCostModel(profile)).iteration_s


def _apply(module, profile, comparison, plan_path: str):
    """Step 3: the plan applied as `disco-xla optimize -o` applies it, each
    program's simulated time beside its measured one; the
    `checked_rewrite.checked_rewrite` result."""
    print("\n3. applying the plan, checked against XLA's own program on random inputs ...")
    plan, results = comparison.found.plan, comparison.results
    simulated = {
        "plan": results["found"].iteration_s,
        "buckets": _buckets_alone_s(module, profile, comparison),
    }
    written = checked_rewrite(module, plan, plan_path, simulated_s=simulated)
    rewritten_path = os.path.join(OUTPUT_DIR, "mlp_step.optimized.hlo.pb")
    save_module(written.module, rewritten_path)
    print(_profile_line(IN_PROCESS_PROFILE, f"one process with {DEVICES} CPU devices"))
    print(TIME_HEADER + "  outputs")
    original_s = results["xla"].iteration_s
    print(_time_row("XLA's own program", original_s, written.original_s, "reference"))
    for label, entry in written.candidates.items():
        if "error" in entry:
            print(f"   {label:<36} failed: {entry['error']}")
            continue
        equal = "equal" if entry["equal"] else "DIFFERENT"
        print(_time_row(label, entry.get("simulated_s"), entry["seconds"], equal))
    departing = departing_groups(module, plan, xla_own_groups(module))
    print(
        f"   the plan: gradient buckets {len(plan.all_reduce_buckets)}, "
        f"{len(departing)} fusion groups departing from XLA's own fusion"
    )
    print(f"   wrote {rewritten_path}: {written.written} ({written.why})")
    return written


def _pmap_against_jit(settings, step, args) -> tuple[str, dict, dict]:
    """Step 4: `disco_xla.jit` of the step (its own search, with `settings`),
    timed against `jax.pmap`; (its status, measured seconds, its
    `measurements()` entry for the timed signature: the simulated times).

    No plan cache: a cache would price the second signature with the collective
    costs it learned from the first call's (noisy) timings, not with the profile."""
    print("\n4. the real step: jax.pmap against disco_xla.jit, simulated and measured ...")
    optimized = disco_xla.jit(
        step,
        cluster=settings.cluster,
        max_evaluations=settings.max_evaluations,
        seed=settings.seed,
        use_cache=False,
        background=False,  # the demo shows the first call's trial and its choice
    )
    state = optimized(*args)  # first call: search, rewrite, check against the original
    arguments = (*state[:2], args[2])
    optimized(*arguments), step(*arguments)  # both signatures compiled
    status = optimized.status()[-1]
    print(f"   disco_xla.jit runs: {status}")
    measured = _paired_medians(step, optimized, arguments)
    return status, measured, optimized.measurements()[-1]


def _paired_medians(step, optimized, arguments) -> dict[str, float]:
    """The median seconds of `step` ('xla') and `optimized` ('found') over 10
    paired rounds whose order rotates (the machine is noisy), each round the
    median of 5 runs. Every rank of a distributed step runs the same rounds in
    the same order."""

    def run(function):
        return lambda: jax.block_until_ready(function(*arguments))

    programs = [("xla", step), ("found", optimized)]
    times = {"xla": [], "found": []}
    for round_index in range(10):
        for name, function in programs[round_index % 2 :] + programs[: round_index % 2]:
            times[name].append(median_seconds(run(function), 5))
    return {name: float(np.median(values)) for name, values in times.items()}


def _simulated_of_rows(entries: dict) -> tuple[str, float | None, float | None]:
    """From a `disco_xla.jit` `measurements()` entry: the label of the program
    it runs, and the simulated seconds of XLA's own program and of that one
    (None where the search gave none, as for the plan's buckets alone)."""
    chosen = next((label for label, entry in entries.items() if entry.get("chosen")), "original")

    def simulated(label: str) -> float | None:
        entry = entries.get(label, {})
        return entry.get("simulated_s", entries.get(entry.get("same_as"), {}).get("simulated_s"))

    return chosen, simulated("original"), simulated(chosen)


def _step_time_lines(entries, measured, status, xla_label: str, profile_line: str, clock: str):
    """Steps 4 and 6's table: for the program each side ran, the simulated
    step time beside the measured one, and the speed-up (or why none is
    claimed)."""
    chosen, xla_s, found_s = _simulated_of_rows(entries)
    lines = [
        profile_line,
        TIME_HEADER,
        _time_row(xla_label, xla_s, measured["xla"]),
        _time_row(f"disco_xla.jit ({chosen})", found_s, measured["found"]),
    ]
    if status.startswith("optimized"):
        simulated = f"{xla_s / found_s:.2f}x" if xla_s and found_s else "n/a"
        lines.append(
            f"   speed-up: simulated {simulated}, measured "
            f"{measured['xla'] / measured['found']:.2f}x (median of 10 paired rounds{clock})"
        )
    else:
        lines.append(
            "   disco_xla.jit kept XLA's own program, so both rows ran the same program: no\n"
            "   speed-up is claimed, and their difference is the machine's noise."
        )
    return lines


def _print_step_times(entries: dict, measured: dict, status: str) -> None:
    """Step 4's table, priced with IN_PROCESS_PROFILE."""
    runtime = f"one process with {DEVICES} CPU devices"
    profile_line = _profile_line(IN_PROCESS_PROFILE, runtime)
    for line in _step_time_lines(entries, measured, status, "jax.pmap (XLA)", profile_line, ""):
        print(line)


PROCESSES = 4
_RANK_SCRIPT = "import sys\nfrom disco_xla.demo import rank_main\nsys.exit(rank_main())\n"


def _on_processes() -> int:
    """Step 6: launch the ranks; returns the launcher's exit code."""
    print(
        f"\n6. jax.jit over sharded arrays on {PROCESSES} jax.distributed processes "
        f"(gloo on loopback, one CPU device each),\n   searched and priced with the "
        f"{PROCESSES_PROFILE} profile ..."
    )
    sys.stdout.flush()
    with tempfile.TemporaryDirectory() as directory:
        script = os.path.join(directory, "demo_rank.py")
        with open(script, "w") as file:
            file.write(_RANK_SCRIPT)
        return launch(script, [], PROCESSES, timeout_s=900)


def build_sharded_step():
    """The MLP step of `build_step` over the whole batch, jitted over arrays
    sharded on a mesh of every process's devices, and its global arguments
    (each process holds its own rows of the batch)."""
    # The whole batch's step: XLA's partitioner writes the gradient all-reduces.
    optimizer, train_step = _mlp_training(lambda x: x)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    whole, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))

    rng = np.random.default_rng(0)
    params = {
        "hidden_w": rng.standard_normal((64, 256)).astype(np.float32) * 0.05,
        "hidden_b": np.zeros((256,), np.float32),
        "output_w": rng.standard_normal((256, 10)).astype(np.float32) * 0.05,
        "output_b": np.zeros((10,), np.float32),
    }
    rows = 32  # per process
    inputs = rng.standard_normal((rows * jax.process_count(), 64)).astype(np.float32)
    mine = slice(rows * jax.process_index(), rows * (jax.process_index() + 1))

    def replicated(tree):
        return jax.tree_util.tree_map(
            lambda x: jax.make_array_from_process_local_data(whole, np.asarray(x)), tree
        )

    batch = tuple(
        jax.make_array_from_process_local_data(split, x[mine], x.shape)
        for x in (inputs, np.zeros_like(inputs[:, :10]))
    )
    step = jax.jit(
        train_step, in_shardings=(whole, whole, split), out_shardings=(whole, whole, whole)
    )
    return step, (replicated(params), replicated(optimizer.init(params)), batch)


def rank_main() -> int:
    """One rank of step 6 (run under `runtime.launch`)."""
    rank = jax.process_index()

    def say(text: str) -> None:
        if rank == 0:
            print(text, flush=True)

    step, args = build_sharded_step()
    optimized = disco_xla.jit(
        step, cluster=PROCESSES_PROFILE, max_evaluations=300, use_cache=False, background=False
    )
    optimized(*args)  # first call: capture after partitioning, search, rewrite, check
    status = optimized.status()[-1]
    plans = optimized.plans()
    say(f"   disco_xla.jit runs: {status}")
    if plans:
        say(f"   the plan: {len(plans[-1].all_reduce_buckets)} gradient bucket(s)")
    expected, got = step(*args), optimized(*args)

    def shards(tree) -> list:
        leaves = jax.tree_util.tree_leaves(tree)
        return [np.asarray(shard.data) for leaf in leaves for shard in leaf.addressable_shards]

    local = compare_outputs(shards(expected), shards(got))
    verdicts = gather("demo/equal", "1" if local.equal else "0")
    equal = all(v == "1" for v in verdicts)
    verdict = "equal" if equal else "DIFFERENT"
    say(f"   outputs against jax.jit's own program, on every rank: {verdict}")

    measured = _paired_medians(step, optimized, args)
    runtime = f"{jax.process_count()} jax.distributed processes, gloo on loopback"
    profile_line = _profile_line(PROCESSES_PROFILE, runtime)
    entries = optimized.measurements()[-1]
    clock = ", rank 0's clock"
    for line in _step_time_lines(entries, measured, status, "jax.jit (XLA)", profile_line, clock):
        say(line)
    return 0 if equal and status.startswith(("optimized", "original: faster")) else 1


if __name__ == "__main__":
    sys.exit(main())
