"""disco-xla: joint op-fusion and all-reduce bucketing for data-parallel XLA training.

The public surface is small; everything else is internal and may change.
"""

from disco_xla.capture import capture_jax, capture_tf
from disco_xla.errors import DiscoInputError
from disco_xla.hlo_passes.graph import HloModule
from disco_xla.hlo_passes.hlo_io import load_module, save_module
from disco_xla.plan import Plan
from disco_xla.search import optimize

__all__ = [
    "DiscoInputError",
    "HloModule",
    "Plan",
    "capture_jax",
    "capture_tf",
    "load_module",
    "optimize",
    "save_module",
]
__version__ = "0.1.0"
