"""The event simulator: one training iteration of a plan, task by task.

Two execution models, chosen by the profile:

- `gpu-streams`: one in-order compute stream runs the kernels in a topological
  order; buckets run in plan order on the communication stream(s), each starting
  when all its gradients are produced and its stream is free; a kernel that reads
  an all-reduce result waits for its bucket. A bucket of several gradients costs
  a concatenation copy before it and a split copy after it on the compute stream
  (memory-bound: bytes read and written at memory bandwidth). Collectives that are
  not gradient buckets (a loss mean, an all-gather of FSDP parameters, any
  other kind: `comm.collective_s`) run on a stream of their own. When the task
  graph says collectives block compute (XLA:GPU without its latency-hiding
  scheduler), each collective runs as soon as it is ready, and the compute stream
  waits for it.
- `cpu-threads`: K executor threads take ready tasks in priority order; a
  collective occupies its thread for its whole duration (XLA:CPU has no
  asynchronous collectives), and first waits for the slowest worker when the
  profile says how far behind it falls (`worker_lag`). With `overlap: false`
  everything runs one at a time.

Time is counted in integer picoseconds (durations rounded once), so sums are
exact. Iteration time is the finish time of the last task. Exposed communication is the
time communication runs while no compute does. T_ideal = max(C, A), C the sum of
kernel times, A one all-reduce of every gradient byte. The critical path and the
collectives' ready times are worked out when first read (the search reads the
path of a few plans only).
"""

from __future__ import annotations

import gc
import heapq
from dataclasses import dataclass, field
from functools import cached_property
from itertools import accumulate, chain, compress, repeat
from operator import attrgetter, itemgetter
from typing import NamedTuple

import numpy as np

from disco_xla.simulator.comm import CommCostFn, all_reduce_s, collective_s
from disco_xla.simulator.cost_models import CostModel
from disco_xla.simulator.kernels import TaskGraph
from disco_xla.simulator.profiles import ClusterProfile

PS_PER_S = 10**12  # the simulator counts integer picoseconds
ALL_REDUCE = "all-reduce"  # the kind of a gradient bucket's event
# Events of these kinds are compute; any other kind names a collective.
COMPUTE_KINDS = frozenset({"kernel", "copy"})


class Event(NamedTuple):
    name: str
    lane: str  # 'compute', 'comm 0', 'thread 1', ...
    kind: str  # 'kernel', 'copy', or the collective's kind ('all-reduce', 'all-gather', ...)
    start_s: float
    end_s: float


class _Timeline:
    """What a run leaves for the results read on demand: each task's finish time
    (ps) and, per task, the task whose end set its start. The `gpu-streams` run
    records that task as it goes (`bound`); the thread schedulers leave their run
    order instead, and the task is worked out when asked for: the input that
    ended last if it ended at the start, else the task before on the same thread."""

    def __init__(self, graph: TaskGraph, finish: list, bound=None, run_order=None, spans=None):
        self.graph, self.finish, self.bound = graph, finish, bound
        self.run_order, self.spans = run_order, spans

    def critical_path(self) -> tuple[str, ...]:
        """From the task that ends last, back through the task that set each start."""
        finish = self.finish
        if not finish:
            return ()
        graph = self.graph
        kernels = len(graph.kernels)
        bound_of = self.bound.__getitem__ if self.bound is not None else self._thread_bound()
        task = finish.index(max(finish))  # the first task that ends last
        path = []
        seen = set()
        while task is not None and task not in seen:
            seen.add(task)
            path.append(
                graph.kernels[task].name
                if task < kernels
                else graph.communications[task - kernels][0]
            )
            task = bound_of(task)
        return tuple(reversed(path))

    def _thread_bound(self):
        """The thread schedulers' task that set each start (see the class)."""
        run_order, spans = self.run_order, self.spans
        place = [0] * len(run_order)
        previous_on_lane: list[int | None] = [None] * len(run_order)
        last: dict[str, int] = {}
        for index, task in enumerate(run_order):
            place[task] = index
            lane = spans[index][1]
            previous_on_lane[index] = last.get(lane)
            last[lane] = task
        dependencies, finish = self.graph.dependencies, self.finish

        def bound_of(task: int) -> int | None:
            index = place[task]
            latest, latest_end = None, -1
            for dep in dependencies[task]:
                if finish[dep] > latest_end:
                    latest, latest_end = dep, finish[dep]
            if latest is None or latest_end < spans[index][3]:
                return previous_on_lane[index]
            return latest

        return bound_of

    def collective_ready_s(self) -> dict[str, float]:
        graph, finish = self.graph, self.finish
        dependencies, kernels = graph.dependencies, len(graph.kernels)
        return {
            name: max((finish[d] for d in dependencies[kernels + c]), default=0) / PS_PER_S
            for c, (name, _, _) in enumerate(graph.communications)
        }


