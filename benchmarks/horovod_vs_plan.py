"""Horovod's tensor fusion against a disco-xla plan's buckets, and against what
the Horovod runtime's measured choice runs, on N Horovod ranks.

    .venv/bin/python benchmarks/horovod_vs_plan.py [--model bert_encoder --model vgg16]
        [--ranks 2] [--rounds 10] [--steps 5] [--warmup 2] [--testbed loopback|netns]
        [--cluster horovod-local] [--json]

For each Keras zoo model (tiny size; default bert_encoder and vgg16) it captures
the TF training step for `--ranks` replicas in this environment (TF 2.21) with
`disco-xla capture`, runs `disco-xla optimize` on it for `--cluster` (the profile
`disco-xla calibrate --engine horovod` wrote), and then trains the same model
under Horovod (`.venv-horovod`, TF 2.12) with six settings:

- `default`: one `hvd.allreduce` per gradient, Horovod's fusion at 128 MB / 1 ms;
- `legacy`: the same at 64 MB / 5 ms (Horovod before 0.21);
- `none`: the same with fusion off (threshold 0);
- `plan`: the plan's buckets, one `hvd.grouped_allreduce` each, under Horovod's
  default fusion (`disco_xla.runtime.horovod.HorovodStep`);
- `disco`: what the Horovod runtime runs (`MeasuredHorovodStep`): its trial on
  the first steps picks the fastest of Horovod's own fusion, the legacy
  setting's buckets, and the plan grouped or packed; the job's timed steps
  come after the trial. The job starts under Horovod's default fusion;
- `disco-legacy` and `disco-none`: the same, the job started under the legacy
  setting or with fusion off. A running job cannot change Horovod's cycle time,
  so what runs is measured under each setting a user may start Horovod with.

Within each measured job, what runs is also compared with Horovod's own fusion
at that job's setting, paired: the same program where the trial keeps Horovod's
own (ratio 1), else the trial's confirmation rounds (`MeasuredHorovodStep`),
which time the winner and Horovod's own alternately in the same job. Across
jobs, two runs of one program here differed by up to 15%; within a job the
pairs share the machine's state.

Each setting of each round is its own job (Horovod reads its fusion settings at
`hvd.init()`, and re-initialising it in one process failed here, see
`runtime.horovod.set_fusion_environment`). Timing is paired and rotating: in round
r the jobs run in the order rotated by r (`--setting` picks some); each job runs `--warmup` untimed
steps (for `disco`, its trial's steps count among them, and the trial runs to
its end), then `--steps` timed ones, whose median is the round's figure for that
setting. Give every setting the same `--warmup`, at least a trial's length (about
25 steps): steps grew slower over a job's life here, so jobs must time the same
steps of their run. The table gives the median over rounds of each setting, and the medians
over rounds of (best Horovod setting of that round / plan) and (best / disco):
above 1 means faster than Horovod's best.

`--testbed netns` runs 2 ranks in the network namespaces of
`benchmarks/testbed.sh up` (1 Gbit/s veth link) instead of loopback, without
horovodrun (which would need ssh): a Horovod rendezvous server in disco_ns0 and one
worker per namespace with the environment horovodrun would give it (see
`_namespace_hosts_files` for the one workaround it needs).

The same file is the worker (`worker` subcommand, run under horovodrun with the
`.venv-horovod` Python); `tests/runtime/test_horovod.py` uses it too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

MODELS = ("bert_encoder", "vgg16", "resnet50", "inception_v3")
DEFAULT_MODELS = ("bert_encoder", "vgg16")
SETTINGS = ("default", "legacy", "none", "plan", "disco", "disco-legacy", "disco-none")
# The measured choice, under each Horovod setting.
MEASURED = ("disco", "disco-legacy", "disco-none")
# The Horovod fusion each setting's job starts with: the plan's buckets and the
# measured choice run under Horovod's default, as a user's job would.
_FUSION_OF = {"legacy": "legacy", "none": "none", "disco-legacy": "legacy", "disco-none": "none"}
# Horovod's own job at the fusion setting each measured job starts with.
_OWN_SETTING = {"disco": "default", "disco-legacy": "legacy", "disco-none": "none"}
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMESPACES = (("disco_ns0", "10.77.0.1", "disco_veth0"), ("disco_ns1", "10.77.0.2", "disco_veth1"))
RENDEZVOUS_PORT = 47293


# -- the worker: runs under Horovod, in .venv-horovod -----------------------------


def build_keras_model(name: str, rank: int, batch: int = 2, seed: int = 0):
    """The tiny zoo model `name` (as `zoo.tf_steps.build_tf_step` builds it, here
    for whichever Keras is installed), this rank's batch and its loss function."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np
    import tensorflow as tf

    from disco_xla.zoo.tf_steps import _APPLICATIONS, _IMAGE_SIDE, _bert_encoder

    keras.utils.set_random_seed(seed)  # the same initial weights on every rank
    rng = np.random.default_rng(seed + 1 + rank)  # each rank its own batch
    if name in _APPLICATIONS:
        side = _IMAGE_SIDE[name][1]
        model = getattr(keras.applications, _APPLICATIONS[name])(
            weights=None, input_shape=(side, side, 3), classes=10, classifier_activation=None
        )
        inputs = rng.standard_normal((batch, side, side, 3)).astype(np.float32)
        classes = 10
    elif name == "bert_encoder":
        model, input_shape, vocab, classes = _bert_encoder("tiny")
        inputs = rng.integers(0, vocab, (batch, *input_shape), dtype=np.int32)
    else:
        raise KeyError(name)
    labels = rng.integers(0, classes, (batch,), dtype=np.int32)
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def loss_fn(x, y):
        return loss_object(y, model(x, training=True))

    return model, tf.constant(inputs), tf.constant(labels), loss_fn


