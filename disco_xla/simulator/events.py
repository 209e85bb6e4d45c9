"""The event simulator: one training iteration of a plan, task by task.

Two execution models, chosen by the profile:

- `gpu-streams`: one in-order compute stream runs the kernels in a topological
  order; buckets run in plan order on the communication stream(s), each starting
  when all its gradients are produced and its stream is free; a kernel that reads
  an all-reduce result waits for its bucket. A bucket of several gradients costs
  a concatenation copy before it and a split copy after it on the compute stream
  (memory-bound: bytes read and written at memory bandwidth). Collectives that are
  not gradient buckets (a loss mean) run on a stream of their own.
- `cpu-threads`: K executor threads take ready tasks in priority order; a
  collective occupies its thread for its whole duration (XLA:CPU has no
  asynchronous collectives). With `overlap: false` everything runs one at a time.

Time is counted in integer picoseconds (durations rounded once), so sums are
exact. Iteration time is the finish time of the last task. Exposed communication is the
time communication runs while no compute does. T_ideal = max(C, A), C the sum of
kernel times, A one all-reduce of every gradient byte.
"""

from __future__ import annotations

import gc
import heapq
from dataclasses import dataclass, fields
from typing import NamedTuple

import numpy as np

from disco_xla.simulator.comm import CommCostFn, all_reduce_s
from disco_xla.simulator.cost_models import CostModel
from disco_xla.simulator.kernels import TaskGraph
from disco_xla.simulator.profiles import ClusterProfile

PS_PER_S = 10**12  # the simulator counts integer picoseconds


class Event(NamedTuple):
    name: str
    lane: str  # 'compute', 'comm 0', 'thread 1', ...
    kind: str  # 'kernel', 'all-reduce', 'copy'
    start_s: float
    end_s: float


@dataclass(frozen=True)
class SimulationResult:
    iteration_s: float
    compute_s: float  # busy time of kernels and copies
    comm_s: float  # busy time of collectives
    exposed_comm_s: float
    overlap_ratio: float  # share of communication hidden behind compute
    ideal_s: float
    t_over_ideal: float
    critical_path: tuple[str, ...]
    cost_model: str
    execution: str
    kernels: int
    buckets: int  # gradient buckets of the plan
    collectives: int  # buckets and other collectives (such as a loss mean)
    collective_ready_s: dict[str, float]  # when each collective's inputs were all ready
    spans_ps: tuple[tuple, ...]  # the events as plain tuples, times in integer ps

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
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "spans_ps"}
        data["critical_path"] = list(self.critical_path)
        return data


