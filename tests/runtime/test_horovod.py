"""The Horovod runtime: a plan made by `disco-xla optimize` on the captured Keras
step (TF 2.21, this environment) drives 2 Horovod ranks (`.venv-horovod`, TF 2.12,
gloo) through `benchmarks/horovod_vs_plan.py worker`.

The 2-rank tests need `.venv-horovod`; `make test` creates it, and they are
skipped only where it is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import pytest
import yaml

from disco_xla.errors import DiscoInputError
from disco_xla.hlo.hlo_io import load_module
from disco_xla.plan import Plan
from disco_xla.runtime import horovod_plan as runtime
from disco_xla.runtime.horovod import bucket_scale, fusion_buckets
from disco_xla.runtime.horovod_trial import _MIN_GAIN, rounds_to_win
from disco_xla.runtime.launch import launch_horovod
from disco_xla.simulator.profiles import load_profile
from tests.conftest import REPO_ROOT, run_cli, simulate_plans

HOROVOD_VENV = os.path.join(REPO_ROOT, ".venv-horovod")
WORKER = os.path.join(REPO_ROOT, "benchmarks", "horovod_vs_plan.py")
needs_horovod = pytest.mark.skipif(
    not os.path.isfile(os.path.join(HOROVOD_VENV, "bin", "horovodrun")),
    reason=".venv-horovod is missing (`make .venv-horovod/.installed` creates it)",
)
STEPS = 3


@pytest.fixture(scope="module")
def bert_plan(tmp_path_factory) -> dict[str, str]:
    """The tiny bert_encoder's TF step captured for 2 replicas, and its plan for
    `cpu-local`, which buckets its gradients in several buckets (XLA:CPU's
    in-step all-reduces are what that profile prices)."""
    directory = tmp_path_factory.mktemp("horovod")
    module = str(directory / "bert_encoder.pb")
    captured = run_cli("capture", "--framework", "tf", "--model", "bert_encoder", "-o", module)
    assert captured.returncode == 0, captured.stderr
    return {"module": module, "plan": _optimized(module, "cpu-local", directory / "plan.json")}


def _optimized(module: str, cluster: str, plan) -> str:
    optimized = run_cli(
        "optimize", module, "--cluster", cluster, "--budget-s", "5", "--max-evals", "50",
        "-o", str(plan),
    )  # fmt: skip
    assert optimized.returncode == 0, optimized.stderr
    return str(plan)


def _keras3_bert_variables():
    """The Keras 3 (this environment's) variables of the tiny bert_encoder."""
    import keras

    from disco_xla.zoo.tf_steps import _bert_encoder

    keras.utils.set_random_seed(0)
    model, *_ = _bert_encoder("tiny")
    return model.trainable_variables


_PRINT_VARIABLE_NAMES = (
    "import json; from disco_xla.zoo.tf_steps import build_tf_step; "
    "print(json.dumps(build_tf_step('bert_encoder').variable_names))"
)


def test_plan_buckets_map_to_the_variables_recorded_at_capture(bert_plan):
    plan = Plan.from_json(open(bert_plan["plan"]).read())
    buckets = runtime.plan_gradient_buckets(plan, load_module(bert_plan["module"]))
    assert [{g.all_reduce for g in b} for b in buckets] == [set(b) for b in plan.all_reduce_buckets]
    # Keras numbers layer names per process ('embedding_1' once another model was
    # built), so the names to compare with come from a fresh process, as the capture's.
    fresh = subprocess.run(
        [sys.executable, "-c", _PRINT_VARIABLE_NAMES], capture_output=True, text=True, timeout=300
    )
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    names = json.loads(fresh.stdout.strip().splitlines()[-1])
    gradients = sorted(sum(buckets, []), key=lambda g: g.index)
    assert [g.index for g in gradients] == list(range(len(names)))
    assert [g.name for g in gradients] == names
    variables = _keras3_bert_variables()
    positions = runtime.match_variables(buckets, variables)
    assert positions == [[g.index for g in b] for b in buckets]
    for gradient in gradients:
        assert gradient.elements == int(np.prod(variables[gradient.index].shape))


def test_a_plan_for_other_variables_is_refused_with_the_names_that_differ(bert_plan):
    buckets = runtime.load_plan_buckets(bert_plan["plan"], bert_plan["module"])
    variables = _keras3_bert_variables()
    with pytest.raises(DiscoInputError) as missing:
        runtime.match_variables(buckets, variables[:-1], "plan.json")
    message = str(missing.value)
    assert "\n" not in message and message.startswith("plan.json: ")
    assert f"{len(variables)} gradients do not match the model's {len(variables) - 1}" in message
    last = max((g for b in buckets for g in b), key=lambda g: g.index)
    assert f"#{last.index} plan {last.name} {list(last.shape)} / model none" in message
    swapped = [variables[1], variables[0], *variables[2:]]
    with pytest.raises(DiscoInputError, match="#0 plan embedding/embeddings .* / model "):
        runtime.match_variables(buckets, swapped)


def test_bucket_scales_keep_82_buckets_apart_and_scale_back_exactly():
    scales = [bucket_scale(k) for k in range(82)]
    assert len(set(scales)) == 82 and bucket_scale(82) == scales[0]
    values = np.random.default_rng(0).standard_normal(10_000).astype(np.float32) * 1e3
    values = np.concatenate([values, np.float32([1e-30, 3e26, -7.5e-20])])
    for scale in scales:
        # Horovod scales in the tensor's type; the average of 2 ranks is (a+b)/2.
        pre = np.float32(scale)
        post = np.float32(1.0 / scale / 2)
        summed = values * pre + values[::-1] * pre
        assert np.array_equal(summed * post, (values + values[::-1]) * np.float32(0.5))


def test_fusion_buckets_fill_the_threshold_in_order():
    assert fusion_buckets([40, 30, 50, 10, 200, 5], 100) == [[0, 1], [2, 3], [4], [5]]
    assert fusion_buckets([1, 2, 3], 0) == [[0], [1], [2]]


def test_candidates_leave_out_a_bucketing_listed_before():
    import tensorflow as tf

    from disco_xla.runtime.horovod import Candidate
    from disco_xla.runtime.horovod_trial import horovod_candidates

    variables = [tf.Variable(tf.zeros([1024])) for _ in range(3)]  # 4 KB each
    candidates = horovod_candidates([[0, 1, 2]], variables)
    # Under 64 MB the legacy setting's buckets are one bucket: the plan's here.
    assert candidates == {
        "horovod": Candidate(),
        "horovod-legacy": Candidate(((0, 1, 2),)),
        "plan-packed": Candidate(((0, 1, 2),), packed=True),
    }
    assert list(horovod_candidates([[2], [0, 1]], variables)) == [
        "horovod", "horovod-legacy", "plan", "plan-packed",
    ]  # fmt: skip


def _timeline_all_reduces(path: str) -> Counter:
    """Tensor name -> number of ALLREDUCE activities in a Horovod timeline."""
    with open(path) as handle:
        events = json.load(handle)
    names = {e["pid"]: e["args"].get("name", "") for e in events if e.get("name") == "process_name"}
    return Counter(
        names[e["pid"]] for e in events if e.get("ph") == "B" and e.get("name") == "ALLREDUCE"
    )


def _responses(path: str, gap_us: int = 50) -> list[set[str]]:
    """The tensors of each response Horovod sent, from a timeline: a response's
    tensors start their GLOO_ALLREDUCE within microseconds of each other (0-2 us
    here), and the next response starts once it is done (over 700 us later)."""
    with open(path) as handle:
        events = json.load(handle)
    names = {e["pid"]: e["args"].get("name", "") for e in events if e.get("name") == "process_name"}
    starts = sorted(
        (e["ts"], names[e["pid"]])
        for e in events
        if e.get("ph") == "B" and e.get("name") == "GLOO_ALLREDUCE"
    )
    responses: list[set[str]] = []
    last = None
    for ts, name in starts:
        if last is None or ts - last > gap_us:
            responses.append(set())
        responses[-1].add(name)
        last = ts
    return responses


def _memcpy_into_fusion_buffer(path: str) -> int:
    with open(path) as handle:
        return sum(e.get("name") == "MEMCPY_IN_FUSION_BUFFER" for e in json.load(handle))


def _worker(setting: str, files: dict, directory, *extra: str) -> list[str]:
    arguments = ["worker", "--model", "bert_encoder", "--setting", setting]
    arguments += ["--module", files["module"], "--plan", files["plan"], "--steps", str(STEPS)]
    arguments += ["--warmup", "0", "--save-params", str(directory), *extra]
    return arguments


@needs_horovod
def test_two_ranks_under_the_plan_train_like_horovod_fusion_one_response_per_bucket(
    bert_plan, tmp_path
):
    plan = Plan.from_json(open(bert_plan["plan"]).read())
    timelines = {s: str(tmp_path / f"{s}.timeline.json") for s in ("plan", "default")}
    # The plan's run goes through the CLI, as a user would start it.
    launched = run_cli(
        "launch", "--engine", "horovod", "-n", "2", "--timeout-s", "240", WORKER,
        *_worker("plan", bert_plan, tmp_path, "--horovod-timeline", timelines["plan"]),
        timeout_s=300,
    )  # fmt: skip
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]
    default = _worker("default", bert_plan, tmp_path, "--horovod-timeline", timelines["default"])
    assert launch_horovod(WORKER, default, 2, timeout_s=240) == 0

    params = {
        (setting, rank): np.load(tmp_path / f"{setting}.rank{rank}.npz")
        for setting in ("plan", "default")
        for rank in (0, 1)
    }
    variables = _keras3_bert_variables()
    first = params["plan", 0]
    assert len(first.files) == len(variables)
    for name in first.files:
        assert np.array_equal(first[name], params["plan", 1][name])
        assert np.array_equal(params["default", 0][name], params["default", 1][name])
        np.testing.assert_allclose(first[name], params["default", 0][name], rtol=0, atol=1e-6)

    # Each gradient is all-reduced once a step, and each bucket is one response:
    # Horovod fuses a bucket's gradients and never two buckets, though its fusion
    # is on (128 MB) and every bucket reaches it in the same cycle.
    buckets = plan.all_reduce_buckets
    assert len(buckets) >= 2
    per_tensor = _timeline_all_reduces(timelines["plan"])
    assert len(per_tensor) == len(variables) and set(per_tensor.values()) == {STEPS}
    assert all("disco" in name.split("/") for name in per_tensor)  # the step's own keys
    responses = _responses(timelines["plan"])
    assert len(responses) == len(buckets) * STEPS
    assert sorted(len(r) for r in responses) == sorted(len(b) for b in buckets) * STEPS
    for response in responses:  # one grouped op ('..._3of20') per response
        assert "HorovodGroupedAllreduce" in next(iter(response))
        assert len({name.rsplit("_", 1)[0] for name in response}) == 1
    # Under Horovod's own fusion every gradient is a tensor of its own, fused by it.
    per_gradient = _timeline_all_reduces(timelines["default"])
    assert len(per_gradient) == len(variables)
    assert _memcpy_into_fusion_buffer(timelines["default"]) > 0


