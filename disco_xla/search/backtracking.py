"""Backtracking search for the plan with the lowest simulated iteration time.

Best-first search with alpha relaxation, as in TASO and DisCo: a priority queue of
plans ordered by simulated time, capped at QUEUE_CAP plans; each popped plan is
expanded by local moves; a child is kept if its time is below alpha times the best
so far, and plans already seen are skipped. Once a popped plan has had
MIN_EXPANSION evaluations and one of its children beat the best plan, the search
goes on from the best child and puts the parent back in the queue with its other
moves, so a limited budget climbs several moves deep. The search starts from the best of
its start plans (the baselines), so the result is never worse than any of them,
and stops when its budget of evaluations or seconds is spent. Moves:

- fuse a kernel with one that reads its result directly (merge two groups); when
  XLA's own fusion is known, only inside one of XLA's groups (`within_groups`):
  the rewrite can add kernel boundaries to XLA's fusion but not take them away;
- split a group into its earlier and later half (undo a fusion);
- merge two neighbouring buckets, split a bucket in the middle, or move one
  gradient across the boundary between neighbouring buckets.

Moves are tried in three tiers (DisCo's hint that the critical path decides the
iteration time): first those that touch a kernel or bucket on the popped plan's
simulated critical path, then those that touch a kernel producing a gradient (or
its neighbours) and every other bucket move, then the rest. Within a tier the
order comes from a seeded random generator, so the same module, profile, seed and
evaluation budget give the same plan on any machine (a time budget may stop it
earlier on a slower one).

Each child is evaluated incrementally against its parent (`simulator.incremental`),
to the same picosecond as a full simulation of the child.
"""

from __future__ import annotations

import enum
import gc
import heapq
import random
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from disco_xla.errors import DiscoInputError
from disco_xla.hlo.graph import HloModule
from disco_xla.plan import Plan, verify_plan
from disco_xla.search.fusion_model import producer_consumer_fusion
from disco_xla.search.moves import Fuse, Move, Rebucket, Split
from disco_xla.settings import DEFAULTS, OptimizeSettings
from disco_xla.simulator.cost_models import CostModel
from disco_xla.simulator.events import simulate
from disco_xla.simulator.incremental import GroupCosts, PlanState
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.profiles import ClusterProfile

QUEUE_CAP = 50  # DisCo's public code caps its queue at 50 plans
# The critical path is simulated anew every this many expanded plans (a full
# simulation); in between, moves are ranked by the last one, by task name.
CRITICAL_PATH_EVERY = 8
# A popped plan is expanded by at least this many evaluations before the search
# jumps to a better child (loading a plan costs about as much as 100 evaluations).
MIN_EXPANSION = 150


@dataclass(frozen=True)
class SearchResult:
    plan: Plan
    iteration_s: float
    start_plan: Plan
    start_s: float
    evaluations: int
    search_s: float
    # The best distinct plans evaluated, best first, with their simulated
    # seconds: up to `keep` of them (`search`); the first is `plan`.
    top_plans: tuple[tuple[float, Plan], ...] = ()


def greedy_fusion_plan(module: HloModule) -> Plan:
    """An XLA-like starting point: each instruction joins the group of its only
    user when that keeps at most one dot or convolution per group (producer-
    consumer loop fusion), and gradients are bucketed one per all-reduce."""
    return producer_consumer_fusion(module, lambda producer, consumer, weight: weight <= 1)


class MoveSet(enum.Enum):
    """Which moves a search makes: every kind, or only fusion or only bucket
    moves (the ablations `fusion-only` and `bucketing-only`)."""

    ALL = "all"
    FUSION = "fusion"
    BUCKETING = "bucketing"

    @property
    def fuses(self) -> bool:
        return self is not MoveSet.BUCKETING

    @property
    def rebuckets(self) -> bool:
        return self is not MoveSet.FUSION


def _bucket_moves(buckets: tuple[tuple[str, ...], ...]) -> list[tuple[int, Callable[[], Rebucket]]]:
    """(first bucket touched, a maker of the move) for every bucket move; the
    moves are made only when tried."""
    moves = []

    def make(k: int, end: int, middle: tuple[tuple[str, ...], ...]) -> Callable[[], Rebucket]:
        return lambda: Rebucket(buckets[:k] + tuple(b for b in middle if b) + buckets[end:])

    for k in range(len(buckets) - 1):
        first, second = buckets[k], buckets[k + 1]
        moves.append((k, make(k, k + 2, (first + second,))))
        if len(first) > 1:
            moves.append((k, make(k, k + 2, (first[:-1], first[-1:] + second))))
        if len(second) > 1:
            moves.append((k, make(k, k + 2, (first + second[:1], second[1:]))))
    for k, bucket in enumerate(buckets):
        if len(bucket) > 1:
            middle = len(bucket) // 2
            moves.append((k, make(k, k + 1, (bucket[:middle], bucket[middle:]))))
    return moves


