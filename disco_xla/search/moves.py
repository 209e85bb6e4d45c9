"""The search's moves: local changes of a loaded plan (`simulator.incremental.
PlanState`), each evaluated incrementally against it and turned into the plan
it makes. Kernels are numbered as the loaded plan numbers them."""

from __future__ import annotations

from dataclasses import dataclass

from disco_xla.plan import Plan
from disco_xla.simulator.incremental import PlanState


@dataclass(frozen=True)
class Fuse:
    """Fuse kernel `second` into kernel `first` (`second` reads `first` directly)."""

    first: int
    second: int

    def evaluate(self, state: PlanState) -> float | None:
        return state.evaluate_fuse(self.first, self.second)

    def child_plan(self, state: PlanState) -> Plan:
        return state.fused_plan(self.first, self.second)


@dataclass(frozen=True)
class Split:
    """Split a kernel into the earlier and the later half of its instructions."""

    kernel: int

    def evaluate(self, state: PlanState) -> float | None:
        return state.evaluate_split(self.kernel)

    def child_plan(self, state: PlanState) -> Plan:
        return state.split_plan(self.kernel)


@dataclass(frozen=True)
class Rebucket:
    """Replace the plan's all-reduce buckets."""

    buckets: tuple[tuple[str, ...], ...]

    def evaluate(self, state: PlanState) -> float | None:
        return state.evaluate_buckets(self.buckets)

    def child_plan(self, state: PlanState) -> Plan:
        return state.rebucketed_plan(self.buckets)


# A move: one local change of a loaded plan. `move.evaluate(state)` gives the
# simulated iteration seconds of the plan it makes (None: illegal, or not
# evaluated), `move.child_plan(state)` that plan.
Move = Fuse | Split | Rebucket