# What `summary()` reports, in this order.
_SUMMARY_FIELDS = (
    "iteration_s",
    "compute_s",
    "comm_s",
    "exposed_comm_s",
    "overlap_ratio",
    "ideal_s",
    "t_over_ideal",
    "critical_path",
    "cost_model",
    "execution",
    "kernels",
    "buckets",
    "collectives",
    "collective_ready_s",
)


@dataclass(frozen=True)
class SimulationResult:
    iteration_s: float
    compute_s: float  # busy time of kernels and copies
    comm_s: float  # busy time of collectives
    exposed_comm_s: float
    overlap_ratio: float  # share of communication hidden behind compute
    ideal_s: float
    t_over_ideal: float
    cost_model: str
    execution: str
    kernels: int
    buckets: int  # gradient buckets of the plan
    collectives: int  # buckets and other collectives (such as a loss mean)
    spans_ps: tuple[tuple, ...]  # the events as plain tuples, times in integer ps
    # The critical path and the ready times are worked out from it on first read.
    _timeline: _Timeline = field(repr=False, compare=False)

    @cached_property
    def critical_path(self) -> tuple[str, ...]:
        """Task names from the first to the one that ends last, each the task whose
        end set the next one's start."""
        return self._timeline.critical_path()

    @cached_property
    def collective_ready_s(self) -> dict[str, float]:
        """When each collective's inputs were all ready, by collective name."""
        return self._timeline.collective_ready_s()

    @property
    def spans(self) -> tuple[tuple, ...]:
        """The events as plain tuples in Event's field order (times in seconds)."""
        return tuple(
            (name, lane, kind, start / PS_PER_S, end / PS_PER_S)
            for name, lane, kind, start, end in self.spans_ps
        )

    @property
    def events(self) -> tuple[Event, ...]:
        return tuple(Event._make(span) for span in self.spans)

    def summary(self) -> dict:
        """Everything but the events, for JSON."""
        data = {name: getattr(self, name) for name in _SUMMARY_FIELDS}
        data["critical_path"] = list(self.critical_path)
        return data


