"""What every entry point shares, below the frontends: the plan for a step,
from the plan cache or the planning pipeline (`planning`, `plan_cache`), and
the measuring of its candidate programs: built, checked equal, timed and
chosen (`trial` for `jit` and `tf_function`, `checked_rewrite` for the CLI)."""
