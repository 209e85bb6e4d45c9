"""The event simulator: one training iteration of a plan, task by task.

Two execution models, chosen by the profile:

- `gpu-streams`: one in-order compute stream runs the kernels in a topological
  order; buckets run in plan order on the communication stream(s) (a bucket moves
  ahead only where a kernel would otherwise wait for it behind one whose
  gradients come after that kernel: `streams.issue_order`), each starting
  when all its gradients are produced and its stream is free; a kernel that reads
  an all-reduce result waits for its bucket. A bucket of several gradients costs
  a concatenation copy before it and a split copy after it on the compute stream
  (memory-bound: bytes read and written at memory bandwidth). Collectives that are
  not gradient buckets (a loss mean, an all-gather of FSDP parameters, any
  other kind: `comm.collective_s`) run on a stream of their own. When the task
  graph says collectives block compute (XLA:GPU without its latency-hiding
  scheduler), each collective runs as soon as it is ready, and the compute stream
  waits for it. The schedule is `streams.streams_iteration_ps`, which the
  search's incremental evaluation runs too; here it records every event.
- `cpu-threads` (`cpu_threads`): K executor threads take ready tasks in priority order; a
  collective occupies its thread for its whole duration (XLA:CPU has no
  asynchronous collectives), and first waits for the slowest worker when the
  profile says how far behind it falls (`worker_lag`). With `overlap: false`
  everything runs one at a time.

Time is counted in integer picoseconds (durations rounded once), so sums are
exact. Iteration time is the finish time of the last task. Exposed communication is the
time communication runs while no compute does. T_ideal = max(C, A), C the sum of
kernel times, A every gradient byte sent as one message (one for each kind and
device group the gradients are reduced over: one all-reduce in a data-parallel
step). The critical path and the
collectives' ready times are worked out when first read (the search reads the
path of a few plans only). `trace` writes the events as a Chrome trace or a
Gantt chart.
"""

from __future__ import annotations

import gc
from itertools import accumulate
from operator import attrgetter, itemgetter

import numpy as np

from disco_xla.simulator.chunks import chunk_kernel_s
from disco_xla.simulator.comm import CommCostFn, all_reduce_s, collective_s
from disco_xla.simulator.cost_models import CostModel
from disco_xla.simulator.cpu_threads import run_one_thread, run_threads
from disco_xla.simulator.kernels import TaskGraph
from disco_xla.simulator.profiles import ClusterProfile
from disco_xla.simulator.result import PS_PER_S, SimulationResult, Timeline
from disco_xla.simulator.streams import bucket_streams, streams_iteration_ps

ALL_REDUCE = "all-reduce"  # the kind of a gradient bucket's event
# Events of these kinds are compute; any other kind names a collective.
COMPUTE_KINDS = frozenset({"kernel", "copy"})


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
    group: tuple[tuple[int, ...], int] = ((), 0),
) -> tuple[int, int]:
    """(transfer, one copy) of a communication task, in picoseconds: collective
    `kind` (`comm.collective_s`) of `size_bytes` over the devices of `group`
    (`TaskGraph.communication_group`). A bucket of
    several gradients sent as one message pays a concatenation before and a split
    after, each reading and writing its bytes at memory bandwidth, plus a launch.
    A tuple all-reduce (`tuple_element_bytes`, one size per tensor) copies
    nothing. XLA:CPU sends its tensors one after another, so it costs the
    collective of its largest tensor, each other tensor's share that grows with
    its size (its collective's time less that of a 1-byte one), and the
    profile's `tuple_all_reduce_element_s` for each tensor after the first. Its
    bytes are never one buffer: priced as one, an 83 MB tuple of 156 tensors
    fell where large buffers cost 5x more per byte here (Keras Xception; the
    measured points of `cpu-local-inprocess`) and came out 6x dearer than the
    sum of its tensors. Each collective, a tuple once, also pays the profile's
    `collective_message_s` (0 unless learned from measured steps, as is a
    learned tuple tensor cost: `step_time_fit`)."""

    def priced_s(size: float) -> float:
        return collective_s(kind, size, profile, comm_cost, *group)

    if tuple_element_bytes:
        ordered = sorted(tuple_element_bytes)
        fixed_s = priced_s(1)
        transfer_s = priced_s(ordered[-1]) + sum(
            max(0.0, priced_s(size) - fixed_s) for size in ordered[:-1]
        )
        extra_s = (len(ordered) - 1) * profile.tuple_all_reduce_element_s
        extra_s += profile.collective_message_s
        return to_ps(transfer_s + extra_s), 0
    copy_s = (
        2 * size_bytes / profile.memory_bandwidth_bytes_per_s + profile.kernel_launch_s
        if members > 1
        else 0.0
    )
    transfer_s = priced_s(size_bytes) + profile.collective_message_s
    return to_ps(transfer_s), to_ps(copy_s)