def simulate(
    graph: TaskGraph,
    profile: ClusterProfile,
    cost_model: CostModel,
    comm_cost: CommCostFn = all_reduce_s,
    ideal_compute_s: float | None = None,
    step_buffers: int = 0,
) -> SimulationResult:
    """Simulate one iteration. `ideal_compute_s` is C of T_ideal = max(C, A): the
    kernel time of XLA's fused module when the caller has it, else this plan's own.
    A task inside a `while` body counts its duration times the loop's trips
    (`TaskGraph.kernel_runs`), and so does its share of C and A.
    The iteration and T_ideal include the host's cost of the step, the profile's
    step_overhead_s + step_buffer_s · `step_buffers` (the step's argument and
    result buffers; 0 on profiles that do not measure it). Kernel times are
    multiplied by the profile's kernel_time_scale (1 unless measured).
    Garbage collection pauses meanwhile: the run only allocates, and a large module
    makes every collection slow."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _simulate(graph, profile, cost_model, comm_cost, ideal_compute_s, step_buffers)
    finally:
        if collecting:
            gc.enable()


def to_ps(seconds: float) -> int:
    """A duration in whole picoseconds. Integer time makes every sum exact, so a
    simulation that adds the same durations in another order (the incremental
    one) gives bit-equal times."""
    return round(seconds * PS_PER_S)


def communication_ps(
    size_bytes: int,
    members: int,
    profile: ClusterProfile,
    comm_cost: CommCostFn,
    tuple_element_bytes: tuple[int, ...] = (),
    kind: str = ALL_REDUCE,
) -> tuple[int, int]:
    """(transfer, one copy) of a communication task, in picoseconds: collective
    `kind` (`comm.collective_s`) of `size_bytes`. A bucket of
    several gradients sent as one message pays a concatenation before and a split
    after, each reading and writing its bytes at memory bandwidth, plus a launch.
    A tuple all-reduce (`tuple_element_bytes`, one size per tensor) copies
    nothing, and pays the profile's `tuple_all_reduce_element_s` for each tensor
    after the first: XLA:CPU sends them one after another."""
    if tuple_element_bytes:
        extra_s = (len(tuple_element_bytes) - 1) * profile.tuple_all_reduce_element_s
        return to_ps(collective_s(kind, size_bytes, profile, comm_cost) + extra_s), 0
    copy_s = (
        2 * size_bytes / profile.memory_bandwidth_bytes_per_s + profile.kernel_launch_s
        if members > 1
        else 0.0
    )
    return to_ps(collective_s(kind, size_bytes, profile, comm_cost)), to_ps(copy_s)


def graph_communication_ps(
    graph: TaskGraph, profile: ClusterProfile, comm_cost: CommCostFn
) -> tuple[list[int], list[int]]:
    """`communication_ps` of every communication task of `graph`: (transfer
    times, copy times). The cost depends only on (bytes, several members or one,
    tuple element sizes, kind), so it is computed once per distinct such key. A
    task in a loop body counts every trip (`TaskGraph.communication_runs`)."""
    communications = graph.communications
    elements = graph.tuple_element_bytes[: len(communications)]
    elements = elements + [()] * (len(communications) - len(elements))
    several = map((1).__lt__, map(len, map(itemgetter(2), communications)))
    kinds = list(map(graph.communication_kind, range(len(communications))))
    keys = list(zip(map(itemgetter(1), communications), several, elements, kinds, strict=True))
    costs = {
        key: communication_ps(key[0], 2 if key[1] else 1, profile, comm_cost, key[2], key[3])
        for key in dict.fromkeys(keys)
    }
    found = list(map(costs.__getitem__, keys))
    transfer_ps = list(map(itemgetter(0), found))
    copy_ps = list(map(itemgetter(1), found))
    runs = graph.communication_runs
    return times_runs(transfer_ps, runs), times_runs(copy_ps, runs)


def _simulate(
    graph, profile, cost_model, comm_cost, ideal_compute_s, step_buffers=0
) -> SimulationResult:
    kernel_s = cost_model.kernels_s(graph)
    if profile.kernel_time_scale != 1.0:  # workers sharing cores (a calibrated CPU profile)
        kernel_s = np.asarray(kernel_s, dtype=np.float64) * profile.kernel_time_scale
    # round() and np.rint both round half to even: the same integers as to_ps.
    kernel_ps = np.rint(np.asarray(kernel_s, dtype=np.float64) * PS_PER_S).astype(np.int64).tolist()
    kernel_ps = times_runs(kernel_ps, graph.kernel_runs)
    comm_task_ps, copy_ps = graph_communication_ps(graph, profile, comm_cost)
    # The host's cost of the step (dispatch to every worker, results handed back)
    # is counted before the devices start: every event moves by it (0 unless a
    # calibrated CPU profile measured it).
    step_ps = to_ps(profile.step_overhead_s + profile.step_buffer_s * step_buffers)
    if profile.execution == "gpu-streams":
        events, finish, bound = _run_streams(graph, kernel_ps, comm_task_ps, copy_ps, profile)
        events, finish = _after_host(events, finish, step_ps)
        timeline = _Timeline(graph, finish, bound=bound)
    else:
        threads = max(1, profile.compute_threads) if profile.overlap else 1
        run = _run_one_thread if threads == 1 else _run_threads
        events, finish, run_order = run(graph, kernel_ps, comm_task_ps, copy_ps, profile)
        events, finish = _after_host(events, finish, step_ps)
        timeline = _Timeline(graph, finish, run_order=run_order, spans=events)
    iteration_ps, compute_ps, comm_ps, exposed_ps = busy_ps(events)
    iteration_ps = max(iteration_ps, step_ps)  # a step with no event still costs the host
    sent_bytes = times_runs(
        list(map(itemgetter(1), graph.communications)), graph.communication_runs
    )
    gradient_bytes = sum(compress(sent_bytes, graph.is_bucket))
    compute_bound = sum(kernel_ps) / PS_PER_S if ideal_compute_s is None else ideal_compute_s
    ideal = max(compute_bound, comm_cost(gradient_bytes, profile)) + step_ps / PS_PER_S
    iteration_s = iteration_ps / PS_PER_S
    return SimulationResult(
        iteration_s=iteration_s,
        compute_s=compute_ps / PS_PER_S,
        comm_s=comm_ps / PS_PER_S,
        exposed_comm_s=max(exposed_ps, 0) / PS_PER_S,
        overlap_ratio=1 - exposed_ps / comm_ps if comm_ps > 0 else 1.0,
        ideal_s=ideal,
        t_over_ideal=iteration_s / ideal if ideal > 0 else 1.0,
        cost_model=cost_model.name,
        execution=profile.execution + ("" if profile.overlap else " (no overlap)"),
        kernels=len(graph.kernels),
        buckets=sum(graph.is_bucket),
        collectives=len(graph.communications),
        spans_ps=tuple(events),
        _timeline=timeline,
    )


def times_runs(durations: list[int], runs: list[int]) -> list[int]:
    """Each duration times its task's runs in one step (`TaskGraph.kernel_runs`;
    a missing count is 1): a task in a loop body runs once, for all its trips."""
    if not runs or all(count == 1 for count in runs):
        return durations
    runs = runs + [1] * (len(durations) - len(runs))
    return [duration * count for duration, count in zip(durations, runs, strict=False)]


def _after_host(events: list, finish: list, step_ps: int) -> tuple[list, list]:
    """The events and finish times moved later by the host's `step_ps`."""
    if not step_ps:
        return events, finish
    moved = [
        (name, lane, kind, start + step_ps, end + step_ps)
        for name, lane, kind, start, end in events
    ]
    return moved, [end + step_ps for end in finish]


