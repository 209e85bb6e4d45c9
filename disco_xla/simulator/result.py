"""What one simulated iteration leaves: its events, and the figures read from
them (`SimulationResult`); the critical path and the collectives' ready times
are worked out from the run's timeline when first read."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

from disco_xla.simulator.kernels import TaskGraph

PS_PER_S = 10**12  # the simulator counts integer picoseconds


class Event(NamedTuple):
    name: str
    lane: str  # 'compute', 'comm 0', 'thread 1', ...
    kind: str  # 'kernel', 'copy', or the collective's kind ('all-reduce', 'all-gather', ...)
    start_s: float
    end_s: float


class Timeline:
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
    _timeline: Timeline = field(repr=False, compare=False)

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
