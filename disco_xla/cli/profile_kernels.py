"""`disco-xla profile FILES --out DATA.npz`: measure the fused kernels of
sampled plans, the GNN cost model's data set (`profiling/sample_plans.py`), on
the CPU or (`--platform gpu`) on the GPUs JAX sees. A platform with fewer devices
than a module needs is bad input: one line naming it, exit code 2."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import numpy as np
from tqdm import tqdm

from disco_xla.cli.shared import add_keep_cpus_awake, cpus_awake_if_asked
from disco_xla.costmodel.dataset import from_samples, save_dataset
from disco_xla.driver.planning import learn_kernel_times
from disco_xla.errors import DiscoInputError
from disco_xla.hlo.hlo_io import load_module
from disco_xla.profiling.kernel_times import kernels_one_by_one
from disco_xla.profiling.sample_plans import profile_module
from disco_xla.runtime.xla_runner import devices_needed, platform_devices
from disco_xla.settings import OptimizeSettings
from disco_xla.simulator.profiles import load_profile


def add_parser(commands, common: argparse.ArgumentParser) -> None:
    profile = commands.add_parser(
        "profile", parents=[common], help="measure sampled fused kernels: the GNN's data set"
    )
    profile.add_argument("files", nargs="+", help="HLO modules (model name: file name to '.')")
    profile.add_argument("--plans", type=int, default=8, help="sampled plans per module")
    profile.add_argument("--repeats", type=int, default=5, help="profiled steps per plan")
    add_keep_cpus_awake(profile)
    profile.add_argument("--seed", type=int, default=0)
    profile.add_argument(
        "--platform",
        choices=["cpu", "gpu"],
        default="cpu",
        help="where to run the kernels (gpu: JAX's GPU devices, as many as a module needs)",
    )
    profile.add_argument("--out", required=True, help="data set to write (.npz)")
    profile.add_argument(
        "--learn",
        metavar="CLUSTER",
        help="also keep the kernel times in the plan cache for this cluster profile (the "
        "machine measured on): later searches there trust them before any cost model",
    )
    profile.add_argument("--cache-dir", help="the plan cache (default ~/.cache/disco_xla)")
    profile.add_argument("--json", action="store_true", help="print one JSON object")
    profile.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.plans < 1 or args.repeats < 1:
        raise DiscoInputError("profile", "--plans and --repeats must be at least 1")
    if args.learn:
        load_profile(args.learn)  # an unknown cluster stops here, before any profiling
    modules = [(path, load_module(path)) for path in args.files]
    needed = max(devices_needed(m) for _, m in modules)
    if args.platform == "cpu":
        jax.config.update("jax_num_cpu_devices", needed)
    else:
        kernels_one_by_one()  # before the GPU backend starts (it reads XLA_FLAGS once)
    platform_devices(args.platform, needed)  # one line, exit 2, where there are too few

    start = time.perf_counter()
    samples, awake = _profile_modules(args, modules)
    dataset = from_samples(samples)
    save_dataset(dataset, args.out)
    report = {
        "samples": len(dataset),
        "with_kernels": int((dataset.kernel_count > 0).sum()),
        "distinct_kernels": len(set(dataset.structural_hash.tolist())),
        "modules": len(modules),
        "plans_per_module": args.plans,
        "platform": args.platform,
        "cpus_kept_awake": awake,
        "seconds": round(time.perf_counter() - start, 1),
        "out": args.out,
        "learned_kernels": _learn(args, dataset) if args.learn else 0,
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"wrote {args.out}: {report['samples']} kernel samples "
            f"({report['distinct_kernels']} distinct) from {len(modules)} modules x "
            f"{args.plans} plans + XLA's compile, {report['seconds']:.0f} s"
        )
    return 0


def _learn(args: argparse.Namespace, dataset) -> int:
    """Keep each distinct kernel's median measured time in the plan cache for
    `--learn`'s profile; returns how many kernels were kept."""
    by_kernel: dict[str, list[float]] = {}
    for kernel, seconds in zip(dataset.structural_hash, dataset.time_s, strict=True):
        if seconds > 0:
            by_kernel.setdefault(str(kernel), []).append(float(seconds))
    times = {kernel: float(np.median(values)) for kernel, values in by_kernel.items()}
    settings = OptimizeSettings(cluster=args.learn, cache_dir=args.cache_dir)
    if not learn_kernel_times(settings, times):
        raise DiscoInputError(args.cache_dir or "plan cache", "cannot store the kernel times")
    return len(times)


def _profile_modules(args: argparse.Namespace, modules: list) -> tuple[list, bool]:
    """(every module's kernel samples, whether the CPUs were kept awake), a
    progress bar on a terminal."""
    samples = []
    quiet = args.json or not sys.stderr.isatty()
    with (
        cpus_awake_if_asked(args, "profile") as awake,
        tqdm(total=len(modules) * (args.plans + 1), disable=quiet, leave=False) as bar,
    ):
        for path, module in modules:
            module_name, model = _module_and_model_names(path)

            def step(kind: str, bar=bar, module_name=module_name) -> None:
                bar.set_description_str(f"{module_name} {kind}")
                bar.update(1)

            samples += profile_module(
                module,
                module_name,
                model,
                args.plans,
                args.repeats,
                args.seed,
                on_plan=step,
                platform=args.platform,
            )
    return samples, awake


def _module_and_model_names(path: str) -> tuple[str, str]:
    """'build/gpt2_small.medium.hlo.pb' -> ('gpt2_small.medium', 'gpt2_small')."""
    name = os.path.basename(path)
    for suffix in (".gz", ".pb", ".txt", ".hlo"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name, name.split(".")[0]