def busy_ps(spans_ps) -> tuple[int, int, int, int]:
    """(iteration, compute busy, communication busy, exposed communication) of
    event tuples in Event's field order with integer times: the last end; the
    summed lengths of the non-collective events and of the collective ones; and
    the time a collective runs while nothing else does, which is the length of
    the union of all events less that of the union of the compute events
    (|comm| - |comm ∩ compute| = |comm ∪ compute| - |compute|)."""
    if not spans_ps:
        return 0, 0, 0, 0
    _, _, kinds, starts, ends = zip(*spans_ps, strict=True)
    last_end = max(ends)
    # int64 holds every sum below unless the times are absurdly large (then exact
    # Python integers in object arrays).
    dtype = np.int64 if last_end < 2**62 // (len(ends) + 1) else object
    start = np.array(starts, dtype=dtype)
    end = np.array(ends, dtype=dtype)
    is_comm = np.fromiter(
        (kind not in COMPUTE_KINDS for kind in kinds), dtype=bool, count=len(kinds)
    )
    duration = end - start
    comm_ps = int(duration[is_comm].sum())
    compute_ps = int(duration.sum()) - comm_ps
    is_compute = ~is_comm
    exposed_ps = _union_ps(start, end) - _union_ps(start[is_compute], end[is_compute])
    return int(last_end), compute_ps, comm_ps, exposed_ps


def _union_ps(start: np.ndarray, end: np.ndarray) -> int:
    """The length of the union of the intervals [start, end): sorted by start, the
    span from the first start to the furthest end less the gaps, where a start
    lies beyond every end before it."""
    if len(start) == 0:
        return 0
    order = np.argsort(start, kind="stable")
    start = start[order]
    reach = np.maximum.accumulate(end[order])
    gaps = start[1:] - reach[:-1]
    return int(reach[-1] - start[0]) - int(gaps[gaps > 0].sum())


def _run_streams(graph, kernel_s, comm_task_s, copy_s, profile):
    """The compute stream in order, buckets in plan order on their streams (times in ps)."""
    kernels, comms = len(graph.kernels), len(graph.communications)
    dependencies = graph.dependencies
    finish: list[int | None] = [None] * (kernels + comms)
    bound: list[int | None] = [None] * (kernels + comms)  # the task that set the start
    events: list[tuple] = []  # Event fields, as plain tuples while running
    append = events.append
    compute_free, last_compute = 0, None
    streams = max(1, profile.communication_streams)
    comm_free = [0] * (streams + 1)  # the extra stream serves non-bucket collectives
    last_on_stream: list[int | None] = [None] * (streams + 1)
    lanes = [f"comm {stream}" for stream in range(streams)] + ["comm (other)"]
    # Kernels run in order, so a kernel only ever waits on communication; a
    # collective waits for its last producing kernel (and any collective before it).
    kernel_waits_on = graph.kernel_waits_on
    comm_waits_on = graph.comm_waits_on
    last_producer = graph.last_producer
    is_bucket = graph.is_bucket
    concat_after: dict[int, list[int]] = {}
    for c in range(comms):
        if copy_s[c] > 0:
            concat_after.setdefault(last_producer[c], []).append(c)
    concat_end: dict[int, int] = {}
    split_done: set[int] = set()
    names = list(map(attrgetter("name"), graph.kernels))
    comm_names = [name for name, _, _ in graph.communications]
    comm_kinds = list(map(graph.communication_kind, range(comms)))
    blocking = graph.collectives_block_compute

    def run_concats(after: int) -> None:
        nonlocal compute_free
        for c in concat_after.get(after, ()):
            start = max([compute_free] + [finish[d] for d in dependencies[kernels + c]])
            end = start + copy_s[c]
            append((f"concat {comm_names[c]}", "compute", "copy", start, end))
            compute_free = concat_end[c] = end

    stream_of, bucket_index = [], 0
    for bucket in is_bucket:
        stream_of.append(bucket_index % streams if bucket else streams)
        bucket_index += bucket
    # Communication tasks start in `issue_order` and get their finish time when
    # they start: task d has one exactly when its place in that order is below
    # next_comm. The latest place among a task's inputs tells whether all have.
    issue = issue_order(last_producer, comm_waits_on_index(graph), sum(is_bucket))
    place = [0] * comms
    for number, c in enumerate(issue):
        place[c] = number
    kernel_waits_upto = [max((place[d - kernels] for d in w), default=-1) for w in kernel_waits_on]
    comm_reads_upto = [max((place[d - kernels] for d in r), default=-1) for r in comm_waits_on]
    run_concats(-1)
    next_kernel = next_comm = 0
    while next_kernel < kernels or next_comm < comms:
        before = next_kernel + next_comm
        while next_kernel < kernels:
            waits = kernel_waits_on[next_kernel]
            # Kernels before this one on the in-order stream ended by compute_free:
            # only the communication it reads can make it wait.
            if waits:
                if kernel_waits_upto[next_kernel] >= next_comm:
                    break
                for dep in waits:  # split the buckets this kernel reads
                    c = dep - kernels
                    if copy_s[c] > 0 and dep not in split_done:
                        split_start = max(compute_free, finish[dep])
                        split_end = split_start + copy_s[c]
                        append(
                            (f"split {comm_names[c]}", "compute", "copy", split_start, split_end)
                        )
                        compute_free = split_end
                        split_done.add(dep)
                start, who = compute_free, last_compute
                for dep in waits:
                    if finish[dep] > start:
                        start, who = finish[dep], dep
            else:
                start, who = compute_free, last_compute
            end = start + kernel_s[next_kernel]
            finish[next_kernel] = end
            bound[next_kernel] = who
            append((names[next_kernel], "compute", "kernel", start, end))
            compute_free, last_compute = end, next_kernel
            if next_kernel in concat_after:
                run_concats(next_kernel)
            next_kernel += 1
            if blocking:  # issue the collectives this kernel made ready first
                break
        while next_comm < comms and last_producer[issue[next_comm]] < next_kernel:
            c = issue[next_comm]
            task = kernels + c
            if comm_reads_upto[c] >= next_comm:
                break
            stream = stream_of[c]
            start, who = comm_free[stream], last_on_stream[stream]
            if c in concat_end and concat_end[c] > start:
                start = concat_end[c]
            if blocking and compute_free > start:
                start, who = compute_free, last_compute
            for dep in dependencies[task]:
                if finish[dep] > start:
                    start, who = finish[dep], dep
            end = start + comm_task_s[c]
            finish[task] = end
            bound[task] = who
            append((comm_names[c], lanes[stream], comm_kinds[c], start, end))
            comm_free[stream], last_on_stream[stream] = end, task
            if blocking:
                compute_free, last_compute = end, task
            next_comm += 1
        if next_kernel + next_comm == before:
            raise RuntimeError("the simulation cannot make progress; the plan's order has a cycle")
    return events, finish, bound


