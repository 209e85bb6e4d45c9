"""Backtracking search for the plan with the lowest simulated iteration time.

Best-first search with alpha relaxation, as in TASO and DisCo: a priority queue of
plans ordered by simulated time; each popped plan is expanded by local moves; a
child is kept if its time is below alpha times the best so far, and plans already
seen (by their JSON) are skipped. The search stops when its budget of evaluations
or seconds is spent. Moves:

- fuse two groups where one produces a value the other reads (merge kernels);
- split a group into two (undo a fusion);
- merge two neighbouring buckets, split a bucket in two, or move one gradient
  across the boundary between neighbouring buckets.

Which moves are tried, and in which order, comes from a seeded random generator, so
the same module, profile, seed and evaluation budget give the same plan on any
machine (a time budget may stop it earlier on a slower one).
"""

from __future__ import annotations

import heapq
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from disco_xla.errors import DiscoInputError
from disco_xla.hlo_passes.graph import HloModule
from disco_xla.plan import EXPENSIVE_OPCODES, Plan, compute_instructions, verify_plan
from disco_xla.simulator.cost_models import CostModel
from disco_xla.simulator.events import simulate
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.profiles import ClusterProfile

# A move: plan -> a neighbouring plan (not yet checked for legality).
Move = Callable[[Plan], Plan]


@dataclass(frozen=True)
class SearchResult:
    plan: Plan
    iteration_s: float
    start_plan: Plan
    start_s: float
    evaluations: int
    search_s: float


def greedy_fusion_plan(module: HloModule) -> Plan:
    """An XLA-like starting point: each instruction joins the group of its only
    user when that keeps at most one dot or convolution per group (producer-
    consumer loop fusion), and gradients are bucketed one per all-reduce."""
    compute = compute_instructions(module)
    group_of = {id(i): n for n, i in enumerate(compute)}
    members: dict[int, list] = {n: [i] for n, i in enumerate(compute)}
    expensive = {n: int(i.opcode in EXPENSIVE_OPCODES) for n, i in enumerate(compute)}
    for instr in reversed(compute):  # consumers before producers
        if len(instr.users) != 1 or id(instr.users[0]) not in group_of:
            continue
        mine, theirs = group_of[id(instr)], group_of[id(instr.users[0])]
        if mine == theirs or expensive[mine] + expensive[theirs] > 1:
            continue
        for moved in members.pop(mine):
            group_of[id(moved)] = theirs
            members[theirs].append(moved)
        expensive[theirs] += expensive.pop(mine)
    position = {id(i): n for n, i in enumerate(compute)}
    groups = sorted(
        (
            tuple(i.name for i in sorted(group, key=lambda i: position[id(i)]))
            for group in members.values()
        ),
        key=lambda g: g[0],
    )
    unfused = Plan.unfused(module)
    return replace(unfused, fusion_groups=tuple(groups))


MOVE_KINDS = ("all", "fusion", "bucketing")


def _neighbours(
    plan: Plan, module_users: dict[str, set[str]], rng: random.Random, kinds: str = "all"
) -> Iterator[Plan]:
    buckets = [list(b) for b in plan.all_reduce_buckets]
    groups = [list(g) for g in plan.fusion_groups]
    moves: list[Callable[[], Plan]] = []
    for k in range(len(buckets) - 1) if kinds != "fusion" else ():
        moves.append(
            lambda k=k: _with_buckets(
                plan, buckets[:k] + [buckets[k] + buckets[k + 1]] + buckets[k + 2 :]
            )
        )
        if len(buckets[k]) > 1:
            moves.append(
                lambda k=k: _with_buckets(
                    plan,
                    buckets[:k]
                    + [buckets[k][:-1], [buckets[k][-1]] + buckets[k + 1]]
                    + buckets[k + 2 :],
                )
            )
        if len(buckets[k + 1]) > 1:
            moves.append(
                lambda k=k: _with_buckets(
                    plan,
                    buckets[:k]
                    + [buckets[k] + [buckets[k + 1][0]], buckets[k + 1][1:]]
                    + buckets[k + 2 :],
                )
            )
    for k, bucket in enumerate(buckets if kinds != "fusion" else []):
        if len(bucket) > 1:
            middle = len(bucket) // 2
            moves.append(
                lambda k=k, m=middle: _with_buckets(
                    plan, buckets[:k] + [buckets[k][:m], buckets[k][m:]] + buckets[k + 1 :]
                )
            )
    group_of = {name: n for n, group in enumerate(groups) for name in group}
    for n, group in enumerate(groups if kinds != "bucketing" else []):
        readers = {
            group_of[u] for name in group for u in module_users.get(name, ()) if u in group_of
        }
        for m in sorted(readers - {n}):
            moves.append(lambda n=n, m=m: _fuse(plan, groups, n, m))
        if len(group) > 1:
            moves.append(lambda n=n: _split(plan, groups, n))
    rng.shuffle(moves)
    for make in moves:
        yield make()


