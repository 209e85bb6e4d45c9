"""Every planning verb on the hand-written production corpus
(`tests/data/hlo_corpus/`), as `tests/test_corpus.py` runs them: per module, each
verb's outcome (ok, `unsupported: ...`, or an internal error), where XLA's
fusion came from, and the found plan's simulated time against `xla-overlap`.

    .venv/bin/python benchmarks/corpus_verbs.py [--cluster NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "data" / "hlo_corpus"
COMMAND = os.path.join(os.path.dirname(sys.executable), "disco-xla")


def run(*args: str) -> tuple[str, dict | None]:
    """A verb's outcome in a word or a line, and its last JSON object."""
    result = subprocess.run([COMMAND, *args], capture_output=True, text=True, timeout=600)
    if "internal error" in result.stderr:
        return "INTERNAL ERROR", None
    if result.returncode != 0:
        return result.stderr.strip().splitlines()[-1][:80], None
    objects = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return "ok", (objects[-1] if objects else None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default="h200-8x8-ib400")
    args = parser.parse_args()
    search = ("--max-evals", "200", "--budget-s", "10")
    print(
        "| module | inspect | simulate none/xla/xla-overlap | optimize -o MODULE | apply | "
        "fusion from | found vs xla-overlap |"
    )
    print("| --- | --- | --- | --- | --- | --- | ---: |")
    with tempfile.TemporaryDirectory() as scratch:
        for path in sorted(CORPUS.glob("*.hlo.txt")):
            name, file = path.name.split(".")[0], str(path)
            inspected, _ = run("inspect", file, "--json")
            plans = ("--plan", "none", "--plan", "xla", "--plan", "xla-overlap")
            simulated, _ = run("simulate", file, "--cluster", args.cluster, *plans, "--json")
            written = os.path.join(scratch, f"{name}.hlo.txt")
            optimize = ("optimize", file, "--cluster", args.cluster, *search, "--no-check")
            optimized, report = run(*optimize, "-o", written, "--json")
            applied = "not run"
            if report is not None:
                again = os.path.join(scratch, f"{name}.applied.hlo.pb")
                applied, _ = run("apply", file, written + ".plan.json", "-o", again, "--no-check")
            source, ratio = "", ""
            if report is not None:
                rows = report["rows"]
                source = report["fusion_source"]
                overlap_s, found_s = (
                    rows["xla-overlap"]["iteration_s"],
                    rows["found"]["iteration_s"],
                )
                ratio = f"{overlap_s / found_s:.3f}x"
            print(
                f"| {name} | {inspected} | {simulated} | {optimized} | {applied} | {source} | "
                f"{ratio} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
