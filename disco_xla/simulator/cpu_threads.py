"""The `cpu-threads` execution model of the event simulator (`events`): K
executor threads take ready tasks in priority order (kernels in their order, a
collective right after its last producer); a collective holds its thread for
its copies and transfer, and first waits for the slowest worker where the
profile says how far behind it falls (`worker_lag`). One thread is a running
sum in run order (`run_one_thread`)."""

from __future__ import annotations

import heapq
from itertools import accumulate, chain, repeat
from operator import attrgetter

import numpy as np

from disco_xla.simulator.kernels import TaskGraph
from disco_xla.simulator.streams import raise_no_progress


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


def run_threads(graph, kernel_ps, comm_task_ps, copy_ps, profile):
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
        raise_no_progress()
    return events, finish, run_order


def run_one_thread(graph, kernel_ps, comm_task_ps, copy_ps, profile):
    """`run_threads` with one thread. Each task starts when the one before it
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
        raise_no_progress()
    return run_order
