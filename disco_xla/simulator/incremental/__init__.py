"""Incremental re-simulation: the iteration time of a plan one local change away
from a loaded plan, without rebuilding the task graph or replaying every kernel.

A `PlanState` (`state`) holds one plan's kernels, their order, durations and
dependencies. `evaluate_fuse`, `evaluate_split` and `evaluate_buckets` give the
iteration time of the neighbouring plan that the fusion of two kernels, the
split of one, or other buckets make, equal to
`simulate(build_task_graph(module, child))` for that plan (`fused_plan`,
`split_plan`, `rebucketed_plan`) to the picosecond. It shares with the full
simulator what makes the two agree:

- the kernels, their dependencies and their order come from `plan_kernels`, as
  `build_task_graph`'s do; after a fusion or a split the order is re-run only
  from the first changed kernel until the set of kernels run so far is the
  parent's again, from where both orders are the same (`moves`);
- the `gpu-streams` timeline is `streams.streams_iteration_ps`, which visits
  only the kernels that read collective results and the last producer of each
  communication task; between them the compute stream advances by differences
  of prefix sums;
- kernel durations come from the cost model once per fusion group and are
  cached (`costs.GroupCosts`), so that loading a plan mostly joins cached parts;
- a fusion or split whose reordered stretch ends before the first of those
  kernels moves every later time by the same amount: the iteration time is the
  parent's plus the stretch's change in duration.

Profiles with the `cpu-threads` model have no such shortcut: the child's task
graph is built and simulated in full.
"""

from disco_xla.simulator.incremental.costs import GroupCosts
from disco_xla.simulator.incremental.moves import MAX_FUSE_DISTANCE, MAX_REORDER_KERNELS
from disco_xla.simulator.incremental.state import PlanState

__all__ = ["MAX_FUSE_DISTANCE", "MAX_REORDER_KERNELS", "GroupCosts", "PlanState"]