def comm_waits_on_index(graph: TaskGraph) -> list[list[int]]:
    """For each communication task, the communication tasks it reads, numbered
    from 0 (as `streams_iteration_ps` takes them)."""
    kernels = len(graph.kernels)
    return [[d - kernels for d in reads] for reads in graph.comm_waits_on]


def issue_order(
    last_producer: list[int], comm_waits: list[list[int]], bucket_count: int
) -> list[int]:
    """The order in which the `gpu-streams` model issues communication tasks
    (tasks 0..bucket_count-1 are the plan's buckets, the rest other collectives):
    buckets in plan order, the others by when they can start, merged. A task can
    start after its last producing kernel and the tasks it reads: its readiness
    is the larger of those positions, and its depth counts the tasks it reads in
    a chain. Others go by (readiness, depth); the merge takes the other first when
    it ranks lower than the next bucket, so no kernel waits for a collective that
    sits behind one it has not yet produced the inputs of (an all-gather of the
    forward pass before the gradient buckets, a psum the gradients read)."""
    count = len(last_producer)
    ready: list[int | None] = [None] * count
    depth = [0] * count
    for root in range(count):
        stack = [root]
        while stack:
            c = stack[-1]
            if ready[c] is not None:
                stack.pop()
                continue
            pending = [d for d in comm_waits[c] if ready[d] is None and d not in stack]
            if pending:
                stack.extend(pending)
                continue
            known = [d for d in comm_waits[c] if ready[d] is not None]
            ready[c] = max([last_producer[c]] + [ready[d] for d in known])
            depth[c] = 1 + max((depth[d] for d in known), default=-1)
            stack.pop()
    others = sorted(range(bucket_count, count), key=lambda c: (ready[c], depth[c], c))
    if not others or bucket_count == 0:
        return list(range(bucket_count)) + others
    order, next_other = [], 0
    for bucket in range(bucket_count):
        key = (ready[bucket], depth[bucket])
        while (
            next_other < len(others)
            and (
                ready[others[next_other]],
                depth[others[next_other]],
            )
            < key
        ):
            order.append(others[next_other])
            next_other += 1
        order.append(bucket)
    return order + others[next_other:]


def _ranks(graph: TaskGraph) -> np.ndarray:
    """The order in which the thread schedulers prefer ready tasks, as one integer
    per task. Kernels go in their order; a collective as soon as its last producer
    has run: priorities are 2k for kernel k and 2p + 1 for a collective whose last
    producer is p, so that a collective sits between kernels, and a task's rank is
    priority · tasks + task (ties go to the lower task id). One integer compares
    fast in a heap and gives the task back modulo the task count."""
    kernels, comms = len(graph.kernels), len(graph.communications)
    total = kernels + comms
    kernel_rank = np.arange(kernels, dtype=np.int64) * (2 * total + 1)  # 2k · total + k
    last_producer = np.array(graph.last_producer, dtype=np.int64).reshape(comms)
    comm_rank = (2 * last_producer + 1) * total + kernels + np.arange(comms, dtype=np.int64)
    return np.concatenate([kernel_rank, comm_rank])


