"""`OptimizeSettings`: everything that decides which plan a module gets and how
it is chosen, declared once: each field's default, its help text, the
`DISCO_XLA_FLAGS` flag the env hook reads it from, and the option
`disco-xla optimize` takes it as (`Setting`, in each field's metadata). The
search, the CLI's options and the env hook's flags are made from these
declarations; the keyword arguments of `disco_xla.jit` and
`disco_xla.tf_function` are written out for readers and IDEs and checked
against them (`tests/test_settings.py`). Plain data: it imports nothing of
disco-xla."""

from __future__ import annotations

from dataclasses import Field, asdict, dataclass, field, fields, replace

# The cluster profile that the devices a step runs on call for, read on its
# first call (`simulator.profile_choice.choose_profile`): the default of the
# entry points that run the step, `disco_xla.jit`, `disco_xla.tf_function` and
# the env hook. Where no devices are at hand (a search over a captured module,
# the CLI) a profile must be named.
AUTO_CLUSTER = "auto"


@dataclass(frozen=True)
class Setting:
    """How one setting is offered: its help text, its env hook flag (None:
    not offered there), its `optimize` option (None: not offered there),
    whether it must be positive, and whether it changes the search's result
    (the plan cache's key; otherwise it only says how candidates are measured
    on this machine)."""

    help: str
    hook_flag: str | None = None
    cli_option: str | None = None
    positive: bool = False
    decides_plan: bool = True


def _setting(default, help: str, **how) -> Field:
    return field(default=default, metadata={"setting": Setting(help, **how)})


@dataclass(frozen=True)
class OptimizeSettings:
    """What a search is asked for, and how its candidates are measured."""

    # A profile name, a YAML path, either rescaled ("NAME@NODESxDEVICES"), or
    # AUTO_CLUSTER where the step's devices are read (`WRAPPED_STEP_DEFAULTS`).
    cluster: str = _setting(
        "cpu-local",
        "cluster profile: name, YAML path, NAME@NODESxDEVICES, or auto (read from the devices)",
        hook_flag="disco_cluster",
        decides_plan=False,  # the cache key holds the profile itself
    )
    budget_s: float = _setting(
        30.0,
        "search budget, seconds (the env hook: per step)",
        hook_flag="disco_budget_s",
        cli_option="--budget-s",
        positive=True,
    )
    # With the seed, what makes plans reproducible.
    max_evaluations: int = _setting(
        300,
        "plans simulated per search",
        hook_flag="disco_max_evaluations",
        cli_option="--max-evals",
        positive=True,
    )
    alpha: float = _setting(
        1.05,
        "the search's relaxation: keep children below alpha x the best",
        hook_flag="disco_alpha",
        cli_option="--alpha",
    )
    seed: int = _setting(0, "search seed", hook_flag="disco_seed", cli_option="--seed")
    # Measured GPU tables where the profile has them, else the roofline.
    cost_model: str = _setting("auto", "kernel cost model", hook_flag="disco_cost_model")
    cache_dir: str | None = _setting(
        None,
        "plan cache (default ~/.cache/disco_xla)",
        hook_flag="disco_cache_dir",
        decides_plan=False,
    )
    use_cache: bool = _setting(
        True, "use the plan cache", hook_flag="disco_cache", decides_plan=False
    )
    check_speed: bool = _setting(
        True,
        "time the candidates on the first call and run the fastest (or the original)",
        hook_flag="disco_check_speed",
        decides_plan=False,
    )
    candidates: int = _setting(
        4,
        "the search's best plans timed beside the original (with the best baseline)",
        hook_flag="disco_candidates",
        cli_option="--candidates",
        positive=True,
        decides_plan=False,
    )
    measure_budget_s: float = _setting(
        60.0,
        "wall-clock cap on timing the candidates, seconds",
        hook_flag="disco_measure_budget_s",
        cli_option="--measure-budget-s",
        positive=True,
        decides_plan=False,
    )
    # Capture, search and compile off the step's critical path (a background
    # thread; the original runs meanwhile), and time the candidates on the
    # user's own steps in rotation; off: all of it in the first call.
    background: bool = _setting(
        True,
        "search, compile and time the candidates off the step's critical path",
        hook_flag="disco_background",
        decides_plan=False,
    )
    # A short run never pays for the background work (its compiles share the
    # CPUs with the loop): in one process, the work for a signature starts
    # once the loop has run it this many times as long as its first call took
    # (JAX's trace and compile); 0 starts it on the second call. Several
    # processes start on the second call (every rank must start on the same).
    start_after: float = _setting(
        10.0,
        "start the background work once the step has run this many times its first call's time",
        hook_flag="disco_start_after",
        decides_plan=False,
    )

    def search_options(self) -> dict:
        """The options that change the search result (the cache key's part)."""
        options = asdict(self)
        for name, setting in settings_declared().items():
            if not setting.decides_plan:
                options.pop(name)
        return options


def settings_declared() -> dict[str, Setting]:
    """Each field of `OptimizeSettings` and how it is offered, in field order."""
    return {f.name: f.metadata["setting"] for f in fields(OptimizeSettings)}


def settings_given(arguments: dict) -> dict:
    """The settings among a function's `arguments` (its `locals()` on entry),
    by name: how `jit`, `tf_function` and `optimize` pass on the settings
    their keyword arguments spell out."""
    return {name: arguments[name] for name in settings_declared() if name in arguments}


DEFAULTS = OptimizeSettings()
# The defaults of the entry points that wrap a step and run it (`disco_xla.jit`,
# `disco_xla.tf_function`, the env hook): the profile is read from the devices.
WRAPPED_STEP_DEFAULTS = replace(DEFAULTS, cluster=AUTO_CLUSTER)
