"""The package as a user installs it into their own environment: the wheel and sdist
built by PyPA `build`, the wheel pip-installed (not editable) into a fresh venv with the
newest versions setup.py's ranges admit, the `disco-xla` command finding its profiles
in the venv's data files, the DISCO_XLA_FLAGS hook optimising an unmodified `jax.jit`
script, and `pip uninstall` leaving no hook behind.

One venv serves the whole file (module-scoped fixtures); the uninstall test runs last.
The file skips only where the package index pip is configured with cannot be reached.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO_ROOT = Path(__file__).resolve().parents[1]
HOOK_NAME = "zz_disco_xla_hook.pth"
SAMPLE_MODULE = REPO_ROOT / "tests" / "data" / "hlo_corpus" / "bf16_mlp.hlo.txt"
GPU_CLUSTER = "a100-2x8-100g"  # found only in the venv's share/disco-xla/configs/clusters
# What a fresh clone does not have: environments, build outputs, caches.
_NOT_SOURCE = (".git", ".venv*", "*.egg-info", "build", "dist", "bazel-*", "__pycache__", ".*cache")


def _environment(**extra: str) -> dict[str, str]:
    """The environment a user's shell would give: no repository on the path, no
    hook variable, no active venv."""
    environment = dict(os.environ)
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "DISCO_XLA_FLAGS"):
        environment.pop(name, None)
    environment.update(extra)
    return environment


def _run(
    command: list[str], cwd: Path, timeout_s: float = 300, **extra_environment: str
) -> subprocess.CompletedProcess:
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        cwd=cwd,
        env=_environment(**extra_environment),
        timeout=timeout_s,
    )


@dataclass(frozen=True)
class Distributions:
    wheel: Path
    sdist: Path


@dataclass(frozen=True)
class Venv:
    root: Path
    python: Path
    site_packages: Path
    scratch: Path  # a folder outside the repository, to run from

    def command(self, name: str) -> str:
        return str(self.root / "bin" / name)


@pytest.fixture(scope="module")
def distributions(tmp_path_factory) -> Distributions:
    """The sdist, and the wheel built from it, as `python -m build` makes them."""
    scratch = tmp_path_factory.mktemp("index_probe")
    # A small pre-release package the install needs anyway: its download tells
    # whether pip's index answers, so that only that case skips.
    probe = _run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(scratch)]
        + ["jraph==0.0.6.dev0"],
        cwd=scratch,
        timeout_s=180,
    )
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"pip's package index cannot be reached ({last})")
    # Built from a copy without the build's leftovers: a stale *.egg-info/SOURCES.txt
    # would put files in the sdist that MANIFEST.in no longer names.
    source = tmp_path_factory.mktemp("source") / "disco-xla"
    shutil.copytree(REPO_ROOT, source, ignore=shutil.ignore_patterns(*_NOT_SOURCE))
    dist = tmp_path_factory.mktemp("dist")
    built = _run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(source)],
        cwd=source,
        timeout_s=600,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    wheels, sdists = list(dist.glob("*.whl")), list(dist.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in dist.iterdir())
    return Distributions(wheel=wheels[0], sdist=sdists[0])


@pytest.fixture(scope="module")
def venv(distributions, tmp_path_factory) -> Venv:
    """A fresh venv of this interpreter's base Python with the wheel installed by a
    plain `pip install WHEEL`: pip resolves the newest versions in the ranges."""
    root = tmp_path_factory.mktemp("user_env") / "venv"
    base_python = getattr(sys, "_base_executable", sys.executable)
    created = _run([base_python, "-m", "venv", str(root)], cwd=root.parent, timeout_s=300)
    assert created.returncode == 0, created.stderr[-2000:]
    python = root / "bin" / "python"
    installed = _run(
        [str(python), "-m", "pip", "install", "-q", str(distributions.wheel)],
        cwd=root.parent,
        timeout_s=1500,
    )
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    purelib = _run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        cwd=root.parent,
    )
    scratch = tmp_path_factory.mktemp("user_work")
    return Venv(root, python, Path(purelib.stdout.strip()), scratch)


def test_the_wheel_carries_the_hook_at_its_root_the_profiles_and_the_package(distributions):
    names = set(zipfile.ZipFile(distributions.wheel).namelist())
    assert HOOK_NAME in names
    hook = zipfile.ZipFile(distributions.wheel).read(HOOK_NAME)
    assert hook == (REPO_ROOT / HOOK_NAME).read_bytes()
    assert {
        "disco_xla/__init__.py",
        "disco_xla/frontends/env_hook.py",
        "disco_xla/cli/__init__.py",
    } <= names
    data = {name.split(".data/data/", 1)[1] for name in names if ".data/data/" in name}
    shipped = {
        f"share/disco-xla/{path.relative_to(REPO_ROOT)}"
        for folder in ("clusters", "gpu_tables", "costmodels")
        for path in (REPO_ROOT / "configs" / folder).rglob("*")
        if path.is_file()
    }
    assert shipped and shipped <= data, sorted(shipped - data)
    assert not any(name.startswith("tests/") for name in names)


def test_the_sdist_holds_what_building_the_wheel_needs(distributions):
    with tarfile.open(distributions.sdist) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {"setup.py", "MANIFEST.in", HOOK_NAME, "disco_xla/__init__.py"} <= names
    profiles = {str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "configs").rglob("*.yaml")}
    assert profiles <= names, sorted(profiles - names)
    assert not any(name.startswith("tests/") for name in names)


def _locked_versions() -> dict[str, str]:
    """requirements.txt's exact pins, by canonical name."""
    locked = {}
    for line in (REPO_ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            locked[canonicalize_name(requirement.name)] = str(requirement.specifier)[2:]
    return locked


def test_the_requirements_are_ranges_that_admit_the_locked_versions(distributions):
    with zipfile.ZipFile(distributions.wheel) as wheel:
        (metadata_name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = wheel.read(metadata_name).decode()
    requirements = [
        Requirement(line.split(":", 1)[1].strip())
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:")
    ]
    locked = _locked_versions()
    names = set()
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        names.add(name)
        assert not any(spec.operator == "==" for spec in requirement.specifier), requirement
        assert any(spec.operator == "<" for spec in requirement.specifier), requirement
        if name in locked:  # tensorflow (the GPU build) is not in CI's lock
            assert requirement.specifier.contains(locked[name], prereleases=True), (
                requirement,
                locked[name],
            )
    # jaxlib comes with jax at the version jax asks for, so that a jax-cuda12-plugin
    # matching the user's jaxlib keeps matching.
    assert "jaxlib" not in names
    assert {"jax", "numpy", "protobuf", "jraph", "tensorflow", "tensorflow-cpu"} <= names


def test_pip_resolved_a_consistent_environment_with_the_jraph_pre_release(venv):
    checked = _run([str(venv.python), "-m", "pip", "check"], cwd=venv.scratch)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    code = (
        "import importlib.metadata as m; "
        "print(*(m.version(n) for n in ('disco-xla', 'jax', 'jaxlib', 'jraph')))"
    )
    versions = _run([str(venv.python), "-c", code], cwd=venv.scratch)
    assert versions.returncode == 0, versions.stderr[-2000:]
    _, jax_version, jaxlib_version, jraph_version = versions.stdout.split()
    assert jax_version.startswith("0.10.") and jaxlib_version.startswith("0.10.")
    assert ".dev" in jraph_version


def test_the_command_runs_from_the_venv_and_finds_its_profiles_in_the_data_files(venv):
    help_text = _run([venv.command("disco-xla"), "--help"], cwd=venv.scratch)
    assert help_text.returncode == 0, help_text.stderr[-2000:]
    assert "optimize" in help_text.stdout and "calibrate" in help_text.stdout
    where = _run(
        [str(venv.python), "-c", "import disco_xla; print(disco_xla.__file__)"], venv.scratch
    )
    assert Path(where.stdout.strip()).is_relative_to(venv.site_packages), where
    profile = venv.root / "share" / "disco-xla" / "configs" / "clusters" / f"{GPU_CLUSTER}.yaml"
    assert profile.is_file()
    plan = venv.scratch / "plan.json"
    optimized = _run(
        [venv.command("disco-xla"), "optimize", str(SAMPLE_MODULE), "--cluster", GPU_CLUSTER]
        + ["-o", str(plan), "--max-evals", "20", "--xla-flags", "--json"],
        cwd=venv.scratch,
    )
    assert optimized.returncode == 0, optimized.stderr[-3000:]
    report = json.loads(optimized.stdout)
    assert report["cluster"] == GPU_CLUSTER
    assert "--xla_gpu_all_reduce_combine_threshold_bytes=" in report["xla_flags"]["flags"]
    assert json.loads(plan.read_text())  # the plan, written where -o said


_TINY_SCRIPT = """
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

jax.config.update("jax_num_cpu_devices", 4)
mesh = Mesh(np.array(jax.devices()), ("data",))


@jax.jit
def step(w, x):
    loss, grad = jax.value_and_grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
    return w - 0.1 * grad, loss


w = jax.device_put(jnp.full((16, 8), 0.1), NamedSharding(mesh, P()))
x = jax.device_put(jnp.arange(32 * 16.0).reshape(32, 16) / 512, NamedSharding(mesh, P("data")))
for _ in range(3):
    w, loss = step(w, x)
print("LOSS", float(loss))
print("STATUS", [s.split(" (")[0] for s in getattr(step, "status", lambda: ["plain jax"])()])
print("DISCO_XLA", getattr(sys.modules.get("disco_xla"), "__file__", None))
"""


def _lines(output: str, prefix: str) -> list[str]:
    return [line.split(" ", 1)[1] for line in output.splitlines() if line.startswith(prefix)]


def test_the_hook_imports_nothing_while_the_variable_is_unset(venv):
    code = (
        "import sys; print(sorted({m.split('.')[0] for m in sys.modules} & {'disco_xla', 'jax'}))"
    )
    unset = _run([str(venv.python), "-c", code], cwd=venv.scratch)
    assert unset.returncode == 0 and unset.stdout.strip() == "[]", unset
    set_empty = _run([str(venv.python), "-c", code], cwd=venv.scratch, DISCO_XLA_FLAGS="")
    assert set_empty.returncode == 0 and "disco_xla" in set_empty.stdout, set_empty


def test_the_hook_optimizes_an_unmodified_jit_step_and_computes_the_same(venv):
    script = venv.scratch / "tiny.py"
    script.write_text(_TINY_SCRIPT)
    report = venv.scratch / "report.json"
    flags = (
        f"--disco_enable --disco_cluster=cpu-local-inprocess --disco_max_evaluations=10 "
        f"--nodisco_check_speed --nodisco_background --disco_cache_dir={venv.scratch / 'cache'} "
        f"--disco_report={report}"
    )
    hooked = _run([str(venv.python), str(script)], cwd=venv.scratch, DISCO_XLA_FLAGS=flags)
    assert hooked.returncode == 0, hooked.stderr[-3000:]
    assert "optimized" in _lines(hooked.stdout, "STATUS")[0], hooked.stdout
    assert Path(_lines(hooked.stdout, "DISCO_XLA")[0]).is_relative_to(venv.site_packages)
    steps = json.loads(report.read_text())["steps"]
    assert [s["name"] for s in steps] == ["step"]
    plain = _run([str(venv.python), str(script)], cwd=venv.scratch)
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert _lines(plain.stdout, "STATUS") == ["['plain jax']"]
    assert _lines(plain.stdout, "DISCO_XLA") == ["None"]
    hooked_loss, plain_loss = (float(_lines(r.stdout, "LOSS")[0]) for r in (hooked, plain))
    assert math.isclose(hooked_loss, plain_loss, rel_tol=1e-6), (hooked_loss, plain_loss)


def test_uninstall_leaves_no_hook_behind(venv):
    # Runs last: it removes the package from the file's venv.
    hook = venv.site_packages / HOOK_NAME
    # A flag the hook does not know stops any Python while the hook is installed...
    code = "import jax; print('started')"
    bad_flag = "--disco_enable --disco_no_such_flag"
    before = _run([str(venv.python), "-c", code], cwd=venv.scratch, DISCO_XLA_FLAGS=bad_flag)
    assert hook.is_file() and before.returncode == 2, before
    removed = _run([str(venv.python), "-m", "pip", "uninstall", "-y", "disco-xla"], venv.scratch)
    assert removed.returncode == 0, removed.stderr[-2000:]
    assert not hook.exists()
    assert not (venv.site_packages / "disco_xla").exists()
    # pip removes the files it installed and leaves empty folders under share/.
    shared = venv.root / "share" / "disco-xla"
    assert not [path for path in shared.rglob("*") if not path.is_dir()]
    assert not Path(venv.command("disco-xla")).exists()
    leftovers = [p.name for p in venv.site_packages.iterdir() if "disco" in p.name.lower()]
    assert leftovers == []
    # ...and after the uninstall, the same interpreter starts cleanly with it set.
    after = _run([str(venv.python), "-c", code], cwd=venv.scratch, DISCO_XLA_FLAGS=bad_flag)
    assert after.returncode == 0 and after.stdout.strip() == "started", after
    assert "disco" not in after.stderr.lower(), after.stderr
