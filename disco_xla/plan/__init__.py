"""The strategy type and the one verifier of legality. A plan has five
dimensions, one module each, listed once in `core.DIMENSIONS` in the order the
rewrite applies them:

- `fusion`: which compute instructions run as one kernel;
- `all_reduce_buckets`: how the gradient all-reduces (and reduce-scatters) are
  grouped into buckets;
- `all_gather_buckets`: how the all-gathers are grouped;
- `chunks`: which collectives are split into chunks with the dots next to them;
- `prefetch`: which all-gathers are issued a loop trip ahead.

A plan speaks of IR names only, so it is plain data: it serialises to JSON, and
can be cached, shown, diffed and applied to the module it was made for (checked
by the module's fingerprint). What the other layers use is named here.
"""

from disco_xla.plan.all_gather_buckets import (
    all_gather_dependencies,
    all_gather_kinds,
    all_gathers,
)
from disco_xla.plan.all_reduce_buckets import (
    bucket_kinds,
    gradient_all_reduces_in_order,
    gradient_dependencies,
)
from disco_xla.plan.buckets import buckets_follow_dependencies
from disco_xla.plan.core import (
    DIMENSIONS,
    IDENTITY_FIELDS,
    PLAN_FORMAT,
    Plan,
    dimension_named,
    verify_plan,
)
from disco_xla.plan.dimension import Dimension
from disco_xla.plan.fusion import (
    EXPENSIVE_OPCODES,
    NOT_FUSIBLE_OPCODES,
    compute_instructions,
    departing_groups,
    fusion_weight,
    is_compute,
    needs_boundary,
)
from disco_xla.plan.prefetch import prefetchable_all_gathers

__all__ = [
    "DIMENSIONS",
    "EXPENSIVE_OPCODES",
    "IDENTITY_FIELDS",
    "NOT_FUSIBLE_OPCODES",
    "PLAN_FORMAT",
    "Dimension",
    "Plan",
    "all_gather_dependencies",
    "all_gather_kinds",
    "all_gathers",
    "bucket_kinds",
    "buckets_follow_dependencies",
    "compute_instructions",
    "departing_groups",
    "dimension_named",
    "fusion_weight",
    "gradient_all_reduces_in_order",
    "gradient_dependencies",
    "is_compute",
    "needs_boundary",
    "prefetchable_all_gathers",
    "verify_plan",
]