@needs_horovod
def test_a_plan_for_another_model_is_refused_before_the_first_step(bert_plan, tmp_path):
    arguments = _worker("plan", bert_plan, tmp_path, "--output", str(tmp_path / "out.json"))
    arguments[arguments.index("bert_encoder")] = "vgg16"
    result = run_cli(
        "launch", "--engine", "horovod", "-n", "2", WORKER, *arguments, timeout_s=240
    )  # fmt: skip
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "gradients do not match the model's" in output
    assert "plan embedding/embeddings [128, 32] / model block1_conv1/kernel:0" in output
    assert not (tmp_path / "out.json").exists()
    assert not list(tmp_path.glob("*.npz"))


@needs_horovod
def test_a_failing_rank_stops_the_other_within_a_bounded_time(bert_plan, tmp_path):
    arguments = _worker("plan", bert_plan, tmp_path, "--fail-rank", "1", "--fail-after", "1")
    arguments += ["--steps", "50"]
    bound_s = 120.0
    started = time.monotonic()
    code = launch_horovod(WORKER, arguments, 2, timeout_s=bound_s)
    took_s = time.monotonic() - started
    print(f"failing job ended with code {code} after {took_s:.1f} s")
    assert code not in (0, 124)  # horovodrun ended the job itself, before the bound
    assert not list(tmp_path.glob("*.npz"))  # rank 0 never finished its steps