def simulate(
    graph: TaskGraph,
    profile: ClusterProfile,
    cost_model: CostModel,
    comm_cost: CommCostFn = all_reduce_s,
    ideal_compute_s: float | None = None,
) -> SimulationResult:
    """Simulate one iteration. `ideal_compute_s` is C of T_ideal = max(C, A): the
    kernel time of XLA's fused module when the caller has it, else this plan's own.
    Garbage collection pauses meanwhile: the run only allocates, and a large module
    makes every collection slow."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _simulate(graph, profile, cost_model, comm_cost, ideal_compute_s)
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
) -> tuple[int, int]:
    """(all-reduce, one copy) of a communication task, in picoseconds. A bucket of
    several gradients sent as one message pays a concatenation before and a split
    after, each reading and writing its bytes at memory bandwidth, plus a launch.
    A tuple all-reduce (`tuple_element_bytes`, one size per tensor) copies
    nothing, and pays the profile's `tuple_all_reduce_element_s` for each tensor
    after the first: XLA:CPU sends them one after another."""
    if tuple_element_bytes:
        extra_s = (len(tuple_element_bytes) - 1) * profile.tuple_all_reduce_element_s
        return to_ps(comm_cost(size_bytes, profile) + extra_s), 0
    copy_s = (
        2 * size_bytes / profile.memory_bandwidth_bytes_per_s + profile.kernel_launch_s
        if members > 1
        else 0.0
    )
    return to_ps(comm_cost(size_bytes, profile)), to_ps(copy_s)


def _simulate(graph, profile, cost_model, comm_cost, ideal_compute_s) -> SimulationResult:
    kernel_s = cost_model.kernels_s(graph)
    # round() and np.rint both round half to even: the same integers as to_ps.
    kernel_ps = np.rint(np.asarray(kernel_s, dtype=np.float64) * PS_PER_S).astype(np.int64).tolist()
    comm_task_ps, copy_ps = [], []
    for c, (_, size, members) in enumerate(graph.communications):
        comm, copy = communication_ps(
            size, len(members), profile, comm_cost, graph.tuple_elements(c)
        )
        comm_task_ps.append(comm)
        copy_ps.append(copy)
    if profile.execution == "gpu-streams":
        events, finish, bound = _run_streams(graph, kernel_ps, comm_task_ps, copy_ps, profile)
    else:
        threads = max(1, profile.compute_threads) if profile.overlap else 1
        run = _run_one_thread if threads == 1 else _run_threads
        events, finish, bound = run(graph, kernel_ps, comm_task_ps, copy_ps, profile)
    iteration_ps = max((span[4] for span in events), default=0)
    compute = [(span[3], span[4]) for span in events if span[2] != "all-reduce"]
    comm = [(span[3], span[4]) for span in events if span[2] == "all-reduce"]
    comm_ps = sum(end - start for start, end in comm)
    exposed_ps = _length(_merge(comm)) - _length(_intersect(_merge(comm), _merge(compute)))
    gradient_bytes = sum(
        size
        for (_, size, _), bucket in zip(graph.communications, graph.is_bucket, strict=True)
        if bucket
    )
    compute_ps = sum(end - start for start, end in compute)
    compute_bound = sum(kernel_ps) / PS_PER_S if ideal_compute_s is None else ideal_compute_s
    ideal = max(compute_bound, comm_cost(gradient_bytes, profile))
    iteration_s = iteration_ps / PS_PER_S
    return SimulationResult(
        iteration_s=iteration_s,
        compute_s=compute_ps / PS_PER_S,
        comm_s=comm_ps / PS_PER_S,
        exposed_comm_s=max(exposed_ps, 0) / PS_PER_S,
        overlap_ratio=1 - exposed_ps / comm_ps if comm_ps > 0 else 1.0,
        ideal_s=ideal,
        t_over_ideal=iteration_s / ideal if ideal > 0 else 1.0,
        critical_path=_critical_path(graph, finish, bound),
        cost_model=cost_model.name,
        execution=profile.execution + ("" if profile.overlap else " (no overlap)"),
        kernels=len(graph.kernels),
        buckets=sum(graph.is_bucket),
        collectives=len(graph.communications),
        collective_ready_s={
            name: max((finish[d] for d in graph.dependencies[len(graph.kernels) + c]), default=0)
            / PS_PER_S
            for c, (name, _, _) in enumerate(graph.communications)
        },
        spans_ps=tuple(events),
    )


def _run_streams(graph, kernel_s, comm_task_s, copy_s, profile):
    """The compute stream in order, buckets in plan order on their streams (times in ps)."""
    kernels, comms = len(graph.kernels), len(graph.communications)
    dependencies = graph.dependencies
    finish: list[float | None] = [None] * (kernels + comms)
    bound: list[int | None] = [None] * (kernels + comms)  # the task that set the start
    events: list[tuple] = []  # Event fields, as plain tuples while running
    compute_free, last_compute = 0, None
    streams = max(1, profile.communication_streams)
    comm_free = [0] * (streams + 1)  # the extra stream serves non-bucket collectives
    last_on_stream: list[int | None] = [None] * (streams + 1)
    # Kernels run in order, so a kernel only ever waits on communication; a
    # collective waits for its last producing kernel (and any collective before it).
    kernel_waits_on = graph.kernel_waits_on
    comm_waits_on = graph.comm_waits_on
    last_producer = graph.last_producer
    concat_after: dict[int, list[int]] = {}
    for c in range(comms):
        if copy_s[c] > 0:
            concat_after.setdefault(last_producer[c], []).append(c)
    concat_end: dict[int, float] = {}
    split_done: set[int] = set()
    names = [k.name for k in graph.kernels]
    comm_names = [name for name, _, _ in graph.communications]

    def run_concats(after: int) -> None:
        nonlocal compute_free
        for c in concat_after.get(after, ()):
            start = max([compute_free] + [finish[d] for d in dependencies[kernels + c]])
            end = start + copy_s[c]
            events.append((f"concat {comm_names[c]}", "compute", "copy", start, end))
            compute_free = concat_end[c] = end

    run_concats(-1)
    next_kernel = next_comm = bucket_index = 0
    while next_kernel < kernels or next_comm < comms:
        progressed = False
        while next_kernel < kernels:
            waits = kernel_waits_on[next_kernel]
            if waits and any(finish[d] is None for d in waits):
                break
            for dep in waits:  # split the buckets this kernel reads
                c = dep - kernels
                if copy_s[c] > 0 and dep not in split_done:
                    start = max(compute_free, finish[dep])
                    events.append(
                        (f"split {comm_names[c]}", "compute", "copy", start, start + copy_s[c])
                    )
                    compute_free = start + copy_s[c]
                    split_done.add(dep)
            # Kernels before this one on the in-order stream ended by compute_free:
            # only the communication it reads can make it wait.
            start, who = compute_free, last_compute
            for dep in waits:
                if finish[dep] > start:
                    start, who = finish[dep], dep
            end = start + kernel_s[next_kernel]
            finish[next_kernel], bound[next_kernel] = end, who
            events.append((names[next_kernel], "compute", "kernel", start, end))
            compute_free, last_compute = end, next_kernel
            if next_kernel in concat_after:
                run_concats(next_kernel)
            next_kernel += 1
            progressed = True
        while next_comm < comms:
            if last_producer[next_comm] >= next_kernel or any(
                finish[d] is None for d in comm_waits_on[next_comm]
            ):
                break
            task = kernels + next_comm
            if graph.is_bucket[next_comm]:
                stream = bucket_index % streams
                bucket_index += 1
            else:
                stream = streams
            start, who = (
                max(comm_free[stream], concat_end.get(next_comm, 0)),
                last_on_stream[stream],
            )
            for dep in dependencies[task]:
                if finish[dep] > start:
                    start, who = finish[dep], dep
            end = start + comm_task_s[next_comm]
            finish[task], bound[task] = end, who
            lane = f"comm {stream}" if stream < streams else "comm (other)"
            events.append((comm_names[next_comm], lane, "all-reduce", start, end))
            comm_free[stream], last_on_stream[stream] = end, task
            next_comm += 1
            progressed = True
        if not progressed:
            raise RuntimeError("the simulation cannot make progress; the plan's order has a cycle")
    return events, finish, bound


def _thread_tasks(graph, kernel_ps, comm_task_ps, copy_ps):
    """What both thread schedulers start from: (kernel count, task count,
    durations, dependencies, users, unfinished inputs per task, priorities,
    names, the heap of ready tasks)."""
    kernels, comms = len(graph.kernels), len(graph.communications)
    total = kernels + comms
    duration = kernel_ps + [c + 2 * k for c, k in zip(comm_task_ps, copy_ps, strict=True)]
    dependencies = graph.dependencies
    users: list[list[int]] = [[] for _ in range(total)]
    waiting = [len(deps) for deps in dependencies]
    for task, deps in enumerate(dependencies):
        for dep in deps:
            users[dep].append(task)
    # Kernels in their order; a collective as soon as its last producer has run.
    # Priorities are doubled so that a collective (2p + 1) sits between kernels.
    priority = list(range(0, 2 * kernels, 2)) + [2 * p + 1 for p in graph.last_producer]
    names = [k.name for k in graph.kernels] + [c[0] for c in graph.communications]
    ready = [(priority[t], t) for t in range(total) if waiting[t] == 0]
    heapq.heapify(ready)
    return kernels, total, duration, dependencies, users, waiting, priority, names, ready


def _run_threads(graph, kernel_ps, comm_task_ps, copy_ps, profile):
    """List scheduling on K threads: whenever a thread is free, it takes the ready
    task of lowest priority (kernels in their order; a collective right after its
    last producer). A collective holds its thread for its copies and transfer."""
    kernels, total, duration, dependencies, users, waiting, priority, names, ready = _thread_tasks(
        graph, kernel_ps, comm_task_ps, copy_ps
    )
    threads = max(1, profile.compute_threads) if profile.overlap else 1
    lanes = [f"thread {t}" for t in range(threads)]
    running: list[tuple[int, int, int]] = []  # (finish, task, thread)
    free_threads = list(range(threads))  # a heap: the lowest free thread first
    finish: list = [None] * total
    bound: list = [None] * total
    last_on_thread: list = [None] * threads
    events: list[tuple] = []  # Event fields, as plain tuples while running
    append, heappush, heappop = events.append, heapq.heappush, heapq.heappop
    now = 0
    while ready or running:
        while ready and free_threads:
            task = heappop(ready)[1]
            thread = heappop(free_threads)
            end = now + duration[task]
            latest, latest_end = None, -1
            for dep in dependencies[task]:
                if finish[dep] > latest_end:
                    latest, latest_end = dep, finish[dep]
            if latest is None or latest_end < now:
                latest = last_on_thread[thread]
            bound[task] = latest
            finish[task] = end
            append(
                (names[task], lanes[thread], "kernel" if task < kernels else "all-reduce", now, end)
            )
            heappush(running, (end, task, thread))
        if not running:
            break
        now, task, thread = heappop(running)
        heappush(free_threads, thread)
        last_on_thread[thread] = task
        for user in users[task]:
            waiting[user] -= 1
            if waiting[user] == 0:
                heappush(ready, (priority[user], user))
    if any(f is None for f in finish):
        raise RuntimeError("the simulation cannot make progress; the plan's order has a cycle")
    return events, finish, bound


def _run_one_thread(graph, kernel_ps, comm_task_ps, copy_ps, profile):
    """`_run_threads` with one thread, without its heap of running tasks: the
    ready task of lowest priority runs as soon as the one before it ends, so every
    task it waits for has already ended."""
    kernels, total, duration, dependencies, users, waiting, priority, names, ready = _thread_tasks(
        graph, kernel_ps, comm_task_ps, copy_ps
    )
    finish: list = [None] * total
    bound: list = [None] * total
    events: list[tuple] = []
    append, heappush, heappop = events.append, heapq.heappush, heapq.heappop
    now, previous = 0, None
    while ready:
        task = heappop(ready)[1]
        end = now + duration[task]
        # What set the start: the input that ended last, if it ended just now,
        # else the task before on the thread.
        latest, latest_end = None, -1
        for dep in dependencies[task]:
            if finish[dep] > latest_end:
                latest, latest_end = dep, finish[dep]
        bound[task] = latest if latest is not None and latest_end >= now else previous
        finish[task] = end
        append((names[task], "thread 0", "kernel" if task < kernels else "all-reduce", now, end))
        now, previous = end, task
        for user in users[task]:
            waiting[user] -= 1
            if waiting[user] == 0:
                heappush(ready, (priority[user], user))
    if any(f is None for f in finish):
        raise RuntimeError("the simulation cannot make progress; the plan's order has a cycle")
    return events, finish, bound


def graph_iteration_ps(
    graph: TaskGraph, profile: ClusterProfile, kernel_ps: list[int], comm_cost: CommCostFn
) -> int:
    """`streams_iteration_ps` of a whole task graph (the `gpu-streams` model)."""
    kernels = len(graph.kernels)
    prefix = [0]
    for duration in kernel_ps:
        prefix.append(prefix[-1] + duration)
    comm_ps, copy_ps, stream = [], [], []
    streams = max(1, profile.communication_streams)
    bucket_index = 0
    for c, ((_, size, members), is_bucket) in enumerate(
        zip(graph.communications, graph.is_bucket, strict=True)
    ):
        comm, copy = communication_ps(
            size, len(members), profile, comm_cost, graph.tuple_elements(c)
        )
        comm_ps.append(comm)
        copy_ps.append(copy)
        stream.append(bucket_index % streams if is_bucket else streams)
        bucket_index += is_bucket
    waits = {
        k: [c - kernels for c in reads] for k, reads in enumerate(graph.kernel_waits_on) if reads
    }
    comm_waits = [[c - kernels for c in reads] for reads in graph.comm_waits_on]
    return streams_iteration_ps(
        kernels,
        lambda positions: [prefix[p] for p in positions],
        waits,
        comm_ps,
        copy_ps,
        stream,
        graph.last_producer,
        comm_waits,
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
) -> int:
    """The iteration time of the `gpu-streams` model, without the events: the same
    arithmetic as the full simulation, visiting only the kernels where something
    happens (those that read an all-reduce, and the last producer of each).

    `prefix_ps(positions)` gives, for each position i, the summed duration of the
    kernels at positions below i;
    `waits[i]` the communication tasks (ascending) the kernel at position i reads;
    per communication task: its transfer and copy times, its stream, the position
    of its last producing kernel (-1: none) and the communication tasks it reads.
    Between two such kernels the compute stream runs back to back, so its clock
    advances by a difference of prefix sums. Raises RuntimeError where the full
    simulation cannot make progress."""
    comms = len(comm_ps)
    finish = [0] * comms
    concat_end: dict[int, int] = {}
    produced_at: dict[int, int] = {}  # position -> end of that kernel
    concat_after: dict[int, list[int]] = {}
    for c in range(comms):
        if copy_ps[c] > 0:
            concat_after.setdefault(last_producer[c], []).append(c)
    stream_free = [0] * (max(comm_stream, default=0) + 1)
    done = 0  # communication tasks 0..done-1 have their finish times
    split_done: set[int] = set()

    def settle(upto: int, passed: int) -> None:
        """Finish times of communication tasks up to `upto`; `passed` is the
        first kernel position not yet run."""
        nonlocal done
        while done <= upto:
            c = done
            producer = last_producer[c]
            if producer >= passed:
                raise RuntimeError(
                    "the simulation cannot make progress; the plan's order has a cycle"
                )
            start = stream_free[comm_stream[c]]
            ready = concat_end.get(c, produced_at.get(producer, 0))
            if ready > start:
                start = ready
            for dep in comm_waits[c]:
                if dep >= c:
                    raise RuntimeError(
                        "the simulation cannot make progress; the plan's order has a cycle"
                    )
                if finish[dep] > start:
                    start = finish[dep]
            finish[c] = stream_free[comm_stream[c]] = start + comm_ps[c]
            done += 1

    free = 0
    for c in concat_after.get(-1, ()):
        if comm_waits[c]:
            settle(max(comm_waits[c]), 0)
            free = max([free] + [finish[d] for d in comm_waits[c]])
        free += copy_ps[c]
        concat_end[c] = free
    at = 0  # kernels below this position have run; `free` is when the last ended
    points = sorted(set(waits) | {p for p in last_producer if p >= 0})
    count = len(points)
    sums = prefix_ps(points + [p + 1 for p in points] + [kernel_count])
    previous = 0  # prefix sum at `at`
    get_waits, get_concats = waits.get, concat_after.get
    for n, position in enumerate(points):
        before, after = sums[n], sums[count + n]
        free += before - previous
        read = get_waits(position)
        if read:
            if read[-1] >= done:
                settle(read[-1], position)
            for c in read:
                if copy_ps[c] > 0 and c not in split_done:
                    split_done.add(c)
                    free = max(free, finish[c]) + copy_ps[c]
            for c in read:
                if finish[c] > free:
                    free = finish[c]
        free += after - before
        previous = after
        at = position + 1
        produced_at[position] = free
        for c in get_concats(position, ()):
            if comm_waits[c]:
                settle(max(comm_waits[c]), at)
                free = max([free] + [finish[d] for d in comm_waits[c]])
            free += copy_ps[c]
            concat_end[c] = free
    free += sums[-1] - previous
    return max([free] + finish)


def _critical_path(graph: TaskGraph, finish, bound) -> tuple[str, ...]:
    if not finish:
        return ()
    kernels = len(graph.kernels)
    task = max(range(len(finish)), key=lambda t: finish[t])
    path = []
    seen = set()
    while task is not None and task not in seen:
        seen.add(task)
        path.append(
            graph.kernels[task].name if task < kernels else graph.communications[task - kernels][0]
        )
        task = bound[task]
    return tuple(reversed(path))


def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _intersect(first, second) -> list[tuple[float, float]]:
    out, i, j = [], 0, 0
    while i < len(first) and j < len(second):
        start = max(first[i][0], second[j][0])
        end = min(first[i][1], second[j][1])
        if start < end:
            out.append((start, end))
        if first[i][1] < second[j][1]:
            i += 1
        else:
            j += 1
    return out


def _length(intervals) -> float:
    return sum(end - start for start, end in intervals)


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
            for kind in colours:
                chosen = [(s, d) for s, d, k in spans if k == kind]
                if chosen:
                    axis.broken_barh(chosen, (row - 0.4, 0.8), facecolors=colours[kind], label=kind)
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