def _worker(args: argparse.Namespace) -> int:
    """One rank of one job: train `args.model` with one setting, time its steps."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from disco_xla.errors import DiscoInputError
    from disco_xla.runtime import horovod as runtime
    from disco_xla.runtime import horovod_trial
    from disco_xla.runtime.horovod_plan import load_plan_buckets, match_variables

    runtime.set_fusion_environment(runtime.FUSION_SETTINGS[_FUSION_OF.get(args.setting, "default")])
    if args.horovod_timeline:
        os.environ["HOROVOD_TIMELINE"] = args.horovod_timeline
    import horovod.tensorflow as hvd
    import numpy as np

    hvd.init()
    rank = hvd.rank()
    model, inputs, labels, loss_fn = build_keras_model(args.model, rank)
    variables = model.trainable_variables
    buckets = None
    if args.setting in ("plan", *MEASURED):
        try:
            gradients = load_plan_buckets(args.plan, args.module)
            buckets = match_variables(gradients, variables, args.plan)
        except DiscoInputError as error:  # refused before the first step
            print(f"error: {error}", file=sys.stderr)
            return 2
    if args.setting in MEASURED:
        candidates = horovod_trial.horovod_candidates(buckets, variables)
        step = horovod_trial.MeasuredHorovodStep(
            loss_fn, variables, candidates, args.learning_rate, rounds=args.trial_rounds
        )
    else:
        step = runtime.HorovodStep(loss_fn, variables, buckets, args.learning_rate)
    # Every job times the same steps of its run: steps here grew slower over a
    # job's life (inception_v3, 2 ranks: medians 324, 360 and 354 ms over steps
    # 2-11, 12-21 and 22-31). The trial's steps count towards --warmup.
    untimed = 0
    while untimed < args.warmup or getattr(step, "chosen", "") is None:
        step(inputs, labels).numpy()
        untimed += 1
    times_s = []
    for index in range(args.steps):
        if rank == args.fail_rank and index == args.fail_after:
            raise RuntimeError(f"rank {rank} fails on purpose before step {index}")
        start = time.perf_counter()
        step(inputs, labels).numpy()
        times_s.append(time.perf_counter() - start)
    if args.save_params:
        path = os.path.join(args.save_params, f"{args.setting}.rank{rank}.npz")
        np.savez(path, *[v.numpy() for v in variables])
    if rank == 0 and args.output:
        result = {
            "model": args.model,
            "setting": args.setting,
            "parameter_bytes": int(sum(v.shape.num_elements() * 4 for v in variables)),
            "gradients": len(variables),
            "plan_buckets": None if buckets is None else [len(b) for b in buckets],
            "step_s": times_s,
            "trial": step.measurements() if args.setting in MEASURED else None,
        }
        with open(args.output, "w") as handle:
            json.dump(result, handle)
    if args.setting in MEASURED and args.verdicts:
        with open(f"{args.verdicts}.rank{rank}.json", "w") as handle:
            json.dump(step.measurements(), handle)
    return 0


# -- the driver: runs in the main environment --------------------------------------


def _run(command: list[str], timeout_s: float) -> None:
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout_s, cwd=REPO_ROOT
    )
    if result.returncode != 0:
        sys.exit(f"{' '.join(command[:3])} failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")


def prepare_plan(
    model: str, directory: str, cluster: str, budget_s: float, ranks: int = 2
) -> tuple[str, str]:
    """Capture `model`'s TF step for `ranks` replicas and optimize it: (module, plan)."""
    disco = os.path.join(os.path.dirname(sys.executable), "disco-xla")
    module = os.path.join(directory, f"{model}.{ranks}.pb")
    plan = os.path.join(directory, f"{model}.{ranks}.plan.json")
    capture = [disco, "capture", "--framework", "tf", "--model", model, "--replicas", str(ranks)]
    _run([*capture, "--batch", str(2 * ranks), "-o", module], 600)
    optimize = [disco, "optimize", module, "--cluster", cluster, "--budget-s", str(budget_s)]
    _run([*optimize, "-o", plan], 900)
    return module, plan