def graph_communication_ps(
    graph: TaskGraph, profile: ClusterProfile, comm_cost: CommCostFn
) -> tuple[list[int], list[int]]:
    """`communication_ps` of every communication task of `graph`: (transfer
    times, copy times). The cost depends only on (bytes, several members or one,
    tuple element sizes, kind, device group), so it is computed once per distinct such key. A
    task in a loop body counts every trip (`TaskGraph.communication_runs`)."""
    communications = graph.communications
    elements = graph.tuple_element_bytes[: len(communications)]
    elements = elements + [()] * (len(communications) - len(elements))
    several = map((1).__lt__, map(len, map(itemgetter(2), communications)))
    kinds = list(map(graph.communication_kind, range(len(communications))))
    groups = list(map(graph.communication_group, range(len(communications))))
    sizes = map(itemgetter(1), communications)
    keys = list(zip(sizes, several, elements, kinds, groups, strict=True))
    costs = {
        key: communication_ps(key[0], 2 if key[1] else 1, profile, comm_cost, *key[2:])
        for key in dict.fromkeys(keys)
    }
    found = list(map(costs.__getitem__, keys))
    transfer_ps = list(map(itemgetter(0), found))
    copy_ps = list(map(itemgetter(1), found))
    runs = graph.communication_runs
    return times_runs(transfer_ps, runs), times_runs(copy_ps, runs)


def _gradients_as_one_s(
    graph: TaskGraph, sent_bytes: list[int], profile: ClusterProfile, comm_cost: CommCostFn
) -> float:
    """T_ideal's communication part: every gradient byte sent as one message,
    one for each kind and device group the gradients are reduced over (one
    all-reduce of them all in a data-parallel step)."""
    together: dict[tuple, int] = {}
    for task, sent in enumerate(sent_bytes):
        if graph.is_bucket[task]:
            key = (graph.communication_kind(task), graph.communication_group(task))
            together[key] = together.get(key, 0) + sent
    return sum(
        collective_s(kind, size, profile, comm_cost, *group)
        for (kind, group), size in together.items()
    )


def _simulate(
    graph, profile, cost_model, comm_cost, ideal_compute_s, step_buffers=0
) -> SimulationResult:
    kernel_s = chunk_kernel_s(cost_model.kernels_s(graph), graph, profile)
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
        timeline = Timeline(graph, finish, bound=bound)
    else:
        threads = max(1, profile.compute_threads) if profile.overlap else 1
        run = run_one_thread if threads == 1 else run_threads
        events, finish, run_order = run(graph, kernel_ps, comm_task_ps, copy_ps, profile)
        events, finish = _after_host(events, finish, step_ps)
        timeline = Timeline(graph, finish, run_order=run_order, spans=events)
    iteration_ps, compute_ps, comm_ps, exposed_ps = busy_ps(events)
    iteration_ps = max(iteration_ps, step_ps)  # a step with no event still costs the host
    sent_bytes = times_runs(
        list(map(itemgetter(1), graph.communications)), graph.communication_runs
    )
    compute_bound = sum(kernel_ps) / PS_PER_S if ideal_compute_s is None else ideal_compute_s
    ideal = max(compute_bound, _gradients_as_one_s(graph, sent_bytes, profile, comm_cost))
    ideal += step_ps / PS_PER_S
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


def _run_streams(graph, kernel_ps, comm_task_ps, copy_ps, profile):
    """The `gpu-streams` model (`streams.streams_iteration_ps`) with every event
    recorded. Returns (events, finish times, the task that set each start)."""
    recorder = _StreamEvents(graph, profile)
    streams_iteration_ps(
        *_stream_tasks(graph, kernel_ps, comm_task_ps, copy_ps, profile),
        blocking=graph.collectives_block_compute,
        recorder=recorder,
    )
    return recorder.events, recorder.finish, recorder.bound


