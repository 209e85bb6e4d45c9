"""The environment hook: `DISCO_XLA_FLAGS` turns disco-xla on for unmodified JAX
scripts, in the style of `XLA_FLAGS`.

    DISCO_XLA_FLAGS="--disco_enable --disco_budget_s=30" python train.py

`--disco_cluster` defaults to `auto`: each step's first call reads the devices
it runs on (platform, device kind, devices per process, processes) and prices
its plans on the shipped profile they call for: on 4 processes of 8 H100s,
`h100-32x8-ib400@4x8`, the network assumed InfiniBand (the devices do not tell
it; name another with `--disco_cluster=h100-32x8-eth100@4x8`); on one process
of CPU devices, `cpu-local-inprocess`. Where no profile fits (an unknown GPU),
the step runs the original, and its status says how to write one. The report
(`--disco_report`) names each step's profile and why.

The flags are absl flags in their own `FlagValues` (the script's own absl flags
are untouched), read once, when the hook is installed. With `--disco_enable`,
`jax.jit` and `jax.pmap` are replaced by wrappers that build `disco_xla.jit`
functions: a step whose module reduces gradients across devices runs the
optimised program; every other function runs as JAX would run it.

The hook is installed by `import disco_xla`, and at interpreter start-up by the
`zz_disco_xla_hook.pth` file that installing the package puts in site-packages; the
`.pth` line does nothing (imports nothing) unless `DISCO_XLA_FLAGS` is set. So a
script needs no change: only the variable. A functions bound before the hook
runs (`from jax import jit` in a module imported earlier) is not replaced.

An unknown or malformed flag stops the program with one line naming it and exit
code 2, as XLA does for `XLA_FLAGS`. This module holds the only global state of
disco-xla.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shlex
import sys
from dataclasses import dataclass, fields

from disco_xla.settings import (
    AUTO_CLUSTER,
    WRAPPED_STEP_DEFAULTS,
    OptimizeSettings,
    settings_declared,
)

# `import disco_xla` imports this module (so does the `.pth` hook, at interpreter start,
# when DISCO_XLA_FLAGS is set): absl, JAX and `jax_api` are imported inside the
# functions that need them, only once the flags are read or the hook is enabled.

ENVIRONMENT_VARIABLE = "DISCO_XLA_FLAGS"
EXIT_BAD_INPUT = 2


@dataclass(frozen=True)
class HookFlags(OptimizeSettings):
    """The search settings the flags give, and whether the hook is on."""

    cluster: str = AUTO_CLUSTER  # read from the devices (`WRAPPED_STEP_DEFAULTS`)
    enable: bool = False
    report: str | None = None  # where to write what each wrapped step ran, at exit

    def settings(self) -> OptimizeSettings:
        """The settings alone (`enable` is not part of what decides a plan)."""
        return OptimizeSettings(**{f.name: getattr(self, f.name) for f in fields(OptimizeSettings)})


# The absl flag type of each kind of setting (`settings.Setting.hook_flag`).
_ABSL_TYPES = {"bool": "boolean", "int": "integer", "float": "float"}


def _flag_definitions() -> list[tuple[str, str, object, str, str | None]]:
    """The hook's flags, as DISCO_XLA_FLAGS takes them: (absl flag type, name,
    default, help, the `OptimizeSettings` field it sets or None): its own
    (`--disco_enable`, `--disco_report`), then each setting the settings
    declare a hook flag for, with the wrapped step's default."""
    flags = [
        ("boolean", "disco_enable", False, "optimise data-parallel JAX steps", None),
        (
            "string",
            "disco_report",
            None,
            "at exit, write each optimised step's status and measurements to this JSON file "
            "(rank r > 0 of a multi-process job writes FILE.r)",
            None,
        ),
    ]
    types = {f.name: str(f.type) for f in fields(OptimizeSettings)}
    for name, setting in settings_declared().items():
        if setting.hook_flag is not None:
            kind = _ABSL_TYPES.get(types[name], "string")
            default = getattr(WRAPPED_STEP_DEFAULTS, name)
            flags.append((kind, setting.hook_flag, default, setting.help, name))
    return flags


def _flag_values():
    """A fresh absl `FlagValues` holding the hook's flags (`_flag_definitions`),
    apart from the script's own absl flags."""
    from absl import flags

    values = flags.FlagValues()
    for flag_type, name, default, help_text, _ in _flag_definitions():
        define = getattr(flags, f"DEFINE_{flag_type}")
        define(name, default, help_text, flag_values=values)
    return values