def _worker_arguments(model: str, setting: str, files: dict, args, output: str) -> list[str]:
    arguments = [os.path.abspath(__file__), "worker", "--model", model, "--setting", setting]
    arguments += ["--module", files["module"], "--plan", files["plan"]]
    arguments += ["--steps", str(args.steps), "--warmup", str(args.warmup), "--output", output]
    return arguments


def run_loopback(worker_arguments: list[str], timeout_s: float, ranks: int = 2) -> int:
    from disco_xla.runtime.launch import launch_horovod

    return launch_horovod(worker_arguments[0], worker_arguments[1:], ranks, timeout_s)


def run_netns(worker_arguments: list[str], timeout_s: float) -> int:
    """Both ranks across the testbed's veth link, with a Horovod rendezvous server
    in disco_ns0, started and wired the way horovodrun's gloo launcher does."""
    from disco_xla.runtime.launch import REPO_ROOT as PACKAGE_ROOT
    from disco_xla.runtime.launch import horovod_environment

    python = str(horovod_environment() / "bin" / "python")
    hosts_files = _namespace_hosts_files()
    rendezvous = subprocess.Popen(
        ["ip", "netns", "exec", NAMESPACES[0][0], python, os.path.abspath(__file__)]
        + ["rendezvous"],
        stdout=subprocess.PIPE,
        text=True,
    )
    ranks = []
    try:
        port = int(rendezvous.stdout.readline().strip())
        for rank, (namespace, address, interface) in enumerate(NAMESPACES):
            env = {
                **os.environ,
                "PYTHONPATH": str(PACKAGE_ROOT),
                "PYTHONUNBUFFERED": "1",
                "HOROVOD_GLOO_RENDEZVOUS_ADDR": NAMESPACES[0][1],
                "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
                "HOROVOD_CONTROLLER": "gloo",
                "HOROVOD_CPU_OPERATIONS": "gloo",
                "HOROVOD_GLOO_IFACE": interface,
                "HOROVOD_HOSTNAME": address,
                "HOROVOD_RANK": str(rank),
                "HOROVOD_SIZE": "2",
                "HOROVOD_LOCAL_RANK": "0",
                "HOROVOD_LOCAL_SIZE": "1",
                "HOROVOD_CROSS_RANK": str(rank),
                "HOROVOD_CROSS_SIZE": "2",
            }
            command = ["ip", "netns", "exec", namespace, python, *worker_arguments]
            ranks.append(subprocess.Popen(command, env=env))
        deadline = time.monotonic() + timeout_s
        while any(r.poll() is None for r in ranks):
            failed = [r.returncode for r in ranks if r.poll() not in (None, 0)]
            if failed:
                return failed[0]
            if time.monotonic() > deadline:
                return 124
            time.sleep(0.1)
        return next((r.returncode for r in ranks if r.returncode), 0)
    finally:
        for path in hosts_files:
            os.remove(path)
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(path))
        for process in [*ranks, rendezvous]:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    process.kill()