def _thread_tasks(graph, kernel_ps, comm_task_ps, copy_ps):
    """What both thread schedulers start from: (task count, durations, users,
    unfinished inputs per task, ranks (`_ranks`), names, kinds, the heap of ready
    ranks)."""
    kernels, comms = len(graph.kernels), len(graph.communications)
    total = kernels + comms
    duration = kernel_ps + [c + 2 * k for c, k in zip(comm_task_ps, copy_ps, strict=True)]
    dependencies = graph.dependencies
    users: list[list[int]] = [[] for _ in range(total)]
    waiting = list(map(len, dependencies))
    for task, deps in enumerate(dependencies):
        for dep in deps:
            users[dep].append(task)
    rank = _ranks(graph).tolist()
    names = list(map(attrgetter("name"), graph.kernels)) + [c[0] for c in graph.communications]
    kinds = ["kernel"] * kernels + list(map(graph.communication_kind, range(comms)))
    ready = [rank[t] for t in range(total) if waiting[t] == 0]
    heapq.heapify(ready)
    return total, duration, users, waiting, rank, names, kinds, ready


def _run_threads(graph, kernel_ps, comm_task_ps, copy_ps, profile):
    """List scheduling on K threads: whenever a thread is free, it takes the ready
    task of lowest priority (kernels in their order; a collective right after its
    last producer). A collective holds its thread for its copies and transfer.
    Returns (events, finish times, tasks in the order they started)."""
    total, duration, users, waiting, rank, names, kinds, ready = _thread_tasks(
        graph, kernel_ps, comm_task_ps, copy_ps
    )
    threads = max(1, profile.compute_threads) if profile.overlap else 1
    kernels, lag = len(graph.kernels), profile.worker_lag
    since_met = 0  # kernel time started since the last collective started (ps)
    lanes = [f"thread {t}" for t in range(threads)]
    running: list[tuple[int, int, int]] = []  # (finish, task, thread)
    free_threads = list(range(threads))  # a heap: the lowest free thread first
    finish: list = [None] * total
    run_order: list[int] = []
    events: list[tuple] = []  # Event fields, as plain tuples while running
    append, started = events.append, run_order.append
    heappush, heappop = heapq.heappush, heapq.heappop
    now = 0
    while ready or running:
        while ready and free_threads:
            task = heappop(ready) % total
            thread = heappop(free_threads)
            end = now + duration[task]
            if task < kernels:
                since_met += duration[task]
            elif lag:  # it waits for the slowest worker (`ClusterProfile.worker_lag`)
                end += round(lag * since_met)
                since_met = 0
            finish[task] = end
            append((names[task], lanes[thread], kinds[task], now, end))
            started(task)
            heappush(running, (end, task, thread))
        if not running:
            break
        now, task, thread = heappop(running)
        heappush(free_threads, thread)
        for user in users[task]:
            left = waiting[user] - 1
            waiting[user] = left
            if not left:
                heappush(ready, rank[user])
    if len(run_order) < total:
        raise RuntimeError("the simulation cannot make progress; the plan's order has a cycle")
    return events, finish, run_order


def _run_one_thread(graph, kernel_ps, comm_task_ps, copy_ps, profile):
    """`_run_threads` with one thread. Each task starts when the one before it
    ends, so the times are running sums of the durations in run order, and the run
    order is Kahn's algorithm taking the ready task of lowest rank. Where the tasks
    sorted by rank already form a topological order (every input of a task comes
    before it), that sorted order is the run order: at each step the lowest
    remaining task has all its inputs done, so it is ready and the lowest ready."""
    kernels, comms = len(graph.kernels), len(graph.communications)
    total = kernels + comms
    dependencies = graph.dependencies
    rank = _ranks(graph)
    order = np.argsort(rank, kind="stable")
    position = np.empty(total, dtype=np.int64)
    position[order] = np.arange(total, dtype=np.int64)
    inputs = np.fromiter(map(len, dependencies), dtype=np.int64, count=total)
    sources = np.fromiter(chain.from_iterable(dependencies), dtype=np.int64, count=inputs.sum())
    if (position[sources] < np.repeat(position, inputs)).all():
        run_order, place = order.tolist(), position.tolist()
    else:
        run_order = _one_thread_order(graph, rank.tolist())
        place = [0] * total
        for index, task in enumerate(run_order):
            place[task] = index
    duration = kernel_ps + [c + 2 * k for c, k in zip(comm_task_ps, copy_ps, strict=True)]
    if profile.worker_lag:
        duration = _with_worker_lag(duration, run_order, kernels, profile.worker_lag)
    ends = list(accumulate(map(duration.__getitem__, run_order)))
    starts = [0] + ends[:-1]
    finish = list(map(ends.__getitem__, place))
    names = list(map(attrgetter("name"), graph.kernels)) + [c[0] for c in graph.communications]
    kinds = ["kernel"] * kernels + list(map(graph.communication_kind, range(comms)))
    events = list(
        zip(
            map(names.__getitem__, run_order),
            repeat("thread 0"),
            map(kinds.__getitem__, run_order),
            starts,
            ends,
            strict=False,
        )
    )
    return events, finish, run_order


