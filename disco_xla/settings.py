"""`OptimizeSettings`: everything that decides which plan a module gets and how
it is chosen, and the one place their defaults are written. The search, the
CLI's flags, the env hook's flags, `disco_xla.jit` and `disco_xla.tf_function`
all read their defaults from here. Plain data: it imports nothing of disco-xla."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

# The cluster profile that the devices a step runs on call for, read on its
# first call (`simulator.profile_choice.choose_profile`): the default of the
# entry points that run the step, `disco_xla.jit`, `disco_xla.tf_function` and
# the env hook. Where no devices are at hand (a search over a captured module,
# the CLI) a profile must be named.
AUTO_CLUSTER = "auto"


@dataclass(frozen=True)
class OptimizeSettings:
    """What a search is asked for, and how its candidates are measured."""

    # A profile name, a YAML path, either rescaled ("NAME@NODESxDEVICES"), or
    # AUTO_CLUSTER where the step's devices are read (`WRAPPED_STEP_DEFAULTS`).
    cluster: str = "cpu-local"
    budget_s: float = 30.0  # wall-clock search budget
    max_evaluations: int = 300  # plan evaluations; with the seed, what makes plans reproducible
    alpha: float = 1.05  # the search's relaxation: explore plans up to alpha x the best
    seed: int = 0
    cost_model: str = "auto"  # measured GPU tables where the profile has them, else roofline
    cache_dir: str | None = None  # None: ~/.cache/disco_xla
    use_cache: bool = True
    check_speed: bool = True  # time the candidates on first call; keep the fastest
    candidates: int = 4  # the search's best plans measured (with the best baseline)
    measure_budget_s: float = 60.0  # wall-clock cap on timing the candidates
    # Capture, search and compile off the step's critical path (a background
    # thread; the original runs meanwhile), and time the candidates on the
    # user's own steps in rotation; off: all of it in the first call.
    background: bool = True

    def search_options(self) -> dict:
        """The options that change the search result (the cache key's part)."""
        options = asdict(self)
        for local_only in (
            "cluster",
            "cache_dir",
            "use_cache",
            "check_speed",
            "candidates",
            "measure_budget_s",
            "background",
        ):
            options.pop(local_only)
        return options


DEFAULTS = OptimizeSettings()
# The defaults of the entry points that wrap a step and run it (`disco_xla.jit`,
# `disco_xla.tf_function`, the env hook): the profile is read from the devices.
WRAPPED_STEP_DEFAULTS = replace(DEFAULTS, cluster=AUTO_CLUSTER)