def _namespace_hosts_files() -> list[str]:
    """Make this machine's hostname resolve to each namespace's own address there.

    Horovod 0.28.1 builds the gloo context of its global process set with an empty
    interface (it does not pass HOROVOD_GLOO_IFACE on), so gloo takes the address
    the hostname resolves to, 127.0.0.1, which the other namespace cannot reach.
    `ip netns exec NS` mounts /etc/netns/NS/hosts over /etc/hosts; the files made
    here are removed after the run. Returns the paths created."""
    import socket

    created = []
    for namespace, address, _ in NAMESPACES:
        path = f"/etc/netns/{namespace}/hosts"
        if os.path.exists(path):
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            handle.write(f"127.0.0.1 localhost\n{address} {socket.gethostname()}\n")
        created.append(path)
    return created


def _rendezvous() -> int:
    """A Horovod gloo rendezvous server for 2 ranks, one per host (namespace)."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousServer

    server = RendezvousServer(verbose=0)
    port = server.start()
    hosts = parse_hosts(f"{NAMESPACES[0][1]}:1,{NAMESPACES[1][1]}:1")
    server.init(get_host_assignments(hosts, 2))
    print(port, flush=True)
    while True:
        time.sleep(3600)


HOROVOD_SETTINGS = ("default", "legacy", "none")


def summarise(model: str, rounds: list[dict]) -> dict:
    """Median over rounds per setting (each round's figure is the median of its
    timed steps), and the medians of per-round ratios: best Horovod setting over
    the plan, and over what the measured choice (`disco`) runs."""
    settings = list(rounds[0])
    medians = {s: statistics.median(r[s] for r in rounds) for s in settings}
    horovod = [s for s in HOROVOD_SETTINGS if s in settings]
    summary = {"model": model, "rounds": len(rounds), "median_step_s": medians}
    if not horovod:  # measured jobs alone: their within-job figures only
        return summary
    best = [min(r[s] for s in horovod) for r in rounds]
    summary["best_horovod"] = min(horovod, key=lambda s: medians[s])
    for ours in ("plan", *MEASURED):
        if ours in settings:
            ratios = [b / r[ours] for b, r in zip(best, rounds, strict=True)]
            summary[f"best_horovod_over_{ours}_paired"] = statistics.median(ratios)
            summary[f"{ours}_rounds_at_least_best"] = sum(ratio >= 1 for ratio in ratios)
    for ours, own in _OWN_SETTING.items():
        if ours in settings and own in settings:  # under the same Horovod setting
            ratios = [r[own] / r[ours] for r in rounds]
            summary[f"{own}_over_{ours}_paired"] = statistics.median(ratios)
    measured = [s for s in MEASURED if s in settings]
    if measured:  # what runs, at the Horovod setting where it is fastest
        ratios = [b / min(r[s] for s in measured) for b, r in zip(best, rounds, strict=True)]
        summary["best_horovod_over_best_disco_paired"] = statistics.median(ratios)
        summary["best_disco_rounds_at_least_best"] = sum(ratio >= 1 for ratio in ratios)
    return summary


def within_job_ratio(trial: dict) -> float:
    """Horovod's own fusion over what a measured job runs, paired inside the
    job: 1 where what runs is Horovod's own (kept by the trial, or sent back
    by the confirmation), else the confirmation rounds' median of Horovod's
    own over the winner's. Those rounds also decided, so the ratio of a
    confirmed winner is above 1 by construction: it is the job's own sample,
    not a third one."""
    confirmation = trial.get("confirmation") or {}
    if not confirmation:
        return 1.0
    ratio = confirmation["reference_s"] / confirmation["candidate_s"]
    return ratio if confirmation["confirmed"] else 1.0


def within_job_ratios(trials: list[dict]) -> dict:
    """For each measured setting: the within-job ratio of every round, and how
    many rounds ran a program other than Horovod's own."""
    found: dict = {}
    for trial in trials:
        setting = trial["setting"]
        found.setdefault(f"{setting}_own_over_ran_within_job", []).append(within_job_ratio(trial))
        key = f"{setting}_rounds_not_horovod"
        found[key] = found.get(key, 0) + (trial["chosen"] != "horovod")
    return found