def _with_worker_lag(duration: list[int], run_order: list[int], kernels: int, lag: float):
    """The durations with each collective's wait for the slowest worker added: `lag`
    times the kernel time run (in run order) since the previous collective or the
    step's start (`ClusterProfile.worker_lag`)."""
    duration = list(duration)
    since_met = 0
    for task in run_order:
        if task < kernels:
            since_met += duration[task]
        else:
            duration[task] += round(lag * since_met)
            since_met = 0
    return duration


def _one_thread_order(graph: TaskGraph, rank: list[int]) -> list[int]:
    """Kahn's algorithm, the ready task of lowest rank first (raises on a cycle)."""
    total = len(rank)
    users: list[list[int]] = [[] for _ in range(total)]
    waiting = list(map(len, graph.dependencies))
    for task, deps in enumerate(graph.dependencies):
        for dep in deps:
            users[dep].append(task)
    ready = [rank[t] for t in range(total) if waiting[t] == 0]
    heapq.heapify(ready)
    heappush, heappop = heapq.heappush, heapq.heappop
    run_order: list[int] = []
    while ready:
        task = heappop(ready) % total
        run_order.append(task)
        for user in users[task]:
            left = waiting[user] - 1
            waiting[user] = left
            if not left:
                heappush(ready, rank[user])
    if len(run_order) < total:
        raise RuntimeError("the simulation cannot make progress; the plan's order has a cycle")
    return run_order


def graph_iteration_ps(
    graph: TaskGraph, profile: ClusterProfile, kernel_ps: list[int], comm_cost: CommCostFn
) -> int:
    """`streams_iteration_ps` of a whole task graph (the `gpu-streams` model, with
    collectives beside compute), from one run's `kernel_ps` of each kernel."""
    if graph.collectives_block_compute:
        raise ValueError("graph_iteration_ps models collectives beside compute only")
    kernels = len(graph.kernels)
    prefix = [0]
    for duration in times_runs(kernel_ps, graph.kernel_runs):
        prefix.append(prefix[-1] + duration)
    comm_ps, copy_ps = graph_communication_ps(graph, profile, comm_cost)
    streams = max(1, profile.communication_streams)
    stream = []
    bucket_index = 0
    for is_bucket in graph.is_bucket:
        stream.append(bucket_index % streams if is_bucket else streams)
        bucket_index += is_bucket
    waits = {
        k: [c - kernels for c in reads] for k, reads in enumerate(graph.kernel_waits_on) if reads
    }
    return streams_iteration_ps(
        kernels,
        lambda positions: [prefix[p] for p in positions],
        waits,
        comm_ps,
        copy_ps,
        stream,
        graph.last_producer,
        comm_waits_on_index(graph),
        sum(graph.is_bucket),
    )