def _with_buckets(plan: Plan, buckets) -> Plan:
    return replace(plan, all_reduce_buckets=tuple(tuple(b) for b in buckets if b))


def _fuse(plan: Plan, groups, first: int, second: int) -> Plan:
    merged = tuple(groups[first] + groups[second])
    rest = [tuple(g) for n, g in enumerate(groups) if n not in (first, second)]
    return replace(plan, fusion_groups=tuple(rest + [merged]))


def _split(plan: Plan, groups, index: int) -> Plan:
    group = groups[index]
    middle = len(group) // 2
    rest = [tuple(g) for n, g in enumerate(groups) if n != index]
    return replace(plan, fusion_groups=tuple(rest + [tuple(group[:middle]), tuple(group[middle:])]))


def search(
    module: HloModule,
    profile: ClusterProfile,
    cost_model: CostModel,
    start_plans: list[Plan],
    alpha: float = 1.05,
    budget_s: float = 60.0,
    max_evaluations: int = 1000,
    seed: int = 0,
    on_evaluation: Callable[[int, float], None] = lambda evaluations, best_s: None,
    moves: str = "all",
) -> SearchResult:
    """Best-first backtracking from the best of `start_plans` (so the result is
    never worse than any of them). `moves` limits the search to 'fusion' or
    'bucketing' moves, for the ablations."""
    if budget_s <= 0 or max_evaluations <= 0:
        raise DiscoInputError("search", "the budget must be positive")
    if moves not in MOVE_KINDS:
        raise ValueError(f"moves must be one of {MOVE_KINDS}")
    rng = random.Random(seed)
    users = {i.name: {u.name for u in i.users} for i in module.instructions()}
    started = time.perf_counter()
    evaluations = 0

    def evaluate(plan: Plan) -> float | None:
        nonlocal evaluations
        try:
            verify_plan(plan, module)
        except DiscoInputError:
            return None
        evaluations += 1
        seconds = simulate(build_task_graph(module, plan), profile, cost_model).iteration_s
        on_evaluation(evaluations, min(seconds, best_s))
        return seconds

    best_s = float("inf")
    scored = []
    for plan in start_plans:
        seconds = evaluate(plan)
        if seconds is not None:
            scored.append((seconds, plan))
            best_s = min(best_s, seconds)
    if not scored:
        raise DiscoInputError("search", "no legal start plan")
    start_s, start_plan = min(scored, key=lambda item: item[0])
    best_plan = start_plan
    seen = {plan.to_json() for _, plan in scored}
    queue = [(start_s, 0, start_plan)]
    counter = 1
    while queue and evaluations < max_evaluations and time.perf_counter() - started < budget_s:
        _, _, plan = heapq.heappop(queue)
        for child in _neighbours(plan, users, rng, moves):
            if evaluations >= max_evaluations or time.perf_counter() - started >= budget_s:
                break
            key = child.to_json()
            if key in seen:
                continue
            seen.add(key)
            seconds = evaluate(child)
            if seconds is None:
                continue
            if seconds < best_s:
                best_s, best_plan = seconds, child
            if seconds < alpha * best_s:
                heapq.heappush(queue, (seconds, counter, child))
                counter += 1
    return SearchResult(
        plan=best_plan,
        iteration_s=best_s,
        start_plan=start_plan,
        start_s=start_s,
        evaluations=evaluations,
        search_s=time.perf_counter() - started,
    )