def _run_job(model: str, setting: str, files: dict, args, directory: str) -> dict:
    """One Horovod job of `setting`; rank 0's result."""
    output = os.path.join(directory, f"{model}.{setting}.result.json")
    arguments = _worker_arguments(model, setting, files, args, output)
    if args.testbed == "netns":
        code = run_netns(arguments, args.timeout_s)
    else:
        code = run_loopback(arguments, args.timeout_s, args.ranks)
    if code != 0:
        sys.exit(f"the Horovod job for {model} ({setting}) failed with exit code {code}")
    with open(output) as handle:
        return json.load(handle)


def _measure(model: str, files: dict, args, directory: str) -> dict:
    """Paired, rotating rounds: one Horovod job per setting per round."""
    rounds, chosen, trials = [], [], []
    details: dict = {}
    settings = args.setting or list(SETTINGS)
    for round_index in range(args.rounds):
        shift = round_index % len(settings)
        figures = {}
        for setting in settings[shift:] + settings[:shift]:
            result = _run_job(model, setting, files, args, directory)
            figures[setting] = statistics.median(result["step_s"])
            details["parameter_bytes"] = result["parameter_bytes"]
            details["gradients"] = result["gradients"]
            if setting in ("plan", *MEASURED):
                details["plan_buckets"] = result["plan_buckets"]
            if setting in MEASURED:
                chosen.append(f"{setting}:{result['trial']['chosen']}")
                trials.append({"setting": setting, **result["trial"]})
                print(f"{model} {setting} trial: {json.dumps(result['trial'])}", file=sys.stderr)
        rounds.append(figures)
        print(
            f"{model} round {round_index}: "
            + ", ".join(f"{s} {figures[s] * 1e3:.2f} ms" for s in settings)
            + (f" (disco ran {chosen[-1]})" if chosen else ""),
            file=sys.stderr,
        )
    return {
        **summarise(model, rounds),
        **within_job_ratios(trials),
        "parameter_bytes": details["parameter_bytes"],
        "gradients": details["gradients"],
        "plan_buckets": details.get("plan_buckets"),
        "disco_chose": chosen,
        "disco_trials": trials,
        "per_round_s": rounds,
    }


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "rendezvous":
        return _rendezvous()
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        parser = argparse.ArgumentParser(prog="horovod_vs_plan.py worker")
        parser.add_argument("--model", required=True)
        parser.add_argument("--setting", choices=SETTINGS, required=True)
        parser.add_argument("--plan", help="PLAN.json from `disco-xla optimize`")
        parser.add_argument("--module", help="the captured module the plan is for")
        parser.add_argument("--steps", type=int, default=5)
        parser.add_argument(
            "--warmup", type=int, default=2, help="untimed steps first (a trial's count)"
        )
        parser.add_argument("--learning-rate", type=float, default=0.01)
        parser.add_argument("--save-params", help="directory for SETTING.rankR.npz")
        parser.add_argument("--horovod-timeline", help="write Horovod's timeline here")
        parser.add_argument("--fail-rank", type=int, default=-1, help="this rank fails")
        parser.add_argument("--fail-after", type=int, default=0, help="steps before failing")
        parser.add_argument("--output", help="rank 0 writes its step times here (JSON)")
        parser.add_argument("--trial-rounds", type=int, default=5, help="disco: timed rounds")
        parser.add_argument("--verdicts", help="disco: each rank writes PREFIX.rankR.json")
        return _worker(parser.parse_args(sys.argv[2:]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", choices=MODELS)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per job")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--testbed", choices=["loopback", "netns"], default="loopback")
    parser.add_argument("--ranks", type=int, default=2, help="Horovod ranks (loopback)")
    parser.add_argument(
        "--setting", action="append", choices=SETTINGS, help="run only these (default all)"
    )
    parser.add_argument("--cluster", default="horovod-local", help="profile the plan is made for")
    parser.add_argument("--budget-s", type=float, default=30.0, help="search budget per model")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per Horovod job")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    summaries = []
    with tempfile.TemporaryDirectory() as directory:
        for model in args.model or DEFAULT_MODELS:
            module, plan = prepare_plan(model, directory, args.cluster, args.budget_s, args.ranks)
            files = {"module": module, "plan": plan}
            summaries.append({"testbed": args.testbed, **_measure(model, files, args, directory)})
    load_after = os.getloadavg()[0]
    if args.json:
        print(json.dumps({"load_average_1min": [load_before, load_after], "models": summaries}))
        return 0
    ranks = 2 if args.testbed == "netns" else args.ranks
    print(
        f"{args.testbed}, {ranks} Horovod ranks (gloo), {args.rounds} paired rotating rounds, "
        f"median of {args.steps} steps per job; plans for {args.cluster}"
    )
    settings = args.setting or list(SETTINGS)
    header = f"{'model':<14}{'buckets':>8}" + "".join(f"{s:>14}" for s in settings)
    ours = [s for s in ("plan", *MEASURED) if s in settings]
    ours += ["best_disco"] if any(s in settings for s in MEASURED) else []
    if not any(s in settings for s in HOROVOD_SETTINGS):
        ours = []  # no Horovod-only job to compare across jobs with
    print(header + "".join(f"{'best/' + s:>20}" for s in ours) + "  (median step, ms)")
    for summary in summaries:
        medians = summary["median_step_s"]
        cells = "".join(f"{medians[s] * 1e3:>14.2f}" for s in settings)
        buckets = len(summary["plan_buckets"])
        ratios = "".join(f"{summary[f'best_horovod_over_{s}_paired']:>19.3f}x" for s in ours)
        ran = ",".join(sorted(set(summary["disco_chose"])))
        within = "".join(
            f"; {s} own/ran in the job {statistics.median(summary[key]):.3f}"
            for s in MEASURED
            if (key := f"{s}_own_over_ran_within_job") in summary
        )
        print(
            f"{summary['model']:<14}{buckets:>8}{cells}{ratios}"
            f"  (best Horovod: {summary.get('best_horovod', '-')}"
            + (f"; disco ran {ran}" if ran else "")
            + within
            + ")"
        )
    print(f"load average (1 min) before / after: {load_before:.2f} / {load_after:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