def test_launch_engine_horovod_without_its_environment_is_a_one_line_error(tmp_path):
    script = tmp_path / "noop.py"
    script.write_text("print('ran')\n")
    environment = {**os.environ, "DISCO_XLA_HOROVOD_VENV": str(tmp_path / "missing")}
    result = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "disco-xla"), "launch", "--engine",
         "horovod", "-n", "2", str(script)],
        capture_output=True, text=True, timeout=60, env=environment, cwd=REPO_ROOT,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "make .venv-horovod/.installed" in result.stderr
    assert "ran" not in result.stdout


@needs_horovod
def test_calibrated_horovod_profile_loads_and_the_measured_choice_agrees_on_every_rank(
    bert_plan, tmp_path
):
    # 1. The profile of Horovod's collectives, through the CLI.
    profile_path = tmp_path / "horovod.yaml"
    calibrated = run_cli(
        "calibrate", "--engine", "horovod", "--processes", "2", "--max-bytes", "65536",
        "--repeats", "2", "--json", "-o", str(profile_path), timeout_s=600,
    )  # fmt: skip
    assert calibrated.returncode == 0, calibrated.stdout[-2000:] + calibrated.stderr[-2000:]
    report = json.loads(calibrated.stdout.strip().splitlines()[-1])
    assert report["engine"] == "horovod" and report["workers"] == 2
    assert [p["bytes"] for p in report["points"]] == [4096, 16384, 65536]
    profile = load_profile(str(profile_path))
    assert not profile.overlap and profile.collectives_after_compute
    assert profile.all_reduce_points == tuple(
        (p["bytes"], p["measured_s"]) for p in report["points"]
    )
    assert profile.step_overhead_s == pytest.approx(report["step_once_s"])
    assert profile.tuple_all_reduce_element_s == pytest.approx(report["tensor_in_response_s"])
    assert yaml.safe_load(profile_path.read_text())["calibration"]["engine"] == "horovod"

    # 2. The search prices buckets with it: its plan is no slower than Horovod's
    # own fusion there, which sees every gradient in one cycle.
    simulated = simulate_plans(bert_plan["module"], str(profile_path), ["horovod"])
    assert "every gradient in one cycle" in simulated["horovod"]["plan_note"]
    plan = _optimized(bert_plan["module"], str(profile_path), tmp_path / "horovod.plan.json")
    files = {"module": bert_plan["module"], "plan": plan}

    # 3. The runtime's measured choice, started as a user starts a Horovod job.
    verdicts = tmp_path / "verdict"
    timeline = str(tmp_path / "disco.timeline.json")
    arguments = _worker(
        "disco", files, tmp_path, "--verdicts", str(verdicts), "--horovod-timeline", timeline
    )
    launched = run_cli(
        "launch", "--engine", "horovod", "-n", "2", "--timeout-s", "300", WORKER,
        *arguments, "--trial-rounds", "2", timeout_s=360,
    )  # fmt: skip
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"verdict.rank{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0] == ranks[1]  # one verdict, from the same averaged times
    verdict = ranks[0]
    measured = verdict["measured_s"]
    assert "horovod" in measured  # Horovod's own fusion always takes part
    # The plan's buckets grouped are the legacy setting's where they are the same.
    ran = set(measured) | set(verdict["dropped"])
    assert ran >= {"horovod", "horovod-legacy", "plan-packed"}
    assert not set(measured) & set(verdict["dropped"])
    # Only a candidate faster in every round, by a clear median, replaces it.
    assert set(verdict["faster_rounds"]) == set(measured) - {"horovod"}
    clearly_faster = [
        name
        for name, rounds in verdict["faster_rounds"].items()
        if rounds >= rounds_to_win(verdict["rounds"])
        and measured[name] <= (1 - _MIN_GAIN) * measured["horovod"]
    ]
    winner = min(clearly_faster, key=measured.get, default="horovod")
    _check_confirmation(verdict, winner)
    # Each candidate's collectives have keys of their own in Horovod's cache.
    scopes = {part for name in _timeline_all_reduces(timeline) for part in name.split("/")}
    assert scopes >= set(measured) | {"horovod-legacy", "plan-packed"}

    # Every call of the trial was a training step that computes Horovod's own:
    # as many steps of Horovod's own fusion give the same parameters.
    default = _worker("default", files, tmp_path)
    default[default.index("--steps") + 1] = str(verdict["calls"])
    assert launch_horovod(WORKER, default, 2, timeout_s=240) == 0
    for rank in (0, 1):
        chosen, own = (np.load(tmp_path / f"{s}.rank{rank}.npz") for s in ("disco", "default"))
        for name in own.files:
            np.testing.assert_allclose(chosen[name], own[name], rtol=0, atol=1e-6)


