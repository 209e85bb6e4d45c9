"""disco-xla: joint op-fusion and all-reduce bucketing for data-parallel XLA training.

The public surface is small; everything else is internal and may change:
- `jit(step, cluster=...)`: `jax.jit` / `jax.pmap` with disco-xla's plan applied;
- `tf_function(step, cluster=...)`: the same for `tf.function(jit_compile=True)`;
- `optimize(module, cluster=...)`: the plan for a captured module;
- `load_module`, `save_module`, `capture_jax`, `capture_tf`, `HloModule`, `Plan`.

Importing the package also installs the `DISCO_XLA_FLAGS` hook when that variable
is set (see `disco_xla.frontends.env_hook`).
"""

from disco_xla.capture import capture_jax, capture_tf
from disco_xla.errors import DiscoInputError
from disco_xla.frontends.wrapped_step import DiscoFallbackWarning
from disco_xla.hlo.graph import HloModule
from disco_xla.hlo.hlo_io import load_module, save_module
from disco_xla.plan import Plan
from disco_xla.search import optimize

__all__ = [
    "DiscoFallbackWarning",
    "DiscoInputError",
    "HloModule",
    "Plan",
    "capture_jax",
    "capture_tf",
    "jit",
    "load_module",
    "optimize",
    "save_module",
    "tf_function",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    # jit and tf_function import jax / tensorflow: only when asked for.
    if name == "jit":
        from disco_xla.frontends.jax_api import jit

        return jit
    if name == "tf_function":
        from disco_xla.frontends.tf_api import tf_function

        return tf_function
    raise AttributeError(f"module 'disco_xla' has no attribute {name!r}")


from disco_xla.frontends import env_hook as _env_hook  # noqa: E402 - after the package is complete

_env_hook.startup()
