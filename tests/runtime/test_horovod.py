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

from disco_xla.errors import DiscoInputError
from disco_xla.hlo.hlo_io import load_module
from disco_xla.plan import Plan
from disco_xla.runtime import horovod as runtime
from disco_xla.runtime.launch import launch_horovod
from tests.conftest import REPO_ROOT, run_cli

HOROVOD_VENV = os.path.join(REPO_ROOT, ".venv-horovod")
WORKER = os.path.join(REPO_ROOT, "benchmarks", "horovod_vs_plan.py")
needs_horovod = pytest.mark.skipif(
    not os.path.isfile(os.path.join(HOROVOD_VENV, "bin", "horovodrun")),
    reason=".venv-horovod is missing (`make .venv-horovod/.installed` creates it)",
)
STEPS = 3


@pytest.fixture(scope="module")
def bert_plan(tmp_path_factory) -> dict[str, str]:
    """The tiny bert_encoder's TF step captured for 2 replicas, and its plan."""
    directory = tmp_path_factory.mktemp("horovod")
    module = str(directory / "bert_encoder.pb")
    plan = str(directory / "bert_encoder.plan.json")
    captured = run_cli("capture", "--framework", "tf", "--model", "bert_encoder", "-o", module)
    assert captured.returncode == 0, captured.stderr
    optimized = run_cli(
        "optimize", module, "--cluster", "cpu-local", "--budget-s", "5", "--max-evals", "50",
        "-o", plan,
    )  # fmt: skip
    assert optimized.returncode == 0, optimized.stderr
    return {"module": module, "plan": plan}


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


def _timeline_all_reduces(path: str) -> Counter:
    """Tensor name -> number of ALLREDUCE activities in a Horovod timeline."""
    with open(path) as handle:
        events = json.load(handle)
    names = {e["pid"]: e["args"].get("name", "") for e in events if e.get("name") == "process_name"}
    return Counter(
        names[e["pid"]] for e in events if e.get("ph") == "B" and e.get("name") == "ALLREDUCE"
    )


def _memcpy_into_fusion_buffer(path: str) -> int:
    with open(path) as handle:
        return sum(e.get("name") == "MEMCPY_IN_FUSION_BUFFER" for e in json.load(handle))


def _worker(setting: str, files: dict, directory, *extra: str) -> list[str]:
    arguments = ["worker", "--model", "bert_encoder", "--setting", setting]
    arguments += ["--module", files["module"], "--plan", files["plan"], "--steps", str(STEPS)]
    arguments += ["--warmup", "0", "--save-params", str(directory), *extra]
    return arguments


@needs_horovod
def test_two_ranks_under_the_plan_train_like_horovod_fusion_one_all_reduce_per_bucket(
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

    per_bucket = _timeline_all_reduces(timelines["plan"])
    assert len(per_bucket) == len(plan.all_reduce_buckets)
    assert set(per_bucket.values()) == {STEPS}
    assert all(name.startswith("HorovodGroupedAllreduce") for name in per_bucket)
    assert _memcpy_into_fusion_buffer(timelines["plan"]) == 0
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
