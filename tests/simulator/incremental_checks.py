"""A check the incremental-simulation tests share: every local change the
incremental simulation evaluates gives the full simulation's time exactly."""

from __future__ import annotations

import random

from disco_xla.hlo.graph import HloModule
from disco_xla.plan import Plan, verify_plan
from disco_xla.search.backtracking import _bucket_moves
from disco_xla.search.moves import Fuse, Split
from disco_xla.simulator.cost_models import CostModel
from disco_xla.simulator.events import PS_PER_S, simulate
from disco_xla.simulator.incremental import PlanState
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.profiles import ClusterProfile


def local_changes_match_full_simulation(
    module: HloModule,
    plan: Plan,
    profile: ClusterProfile,
    cost_model: CostModel,
    seed: int,
    bucket_moves: bool = True,
) -> int:
    """Load `plan`, evaluate every split and fusion (and bucket move) in a
    shuffled order, and assert each evaluated one is a legal plan whose full
    simulation takes the same time. Returns how many were evaluated."""
    state = PlanState(module, plan, profile, cost_model)
    full = simulate(build_task_graph(module, plan), profile, cost_model).iteration_s
    assert state.iteration_ps / PS_PER_S == full
    moves = [Split(k) for k in range(len(state.order))]
    moves += [Fuse(k, u) for k in range(len(state.order)) for u in sorted(state.succs[k])]
    if bucket_moves:
        moves += [make() for _, make in _bucket_moves(plan.all_reduce_buckets)]
    random.Random(seed).shuffle(moves)
    evaluated = 0
    for move in moves:
        seconds = move.evaluate(state)
        if seconds is None:
            continue
        child = move.child_plan(state)
        verify_plan(child, module)
        assert seconds == simulate(build_task_graph(module, child), profile, cost_model).iteration_s
        evaluated += 1
    return evaluated