def _stream_tasks(graph: TaskGraph, kernel_ps, comm_ps, copy_ps, profile) -> tuple:
    """`streams_iteration_ps`'s arguments for a whole task graph, from the
    durations of its kernels and communication tasks (in task order)."""
    kernels = len(graph.kernels)
    prefix = list(accumulate(kernel_ps, initial=0))
    waits = {
        k: [c - kernels for c in reads] for k, reads in enumerate(graph.kernel_waits_on) if reads
    }
    return (
        kernels,
        lambda positions: [prefix[p] for p in positions],
        waits,
        comm_ps,
        copy_ps,
        bucket_streams(graph.is_bucket, profile.communication_streams),
        graph.last_producer,
        comm_waits_on_index(graph),
        sum(graph.is_bucket),
    )


class _StreamEvents:
    """What a recording `gpu-streams` run leaves for `simulate`: the events in the
    order they happen, each task's finish time and the task whose end set its
    start (`bound`). A task that waited on inputs is bound to the first of them,
    in dependency order, that ended at its start; else to the task before it on
    its stream (or, for a collective that blocks compute, on the compute stream)."""

    def __init__(self, graph: TaskGraph, profile: ClusterProfile):
        kernels, comms = len(graph.kernels), len(graph.communications)
        self.kernels, self.blocking = kernels, graph.collectives_block_compute
        self.dependencies, self.kernel_waits_on = graph.dependencies, graph.kernel_waits_on
        self.finish: list[int | None] = [None] * (kernels + comms)
        self.bound: list[int | None] = [None] * (kernels + comms)
        self.events: list[tuple] = []  # Event fields, as plain tuples while running
        self.names = list(map(attrgetter("name"), graph.kernels))
        self.comm_names = [name for name, _, _ in graph.communications]
        self.comm_kinds = list(map(graph.communication_kind, range(comms)))
        streams = max(1, profile.communication_streams)
        self.stream_of = bucket_streams(graph.is_bucket, streams)
        # The extra stream serves the collectives that are not gradient buckets.
        self.lanes = [f"comm {stream}" for stream in range(streams)] + ["comm (other)"]
        self.last_on_stream: list[int | None] = [None] * (streams + 1)
        self.last_compute: int | None = None

    def concat(self, comm: int, start: int, end: int) -> None:
        self.events.append((f"concat {self.comm_names[comm]}", "compute", "copy", start, end))

    def split(self, comm: int, start: int, end: int) -> None:
        self.events.append((f"split {self.comm_names[comm]}", "compute", "copy", start, end))

    def kernel(self, position: int, ready: int, start: int, end: int) -> None:
        who = self.last_compute
        if start > ready:
            who = self._first_ending_at(self.kernel_waits_on[position], start)
        self.finish[position], self.bound[position] = end, who
        self.events.append((self.names[position], "compute", "kernel", start, end))
        self.last_compute = position

    def comm(
        self,
        comm: int,
        queued: int,
        concat_end: int | None,
        compute_free: int,
        start: int,
        end: int,
    ) -> None:
        task, stream = self.kernels + comm, self.stream_of[comm]
        base, who = queued, self.last_on_stream[stream]
        if concat_end is not None and concat_end > base:
            base = concat_end
        if self.blocking and compute_free > base:
            base, who = compute_free, self.last_compute
        if start > base:
            who = self._first_ending_at(self.dependencies[task], start)
        self.finish[task], self.bound[task] = end, who
        event = (self.comm_names[comm], self.lanes[stream], self.comm_kinds[comm], start, end)
        self.events.append(event)
        self.last_on_stream[stream] = task
        if self.blocking:
            self.last_compute = task

    def _first_ending_at(self, tasks: list[int], time: int) -> int:
        finish = self.finish
        return next(task for task in tasks if finish[task] == time)


def comm_waits_on_index(graph: TaskGraph) -> list[list[int]]:
    """For each communication task, the communication tasks it reads, numbered
    from 0 (as `streams_iteration_ps` takes them)."""
    kernels = len(graph.kernels)
    return [[d - kernels for d in reads] for reads in graph.comm_waits_on]


def graph_iteration_ps(
    graph: TaskGraph, profile: ClusterProfile, kernel_ps: list[int], comm_cost: CommCostFn
) -> int:
    """`streams_iteration_ps` of a whole task graph (the `gpu-streams` model, with
    collectives beside compute), from one run's `kernel_ps` of each kernel."""
    if graph.collectives_block_compute:
        raise ValueError("graph_iteration_ps models collectives beside compute only")
    comm_ps, copy_ps = graph_communication_ps(graph, profile, comm_cost)
    kernel_ps = times_runs(kernel_ps, graph.kernel_runs)
    return streams_iteration_ps(*_stream_tasks(graph, kernel_ps, comm_ps, copy_ps, profile))