def streams_iteration_ps(
    kernel_count: int,
    prefix_ps,
    waits: dict[int, list[int]],
    comm_ps: list[int],
    copy_ps: list[int],
    comm_stream: list[int],
    last_producer: list[int],
    comm_waits: list[list[int]],
    bucket_count: int | None = None,
) -> int:
    """The iteration time of the `gpu-streams` model, without the events: the same
    arithmetic as the full simulation, visiting only the kernels where something
    happens (those that read an all-reduce, and the last producer of each).

    `prefix_ps(positions)` gives, for each position i, the summed duration of the
    kernels at positions below i;
    `waits[i]` the communication tasks (ascending) the kernel at position i reads;
    per communication task: its transfer and copy times, its stream, the position
    of its last producing kernel (-1: none) and the communication tasks it reads;
    tasks from `bucket_count` on are other collectives (None: there are none).
    The tasks are first renumbered in `issue_order`, the full simulation's.
    Between two such kernels the compute stream runs back to back, so its clock
    advances by a difference of prefix sums. Raises RuntimeError where the full
    simulation cannot make progress."""
    comms = len(comm_ps)
    if bucket_count is not None and bucket_count < comms:
        order = issue_order(last_producer, comm_waits, bucket_count)
        if order != list(range(comms)):
            place = [0] * comms
            for number, c in enumerate(order):
                place[c] = number
            comm_ps = [comm_ps[c] for c in order]
            copy_ps = [copy_ps[c] for c in order]
            comm_stream = [comm_stream[c] for c in order]
            last_producer = [last_producer[c] for c in order]
            comm_waits = [sorted(place[d] for d in comm_waits[c]) for c in order]
            waits = {k: sorted(place[c] for c in read) for k, read in waits.items()}
    finish = [0] * comms
    concat_end: dict[int, int] = {}
    produced_at: dict[int, int] = {}  # position -> end of that kernel
    concat_after: dict[int, list[int]] = {}
    for c, copy in enumerate(copy_ps):
        if copy > 0:
            concat_after.setdefault(last_producer[c], []).append(c)
    stream_free = [0] * (max(comm_stream, default=0) + 1)
    done = 0  # communication tasks 0..done-1 have their finish times
    split_done: set[int] = set()

    def settle(upto: int, passed: int) -> None:
        """Finish times of communication tasks up to `upto`; `passed` is the
        first kernel position not yet run."""
        nonlocal done
        c = done
        while c <= upto:
            producer = last_producer[c]
            if producer >= passed:
                raise RuntimeError(
                    "the simulation cannot make progress; the plan's order has a cycle"
                )
            stream = comm_stream[c]
            start = stream_free[stream]
            ready = concat_end[c] if c in concat_end else produced_at.get(producer, 0)
            if ready > start:
                start = ready
            for dep in comm_waits[c]:
                if dep >= c:
                    raise RuntimeError(
                        "the simulation cannot make progress; the plan's order has a cycle"
                    )
                if finish[dep] > start:
                    start = finish[dep]
            finish[c] = stream_free[stream] = start + comm_ps[c]
            c += 1
        done = c

    free = 0
    for c in concat_after.get(-1, ()):
        if comm_waits[c]:
            settle(max(comm_waits[c]), 0)
            free = max([free] + [finish[d] for d in comm_waits[c]])
        free += copy_ps[c]
        concat_end[c] = free
    points = sorted(set(waits).union([p for p in last_producer if p >= 0]))
    count = len(points)
    sums = prefix_ps(points + [p + 1 for p in points] + [kernel_count])
    previous = 0  # prefix sum at the kernel after the last point; `free` is when it ended
    get_waits, get_concats = waits.get, concat_after.get
    for n, position in enumerate(points):
        read = get_waits(position)
        if read:
            free += sums[n] - previous
            if read[-1] >= done:
                settle(read[-1], position)
            for c in read:
                if copy_ps[c] > 0 and c not in split_done:
                    split_done.add(c)
                    free = max(free, finish[c]) + copy_ps[c]
            for c in read:
                if finish[c] > free:
                    free = finish[c]
            previous = sums[count + n]
            free += previous - sums[n]
        else:
            after = sums[count + n]
            free += after - previous
            previous = after
        produced_at[position] = free
        concats = get_concats(position)
        if concats:
            for c in concats:
                if comm_waits[c]:
                    settle(max(comm_waits[c]), position + 1)
                    free = max([free] + [finish[d] for d in comm_waits[c]])
                free += copy_ps[c]
                concat_end[c] = free
    free += sums[-1] - previous
    if done < comms:  # collectives whose results no kernel reads still run
        settle(comms - 1, kernel_count)
    return max([free] + finish)


def chrome_trace(result: SimulationResult) -> dict:
    """The events as a Chrome / Perfetto trace (open it in ui.perfetto.dev)."""
    lanes = sorted({e.lane for e in result.events}, key=lambda lane: (lane != "compute", lane))
    lane_id = {lane: index for index, lane in enumerate(lanes)}
    trace = [
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": lane_id[lane], "args": {"name": lane}}
        for lane in lanes
    ]
    trace += [
        {
            "name": e.name,
            "cat": e.kind,
            "ph": "X",
            "pid": 0,
            "tid": lane_id[e.lane],
            "ts": e.start_s * 1e6,
            "dur": (e.end_s - e.start_s) * 1e6,
        }
        for e in result.events
    ]
    return {"traceEvents": trace, "displayTimeUnit": "ms", "otherData": result.summary()}


def plot_gantt(results: dict[str, SimulationResult], path: str) -> None:
    """A PNG Gantt chart, one panel per result, compute and communication lanes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"kernel": "#4c78a8", "copy": "#f58518", "all-reduce": "#e45756"}
    figure, axes = plt.subplots(
        len(results), 1, figsize=(12, 1.6 + 1.2 * len(results)), squeeze=False
    )
    for axis, (title, result) in zip(axes[:, 0], results.items(), strict=True):
        lanes = sorted({e.lane for e in result.events}, key=lambda lane: (lane != "compute", lane))
        for row, lane in enumerate(lanes):
            spans = [
                (e.start_s * 1e3, (e.end_s - e.start_s) * 1e3, e.kind)
                for e in result.events
                if e.lane == lane
            ]
            for kind in dict.fromkeys(k for _, _, k in spans):
                chosen = [(s, d) for s, d, k in spans if k == kind]
                colour = colours.get(kind, "#b279a2")  # another collective
                axis.broken_barh(chosen, (row - 0.4, 0.8), facecolors=colour, label=kind)
        axis.set_yticks(range(len(lanes)), lanes)
        axis.set_title(
            f"{title}: {result.iteration_s * 1e3:.3f} ms, T/T_ideal {result.t_over_ideal:.2f}"
        )
        axis.set_xlabel("ms")
        handles, labels = axis.get_legend_handles_labels()
        unique = dict(zip(labels, handles, strict=True))
        axis.legend(unique.values(), unique.keys(), loc="upper right", fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
