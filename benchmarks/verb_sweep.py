"""Every CLI verb on every module the zoo makes: each JAX model in each form
(pmap, jit over shard_map, jit over sharded arguments captured after XLA's
partitioner), each transformer's bf16 variant, the Llama-style model, and each
TF model, as a user would run them: `capture`, `inspect`, `simulate` with three
baselines (SIMULATED), `optimize`, `apply` of the found plan, and `verify` of the result.

Each command must succeed, or stop with exit code 2 and one line (`unsupported:`
or another reason): a traceback or another exit code is an internal error. It
prints one row per module and verb, and a table of the outcomes.

    .venv/bin/python benchmarks/verb_sweep.py [--models resnet50 ...] [--forms pmap sharded]
        [--frameworks jax tf] [--devices 4] [--max-evals 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
FORMS = ("pmap", "shard_map", "sharded", "bf16")
VERBS = ("capture", "inspect", "simulate", "optimize", "apply", "verify")
# The plans `simulate` runs on each module: on the captured module, on the
# module XLA compiled, and the FSDP-style one (the tests run every baseline on
# the Llama-style model and the sharded steps).
SIMULATED = ("none", "xla", "fsdp")


def _cli(*args: str, timeout_s: float = 900) -> tuple[str, float, str]:
    """(outcome, seconds, last line of stderr): 'ok', 'refused' (exit 2 in one
    line) or 'internal error'."""
    command = os.path.join(os.path.dirname(sys.executable), "disco-xla")
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [command, *args], capture_output=True, text=True, timeout=timeout_s, cwd=REPO_ROOT
        )
    except subprocess.TimeoutExpired:
        return "internal error", time.perf_counter() - start, "timed out"
    seconds = time.perf_counter() - start
    lines = done.stderr.strip().splitlines()
    last = lines[-1] if lines else ""
    if done.returncode == 0:
        return "ok", seconds, ""
    if done.returncode == 2 and len(lines) == 1:
        return "refused", seconds, last
    return "internal error", seconds, last[-300:]


def modules(
    models: list[str], forms: list[str], frameworks: list[str]
) -> list[tuple[str, list[str]]]:
    """(label, capture arguments) of each module to sweep."""
    from disco_xla.zoo import ZOO
    from disco_xla.zoo.jax_steps import BF16_MODELS, JAX_MODELS

    found = []
    for name in models:
        if name in JAX_MODELS and "jax" in frameworks:
            for form in forms:
                if form == "bf16":
                    if name in BF16_MODELS:
                        found.append((f"{name} bf16", ["--model", name, "--precision", "bf16"]))
                else:
                    found.append((f"{name} {form}", ["--model", name, "--mode", form]))
        elif name == "llama" and "jax" in frameworks:
            found.append(("llama sharded", ["--model", "llama", "--mode", "sharded"]))
        if "tf" in frameworks and any(e.name == name and e.framework == "tf" for e in ZOO):
            found.append((f"tf {name}", ["--model", name, "--framework", "tf"]))
    return found


def sweep(label: str, capture: list[str], devices: int, max_evals: int, directory: str) -> dict:
    path = os.path.join(directory, label.replace(" ", "_") + ".hlo.pb")
    out = path.replace(".hlo.pb", ".opt.hlo.pb")
    applied = path.replace(".hlo.pb", ".applied.hlo.pb")
    row: dict = {"module": label}
    steps = [
        ("capture", ["capture", *capture, "--replicas", str(devices), "-o", path, "--json"]),
        ("inspect", ["inspect", path, "--json"]),
    ]
    for verb, args in steps:
        row[verb] = _cli(*args)
        if row[verb][0] != "ok":
            return row
    outcomes = []
    for baseline in SIMULATED:
        outcomes.append(_cli("simulate", path, "--cluster", "cpu-local", "--plan", baseline))
    worst = next((o for o in outcomes if o[0] != "ok"), outcomes[0])
    row["simulate"] = (worst[0], sum(o[1] for o in outcomes), worst[2])
    row["optimize"] = _cli(
        "optimize", path, "--cluster", "cpu-local", "--max-evals", str(max_evals), "-o", out
    )
    if row["optimize"][0] == "ok":
        row["apply"] = _cli("apply", path, out + ".plan.json", "-o", applied)
        row["verify"] = _cli("verify", path, out, "--devices", str(devices), "--json")
    return row


def main() -> int:
    from disco_xla.zoo import ZOO

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = list(dict.fromkeys(e.name for e in ZOO))
    parser.add_argument("--models", nargs="+", default=names)
    parser.add_argument("--forms", nargs="+", choices=FORMS, default=list(FORMS))
    parser.add_argument("--frameworks", nargs="+", choices=["jax", "tf"], default=["jax", "tf"])
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--max-evals", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        for label, capture in modules(args.models, args.forms, args.frameworks):
            row = sweep(label, capture, args.devices, args.max_evals, directory)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("| module | " + " | ".join(VERBS) + " |")
    print("| --- |" + " --- |" * len(VERBS))
    for row in rows:
        cells = []
        for verb in VERBS:
            outcome = row.get(verb)
            cells.append("-" if outcome is None else f"{outcome[0]} ({outcome[1]:.0f} s)")
        print(f"| {row['module']} | " + " | ".join(cells) + " |")
    errors = [
        (row["module"], verb, row[verb][2])
        for row in rows
        for verb in VERBS
        if verb in row and row[verb][0] != "ok"
    ]
    for module, verb, line in errors:
        print(f"- {module} {verb}: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
