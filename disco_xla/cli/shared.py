"""What several commands share: loading a module for planning and a plan for it,
giving XLA the CPU devices a module runs on, and holding the CPUs awake while
measuring."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from dataclasses import fields

import jax

from disco_xla.errors import DiscoInputError
from disco_xla.hlo.hlo_io import load_module
from disco_xla.hlo_passes.create_reduce_scatters import CreateReduceScatters
from disco_xla.plan import Plan
from disco_xla.runtime.xla_runner import devices_needed, partition_module
from disco_xla.settings import DEFAULTS, OptimizeSettings, settings_declared
from disco_xla.timing import CPU_LATENCY_DEVICE, cpus_kept_awake


def use_devices(module) -> None:
    """Give XLA:CPU as many devices as `module` runs on (before JAX starts its backend)."""
    jax.config.update("jax_num_cpu_devices", devices_needed(module))


def load_for_planning(path: str):
    """The module at `path` as plans are made for it: a module that XLA's SPMD
    partitioner splits (a sharded `jax.jit` step dumped before optimisation)
    is partitioned first, by XLA, since its all-reduces exist only after that;
    then the partitioner's all-reduce + dynamic-slice pairs become
    reduce-scatters, as XLA:GPU makes them (`CreateReduceScatters`)."""
    module = load_module(path)
    if module.needs_partitioning:
        use_devices(module)
        try:
            module = partition_module(module)
        except Exception as error:  # noqa: BLE001 - XLA's own errors, one line
            raise DiscoInputError(
                path, f"XLA's SPMD partitioner cannot split it here ({first_line(error)})"
            ) from None
    CreateReduceScatters().run(module)
    return module


def add_xla_dump(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--xla-dump",
        metavar="AFTER",
        help="the module XLA wrote after its optimizations on the machine that runs the job "
        "(the *after_optimizations* file --xla_dump_to writes): its kernels and its "
        "all-reduces, in its order, make the xla and xla-overlap baselines",
    )


def load_dump(path: str | None):
    """XLA's after-optimizations module at `path` (None: none given)."""
    return load_module(path) if path else None


def load_plan(path: str):
    """The `Plan` in the JSON file at `path`."""
    try:
        with open(path) as file:
            text = file.read()
    except OSError as error:
        raise DiscoInputError(path, f"cannot read the plan ({error.strerror})") from None
    return Plan.from_json(text, path)


def first_line(error: BaseException) -> str:
    """`error`'s message on one line, at most 200 characters."""
    return " ".join(str(error).split())[:200]


@contextlib.contextmanager
def cpus_awake_if_asked(args: argparse.Namespace, command: str) -> Iterator[bool]:
    """`timing.cpus_kept_awake` around a measurement when --keep-cpus-awake asks
    for it (a one-line error where it cannot be held); yields whether it is held."""
    if not args.keep_cpus_awake:
        yield False
        return
    with cpus_kept_awake() as held:
        if not held:
            raise DiscoInputError(
                command, f"--keep-cpus-awake needs write access to {CPU_LATENCY_DEVICE}"
            )
        yield True


def add_keep_cpus_awake(parser: argparse.ArgumentParser) -> None:
    """The --keep-cpus-awake option of a command that measures."""
    parser.add_argument(
        "--keep-cpus-awake",
        action="store_true",
        help="hold the CPUs' wake-up latency at 0 while measuring (Linux PM QoS; needs "
        "write access to /dev/cpu_dma_latency), for runs made under the same setting",
    )


_OPTION_TYPES = {"int": int, "float": float, "str": str}


def add_setting_options(parser: argparse.ArgumentParser) -> None:
    """An option for each setting the settings offer the CLI
    (`settings.Setting.cli_option`), with its type, default and help text; its
    value lands under the setting's own name."""
    types = {f.name: str(f.type) for f in fields(OptimizeSettings)}
    for name, setting in settings_declared().items():
        if setting.cli_option is None:
            continue
        default = getattr(DEFAULTS, name)
        parser.add_argument(
            setting.cli_option,
            dest=name,
            type=_OPTION_TYPES[types[name]],
            default=default,
            help=f"{setting.help} (default {default:g})",
        )