def critical_names(state: PlanState) -> set[str]:
    """Names of the kernels and communication tasks on the plan's simulated
    critical path (a full simulation of the plan)."""
    graph = build_task_graph(state.module, state.plan)
    result = simulate(graph, state.profile, state.cost_model, state.comm_cost)
    return set(result.critical_path)


def _critical(state: PlanState, names: set[str]) -> tuple[set[int], set[int]]:
    """Kernels and buckets of `state` whose names are in `names`."""
    kernels = set()
    for kernel, (group, key) in enumerate(state.instances):
        name = state.groups[group][0] + (f"@{key[-1]}" if key else "")
        if name in names:
            kernels.add(kernel)
    buckets = set()
    for number, bucket in enumerate(state.buckets):
        label = bucket[0] if len(bucket) == 1 else f"bucket[{bucket[0]}..{bucket[-1]}]"
        if label in names:
            buckets.add(number)
    return kernels, buckets


def _group_numbers(groups: tuple[tuple[str, ...], ...]) -> dict[str, int]:
    """Each grouped name's group number."""
    return {name: number for number, group in enumerate(groups) for name in group}


def _refines(plan: Plan, group_of_name: dict[str, int]) -> bool:
    """Whether each of the plan's groups lies inside one of the numbered groups."""
    return all(len({group_of_name.get(n, -1) for n in group}) == 1 for group in plan.fusion_groups)


def _neighbours(
    state: PlanState,
    rng: random.Random,
    kinds: MoveSet = MoveSet.ALL,
    critical: set[str] | None = None,
    group_of_name: dict[str, int] | None = None,
) -> Iterator[Move]:
    """The popped plan's moves, critical path first (see the module docstring);
    `critical` names the critical path's tasks (by default, this plan's). With
    `group_of_name`, kernels are fused only inside one of its groups."""
    names = critical_names(state) if critical is None else critical
    critical_kernels, critical_buckets = _critical(state, names)
    producers: set[int] = set()
    for kernels in state.producers[: len(state.buckets)]:
        producers.update(kernels)
    around = set(producers)
    for kernel in producers:
        around.update(state.preds[kernel])
        around.update(state.succs[kernel])
    tiers: list[list[Move]] = [[], [], []]
    if kinds.fuses:
        index = state.index
        if group_of_name is not None:
            within = [
                group_of_name.get(index.atoms[atoms[0]][0].name, -1 - kernel)
                for kernel, atoms in enumerate(state.atoms)
            ]
        for kernel in range(len(state.order)):
            readers = set()
            for atom in state.atoms[kernel]:
                for user in index.direct_users[atom]:
                    reader = state.kernel_of_atom.get(user)
                    if reader is not None and reader != kernel:
                        readers.add(reader)
            for reader in sorted(readers):
                if group_of_name is not None and within[kernel] != within[reader]:
                    continue
                touched = (kernel, reader)
                tier = (
                    0
                    if critical_kernels.intersection(touched)
                    else (1 if around.intersection(touched) else 2)
                )
                tiers[tier].append(Fuse(kernel, reader))
            if state.splittable(kernel):
                tier = 0 if kernel in critical_kernels else (1 if kernel in around else 2)
                tiers[tier].append(Split(kernel))
    if kinds.rebuckets:
        for first, move in _bucket_moves(state.buckets):
            touched_buckets = {first, first + 1}
            producer_kernels = set(state.producers[first])
            if first + 1 < len(state.buckets):
                producer_kernels.update(state.producers[first + 1])
            critical = touched_buckets & critical_buckets or producer_kernels & critical_kernels
            tiers[0 if critical else 1].append(move)
    for tier in tiers:
        rng.shuffle(tier)
        for move in tier:
            yield move() if callable(move) else move


_MASK = (1 << 64) - 1


def _group_hash(names) -> int:
    """A hash of a group's set of names that merging two groups adds up."""
    return sum(hash(n) for n in names) & _MASK


