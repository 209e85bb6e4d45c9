"""What the `zz_disco_xla_hook.pth` start-up hook costs an interpreter that does not
use it (DISCO_XLA_FLAGS unset).

Python runs every `.pth` file of site-packages at start-up, so the hook's line runs in
every interpreter of the environment it is installed in. With the variable unset it
reads `os.environ` and imports nothing. This starts `python -c pass` PAIRS times with
the hook's file in site-packages and PAIRS times with it renamed away (to `.pth.off`,
which site does not read), in one venv, alternating A-B then B-A so that a drift in the
machine's speed falls on both sides alike. It prints each side's median and
interquartile range, the difference of the medians and the median of the paired
differences, in ms, and whether the two sides imported the same modules at start-up.

By default the venv is a fresh one (`python -m venv --without-pip`) whose
site-packages holds only the repository's hook file. `--venv DIR` times an existing
venv where disco-xla is installed (as `pip install` of the wheel leaves it): its hook
is renamed for the runs without it and put back at the end.

    .venv/bin/python benchmarks/hook_startup.py [--pairs 300] [--venv DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
HOOK_NAME = "zz_disco_xla_hook.pth"
ENVIRONMENT_VARIABLE = "DISCO_XLA_FLAGS"


def child_environment() -> dict[str, str]:
    """This process's environment without the hook's variable and without anything
    that would put other code on the child's path."""
    environment = dict(os.environ)
    for name in (ENVIRONMENT_VARIABLE, "PYTHONPATH", "PYTHONSTARTUP", "VIRTUAL_ENV"):
        environment.pop(name, None)
    return environment


def site_packages(python: Path) -> Path:
    """The purelib site-packages folder of the interpreter `python`."""
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    result = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return Path(result.stdout.strip())


def start_up_s(python: Path, environment: dict[str, str]) -> float:
    """Wall time of one `python -c pass`, start to exit, seconds."""
    start = time.perf_counter()
    subprocess.run([str(python), "-c", "pass"], env=environment, check=True)
    return time.perf_counter() - start


def modules_at_start_up(python: Path, environment: dict[str, str]) -> set[str]:
    """The modules an interpreter has imported once start-up (site, the .pth files)
    is done."""
    code = "import sys; print('\\n'.join(sys.modules))"
    result = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, env=environment, check=True
    )
    return set(result.stdout.split())


def _spread_ms(samples_s: list[float]) -> dict[str, float]:
    quartiles = statistics.quantiles(samples_s, n=4)
    return {
        "median_ms": statistics.median(samples_s) * 1e3,
        "p25_ms": quartiles[0] * 1e3,
        "p75_ms": quartiles[2] * 1e3,
    }


def time_hook(python: Path, hook: Path, pairs: int) -> dict:
    """Time `python -c pass` with and without `hook` in its site-packages, `pairs`
    times each, alternating; the hook's file is where it was when this returns."""
    if not hook.is_file():
        raise FileNotFoundError(f"{hook}: no hook installed there")
    disabled = hook.with_name(hook.name + ".off")
    environment = child_environment()
    with_hook: list[float] = []
    without_hook: list[float] = []
    try:
        start_up_s(python, environment)  # warm the file cache before timing
        imports_with = modules_at_start_up(python, environment)
        hook.rename(disabled)
        imports_without = modules_at_start_up(python, environment)
        hook_present = False
        for pair in range(pairs):
            # A-B then B-A: each side goes first in half the pairs.
            for side in (True, False) if pair % 2 == 0 else (False, True):
                if side != hook_present:
                    (disabled.rename(hook) if side else hook.rename(disabled))
                    hook_present = side
                (with_hook if side else without_hook).append(start_up_s(python, environment))
    finally:
        if disabled.exists() and not hook.exists():
            disabled.rename(hook)
    paired_ms = [(a - b) * 1e3 for a, b in zip(with_hook, without_hook, strict=True)]
    return {
        "python": str(python),
        "pairs": pairs,
        "with_hook": _spread_ms(with_hook),
        "without_hook": _spread_ms(without_hook),
        "median_difference_ms": (statistics.median(with_hook) - statistics.median(without_hook))
        * 1e3,
        "median_paired_difference_ms": statistics.median(paired_ms),
        "extra_modules_with_hook": sorted(imports_with - imports_without),
    }


def fresh_venv(folder: Path, hook_source: Path) -> Path:
    """A venv without pip in `folder` whose site-packages holds a copy of
    `hook_source`; returns its interpreter."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    (site_packages(python) / HOOK_NAME).write_bytes(hook_source.read_bytes())
    return python


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=300, help="starts with and without, each")
    parser.add_argument("--venv", help="an existing venv with disco-xla installed")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        if args.venv:
            python = Path(args.venv) / "bin" / "python"
        else:
            python = fresh_venv(Path(scratch) / "venv", REPO_ROOT / HOOK_NAME)
        result = time_hook(python, site_packages(python) / HOOK_NAME, args.pairs)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"`python -c pass`, {args.pairs} starts each, {ENVIRONMENT_VARIABLE} unset: {python}")
    for side in ("with_hook", "without_hook"):
        spread = result[side]
        print(
            f"  {side.replace('_', ' '):13} median {spread['median_ms']:.2f} ms "
            f"(interquartile {spread['p25_ms']:.2f} to {spread['p75_ms']:.2f} ms)"
        )
    print(
        f"  difference of the medians {result['median_difference_ms']:+.3f} ms; "
        f"median of the paired differences {result['median_paired_difference_ms']:+.3f} ms"
    )
    extra = result["extra_modules_with_hook"]
    print(f"  modules the hook imports at start-up: {', '.join(extra) if extra else 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