def _check_confirmation(verdict: dict, winner: str) -> None:
    """What runs after the trial's `winner`: Horovod's own where it won, else
    the winner only if its confirmation rounds were faster too."""
    confirmation = verdict["confirmation"]
    if winner == "horovod":
        assert confirmation == {} and verdict["chosen"] == "horovod"
        return
    assert confirmation["candidate"] == winner and confirmation["rounds"] == 3
    kept = confirmation["faster_rounds"] == confirmation["rounds"]
    assert confirmation["confirmed"] == kept
    if kept:  # faster in every round: its median is lower too
        assert confirmation["candidate_s"] < confirmation["reference_s"]
    assert verdict["chosen"] == (winner if kept else "horovod")


@needs_horovod
def test_a_clear_winner_is_confirmed_in_paired_rounds_before_it_runs(bert_plan, tmp_path):
    # Started with Horovod's fusion off, its own is one response per gradient:
    # the plan's packed buckets beat it in every round.
    verdicts = tmp_path / "verdict"
    arguments = _worker("disco-none", bert_plan, tmp_path, "--verdicts", str(verdicts))
    launched = run_cli(
        "launch", "--engine", "horovod", "-n", "2", "--timeout-s", "300", WORKER,
        *arguments, "--trial-rounds", "2", timeout_s=360,
    )  # fmt: skip
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"verdict.rank{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0] == ranks[1]  # the ranks agree on the confirmation too
    verdict = ranks[0]
    measured = verdict["measured_s"]
    winner = min(
        (n for n, r in verdict["faster_rounds"].items() if r >= rounds_to_win(verdict["rounds"])),
        key=measured.get,
    )
    assert winner != "horovod" and measured[winner] <= (1 - _MIN_GAIN) * measured["horovod"]
    _check_confirmation(verdict, winner)
    assert "confirmation:" in launched.stderr
    # The confirmation's calls were training steps too: the parameters are
    # Horovod's own after as many steps.
    own = _worker("none", bert_plan, tmp_path)
    own[own.index("--steps") + 1] = str(verdict["calls"])
    assert launch_horovod(WORKER, own, 2, timeout_s=240) == 0
    for rank in (0, 1):
        chosen, reference = (
            np.load(tmp_path / f"{s}.rank{rank}.npz") for s in ("disco-none", "none")
        )
        for name in reference.files:
            np.testing.assert_allclose(chosen[name], reference[name], rtol=0, atol=1e-6)