def _mix(group_hash: int) -> int:
    """SplitMix64's finaliser: a non-linear mix, so that sums of mixed group
    hashes do not cancel (a sum of Python tuple hashes can)."""
    z = (group_hash + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _groups_key(groups) -> int:
    """A hash of a set of fusion groups that one move can update in O(1)."""
    return sum(_mix(_group_hash(g)) for g in groups) & _MASK


def _child_key(state: PlanState, groups_key: int, move: Move, group_hashes) -> tuple[int, int]:
    """(groups key, buckets hash) of the plan `move` makes, for the seen-set."""
    if isinstance(move, Rebucket):
        return groups_key, hash(move.buckets)
    instances = state.instances
    if isinstance(move, Fuse):
        first = group_hashes[instances[move.first][0]]
        second = group_hashes[instances[move.second][0]]
        key = groups_key - _mix(first) - _mix(second) + _mix((first + second) & _MASK)
    else:
        whole = group_hashes[instances[move.kernel][0]]
        low, high = state.halves(move.kernel)
        key = groups_key - _mix(whole) + _mix(_group_hash(low)) + _mix(_group_hash(high))
    return key & _MASK, state.buckets_hash


@dataclass(frozen=True)
class _Steering:
    """What steers one search besides its `OptimizeSettings`: the kinds of move,
    how many plans it keeps, and XLA's own groups as each grouped name's group
    number (`within_groups`)."""

    settings: OptimizeSettings
    moves: MoveSet
    keep: int
    group_of_name: Mapping[str, int] | None


def search(
    module: HloModule,
    profile: ClusterProfile,
    cost_model: CostModel,
    start_plans: list[Plan],
    settings: OptimizeSettings = DEFAULTS,
    *,
    moves: MoveSet = MoveSet.ALL,
    keep: int = 1,
    costs: GroupCosts | None = None,
    within_groups: tuple[tuple[str, ...], ...] | None = None,
    on_evaluation: Callable[[int, float], None] = lambda evaluations, best_s: None,
) -> SearchResult:
    """Best-first backtracking from the best of `start_plans` (so the result is
    never worse than any of them), within the budget of `settings` (`budget_s`,
    `max_evaluations`), relaxed by its `alpha`, with its `seed` breaking ties.
    The result also holds the `keep` best
    distinct plans it evaluated (`SearchResult.top_plans`), the candidates to
    measure. `moves` limits the search to fusion or
    bucket moves (`MoveSet`), for the ablations. The start plans' simulations count as
    evaluations. `costs` caches kernel times across searches of one module and
    cost model.

    `within_groups` (XLA's own fusion groups) keeps every plan a refinement of
    them: a fuse move may only join kernels inside one of XLA's groups, and start
    plans that are not refinements are skipped. The rewrite can only add
    boundaries (`hlo_passes.fusion_boundaries`); a group that joins two of XLA's
    kernels is not one kernel when the program runs, so the search may not
    promise it."""
    if settings.budget_s <= 0 or settings.max_evaluations <= 0:
        raise DiscoInputError("search", "the budget must be positive")
    group_of_name = None if within_groups is None else _group_numbers(within_groups)
    steering = _Steering(settings, moves, keep, group_of_name)
    costs = costs or GroupCosts(module, cost_model, profile.kernel_time_scale)
    # The search only allocates; with a large module in memory every garbage
    # collection is slow, so collection pauses meanwhile (as in `simulate`).
    collecting = gc.isenabled()
    gc.disable()
    try:
        run = _SearchRun(module, profile, cost_model, costs, steering, on_evaluation)
        return run.run(start_plans)
    finally:
        if collecting:
            gc.enable()


class _SearchRun:
    """One search under way: its evaluations, the best plan so far, the plans
    seen (`_child_key`), the queue of plans to expand and the best plans kept."""

    def __init__(
        self,
        module: HloModule,
        profile: ClusterProfile,
        cost_model: CostModel,
        costs: GroupCosts,
        steering: _Steering,
        on_evaluation: Callable[[int, float], None],
    ):
        self.module, self.profile, self.cost_model, self.costs = module, profile, cost_model, costs
        self.steering, self.on_evaluation = steering, on_evaluation
        self.rng = random.Random(steering.settings.seed)
        self.started = time.perf_counter()
        self.evaluations = 0
        self.best_s = float("inf")
        self.best_plan: Plan | None = None
        self.seen: set[tuple[int, int]] = set()
        self.queue: list[tuple[float, int, Plan]] = []  # (seconds, push number, plan)
        self.pushed = 0
        self.kept = _Best(steering.keep)

    def out_of_budget(self) -> bool:
        steering = self.steering
        return (
            self.evaluations >= steering.settings.max_evaluations
            or time.perf_counter() - self.started >= steering.settings.budget_s
        )

    def load(self, plan: Plan) -> PlanState:
        return PlanState(self.module, plan, self.profile, self.cost_model, costs=self.costs)

    def push(self, seconds: float, plan: Plan) -> None:
        heapq.heappush(self.queue, (seconds, self.pushed, plan))
        self.pushed += 1

    def run(self, start_plans: list[Plan]) -> SearchResult:
        """Expand the best queued plan until the queue or the budget runs out."""
        start_s, start_plan = self.score_starts(start_plans)
        self.best_plan = start_plan
        self.push(start_s, start_plan)
        pops = 0
        critical: set[str] = set()
        while self.queue and not self.out_of_budget():
            parent_s, _, plan = heapq.heappop(self.queue)
            state = self.load(plan)
            if pops % CRITICAL_PATH_EVERY == 0:
                critical = critical_names(state)
            pops += 1
            self.expand(state, parent_s, critical)
            if len(self.queue) > 2 * QUEUE_CAP:
                self.queue = heapq.nsmallest(QUEUE_CAP, self.queue)
        return SearchResult(
            plan=self.best_plan,
            iteration_s=self.best_s,
            start_plan=start_plan,
            start_s=start_s,
            evaluations=self.evaluations,
            search_s=time.perf_counter() - self.started,
            top_plans=self.kept.best_first(),
        )

    def score_starts(self, start_plans: list[Plan]) -> tuple[float, Plan]:
        """Simulate each legal, distinct start plan; (seconds, plan) of the best.
        Start plans that share a fusion share one loaded state."""
        scored = []
        states: dict[tuple, PlanState] = {}
        for plan in start_plans:
            key = (_groups_key(plan.fusion_groups), hash(plan.all_reduce_buckets))
            if key in self.seen:
                continue
            self.seen.add(key)
            if not self._may_start(plan):
                continue
            loaded = states.get(plan.fusion_groups)
            if loaded is None:
                loaded = states[plan.fusion_groups] = self.load(plan)
            if loaded.plan.all_reduce_buckets == plan.all_reduce_buckets:
                seconds = loaded.iteration_ps / 1e12
            else:
                seconds = loaded.evaluate_buckets(plan.all_reduce_buckets)
            self.evaluations += 1
            self.best_s = min(self.best_s, seconds)
            self.on_evaluation(self.evaluations, self.best_s)
            scored.append((seconds, len(scored), plan))
            if self.kept.wants(seconds):
                self.kept.add(seconds, plan)
        if not scored:
            raise DiscoInputError("search", "no legal start plan")
        start_s, _, start_plan = min(scored)
        return start_s, start_plan

    def _may_start(self, plan: Plan) -> bool:
        """Whether `plan` is legal and, with XLA's groups known, refines them."""
        try:
            verify_plan(plan, self.module)
        except DiscoInputError:
            return False
        group_of_name = self.steering.group_of_name
        return group_of_name is None or _refines(plan, group_of_name)

    def expand(self, state: PlanState, parent_s: float, critical: set[str]) -> None:
        """Evaluate the moves of a popped plan; once it has had MIN_EXPANSION
        evaluations and one of them beat the best plan, put it back in the queue
        (with its other moves) so the search goes on from the better child."""
        steering = self.steering
        group_hashes = [_group_hash(g) for g in state.plan.fusion_groups]
        groups_key = sum(_mix(h) for h in group_hashes) & _MASK
        expanded, improved_here = 0, False
        moves = _neighbours(state, self.rng, steering.moves, critical, steering.group_of_name)
        for move in moves:
            if self.out_of_budget():
                break
            key = _child_key(state, groups_key, move, group_hashes)
            if key in self.seen:
                continue
            seconds = move.evaluate(state)
            if seconds is None:
                continue
            self.seen.add(key)
            improved = self.record(state, move, seconds)
            expanded += 1
            if improved_here := improved_here or improved:
                if expanded >= MIN_EXPANSION:
                    self.push(parent_s, state.plan)
                    break

    def record(self, state: PlanState, move: Move, seconds: float) -> bool:
        """Count an evaluated move: the best plan, the kept plans, and the queue
        when within alpha of the best. Returns whether it beat the best."""
        self.evaluations += 1
        improved = seconds < self.best_s
        if improved:
            self.best_s, self.best_plan = seconds, move.child_plan(state)
        if self.kept.wants(seconds):
            self.kept.add(seconds, self.best_plan if improved else move.child_plan(state))
        self.on_evaluation(self.evaluations, self.best_s)
        if seconds < self.steering.settings.alpha * self.best_s:
            self.push(seconds, self.best_plan if improved else move.child_plan(state))
        return improved


class _Best:
    """The `size` lowest-time plans added; on a tie, the earlier stays."""

    def __init__(self, size: int):
        self.size = size
        self._heap: list[tuple[float, int, Plan]] = []  # (-seconds, -order, plan)
        self._added = 0

    def wants(self, seconds: float) -> bool:
        """Whether a plan of `seconds` would be kept (build it only then)."""
        return len(self._heap) < self.size or -seconds > self._heap[0][0]

    def add(self, seconds: float, plan: Plan) -> None:
        self._added += 1
        entry = (-seconds, -self._added, plan)
        if len(self._heap) < self.size:
            heapq.heappush(self._heap, entry)
        else:
            heapq.heapreplace(self._heap, entry)

    def best_first(self) -> tuple[tuple[float, Plan], ...]:
        return tuple((-s, plan) for s, _, plan in sorted(self._heap, reverse=True))