def parse_flags(text: str) -> HookFlags:
    """The hook's settings from the text of DISCO_XLA_FLAGS; raises ValueError
    naming the first bad flag."""
    from absl import flags

    values = _flag_values()
    try:
        arguments = shlex.split(text)
    except ValueError as error:
        raise ValueError(f"cannot split the flags ({error})") from None
    for argument in arguments:
        if not argument.startswith("-"):
            raise ValueError(f"{argument!r} is not a flag")
    try:
        values(["disco_xla", *arguments], known_only=False)
    except flags.UnrecognizedFlagError as error:
        known = ", ".join(f"--{name}" for name in sorted(values))
        raise ValueError(f"unknown flag --{error.flagname} (known: {known})") from None
    except flags.Error as error:
        raise ValueError(" ".join(str(error).split())) from None
    definitions = _flag_definitions()
    for _, flag, _, _, name in definitions:
        if name and settings_declared()[name].positive and getattr(values, flag) <= 0:
            raise ValueError(f"--{flag} must be positive")
    if values.disco_alpha < 1:
        raise ValueError("--disco_alpha must be at least 1")
    report = values.disco_report
    if report is not None and not os.path.isdir(os.path.dirname(os.path.abspath(report))):
        raise ValueError(f"--disco_report={report}: its folder does not exist")
    settings = {name: getattr(values, flag) for _, flag, _, _, name in definitions if name}
    return HookFlags(enable=values.disco_enable, report=report, **settings)


_installed: HookFlags | None = None


def install() -> HookFlags | None:
    """Read DISCO_XLA_FLAGS once and, if it enables disco-xla, replace `jax.jit`
    and `jax.pmap`. Returns the flags (None when the variable is unset)."""
    global _installed
    if _installed is not None:
        return _installed
    text = os.environ.get(ENVIRONMENT_VARIABLE)
    if text is None:
        return None
    try:
        hook_flags = parse_flags(text)
    except ValueError as error:
        print(f"disco-xla: error: {ENVIRONMENT_VARIABLE}: {error}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(EXIT_BAD_INPUT)  # also at interpreter start-up, where SystemExit is fatal
    _installed = hook_flags
    if hook_flags.enable:
        _replace_jax_transforms(hook_flags)
    return hook_flags


def _replace_jax_transforms(hook_flags: HookFlags) -> None:
    import jax

    from disco_xla.frontends.jax_api import wrap

    settings = hook_flags.settings()
    wrapped: list = []
    if hook_flags.report:
        atexit.register(_write_report, hook_flags.report, wrapped)

    def replacement(transform: str, original):
        @functools.wraps(original)
        def transformed(fun=None, /, *positional, **kwargs):
            if fun is None:  # used as @jax.jit(static_argnums=...)
                return functools.partial(transformed, **kwargs)
            if positional and transform == "pmap":  # jax.pmap(f, "batch")
                kwargs = {"axis_name": positional[0], **kwargs}
                positional = positional[1:]
            if positional:
                return original(fun, *positional, **kwargs)  # a form we do not know
            if kwargs and hasattr(fun, "lower"):
                # jax.jit(jax.jit(f), donate_argnums=...): JAX nests the two (ours
                # traces through to JAX's own inside), and the outer one is optimised.
                fun, kwargs = original(fun, **kwargs), {}
            function = wrap(fun, settings, transform, kwargs)
            if hook_flags.report:
                wrapped.append(function)
            return function

        transformed.__disco_xla_original__ = original
        return transformed

    jax.jit = replacement("jit", jax.jit)
    jax.pmap = replacement("pmap", jax.pmap)


def _write_report(path: str, wrapped: list) -> None:
    """Write what each wrapped step that was called ran: its name, `status()`,
    its cluster `profile()` and why, `measurements()` and plans, as JSON."""
    import jax

    if not wrapped:  # nothing was optimised here (the launcher of a multi-process job)
        return
    steps = [
        {
            "name": function.__name__,
            "status": function.status(),
            "profile": function.profile(),
            "measurements": function.measurements(),
            "plans": [json.loads(plan.to_json()) for plan in function.plans()],
        }
        for function in wrapped
        if function.status()
    ]
    rank = jax.process_index()
    target = path if rank == 0 else f"{path}.{rank}"
    try:
        with open(target, "w") as report:
            json.dump({"steps": steps}, report, indent=1)
    except OSError as error:
        print(f"disco-xla: error: --disco_report: cannot write {target}: {error}", file=sys.stderr)


def startup() -> None:
    """What the `.pth` file runs at interpreter start-up: nothing unless the
    variable is set."""
    if ENVIRONMENT_VARIABLE in os.environ:
        install()
