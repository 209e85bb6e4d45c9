"""The `gpu-streams` execution model's schedule, written once: the full
simulation (`events.simulate`, which records every event) and the search's
incremental evaluation (`incremental.PlanState`, which needs the iteration time
alone) both run `streams_iteration_ps`.

The model, times in integer picoseconds:

- one in-order compute stream runs the kernels in their order;
- communication tasks are issued in `issue_order` onto their streams
  (`bucket_streams`) and start at
  max(stream free, last producer's end (or its concatenation copy's), end of
  every task read), or also after the compute stream is free when collectives
  block compute, which then waits for them;
- a kernel starts when the one before it has ended and every communication task
  it reads has ended;
- a bucket of several gradients costs a concatenation copy on the compute
  stream right after its last producer, and a split copy just before the first
  kernel that reads it: copy end = max(compute free, its inputs' end) + copy.

Only the kernels where something happens are visited (those that read a
communication task, and the last producer of each): between two of them the
compute stream runs back to back, so its clock advances by a difference of
prefix sums of the kernel durations. A run that records events visits every
kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import NoReturn, Protocol


def raise_no_progress() -> NoReturn:
    """The error of every scheduler that finds tasks it can never start."""
    raise RuntimeError("the simulation cannot make progress; the plan's order has a cycle")


def bucket_streams(is_bucket: Iterable[bool], streams: int) -> list[int]:
    """The stream of each communication task: gradient buckets take the
    `streams` communication streams in turn, in plan order; every other
    collective (an FSDP all-gather, an activation's all-reduce) shares the
    first, as XLA:GPU runs its all-reduces, all-gathers and reduce-scatters on
    one collective stream. (Until session 43 the others had a stream of their
    own, and never waited for a gradient bucket.)"""
    streams = max(1, streams)
    found, bucket_index = [], 0
    for bucket in is_bucket:
        found.append(bucket_index % streams if bucket else 0)
        bucket_index += bucket
    return found


def issue_order(
    last_producer: list[int],
    comm_waits: list[list[int]],
    bucket_count: int,
    first_reader: list[float] | None = None,
) -> list[int]:
    """The order in which the `gpu-streams` model issues communication tasks
    (tasks 0..bucket_count-1 are the plan's buckets, the rest other collectives):
    buckets in plan order (`_readable_order`), the others by when they can
    start, merged. A task can start after its last producing kernel and the
    tasks it reads: its readiness is the larger of those positions, and its
    depth counts the tasks it reads in a chain. Others go by (readiness, depth);
    the merge takes the other first when it ranks lower than the next bucket, so
    no kernel waits for a collective that sits behind one it has not yet
    produced the inputs of (an all-gather of the forward pass before the
    gradient buckets, a psum the gradients read). `first_reader[c]`: the
    position of the first kernel that reads task c (inf: none)."""
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
    buckets = _readable_order(bucket_count, ready, first_reader)
    others = sorted(range(bucket_count, count), key=lambda c: (ready[c], depth[c], c))
    if not others or bucket_count == 0:
        return buckets + others
    order, next_other = [], 0
    for bucket in buckets:
        key = (ready[bucket], depth[bucket])
        while next_other < len(others) and (
            (ready[others[next_other]], depth[others[next_other]]) < key
        ):
            order.append(others[next_other])
            next_other += 1
        order.append(bucket)
    return order + others[next_other:]


def _readable_order(bucket_count: int, ready: list, first_reader: list[float] | None) -> list[int]:
    """The buckets in plan order, unless that order would have a kernel wait for
    a bucket queued behind one whose gradients it comes before (in a loop body,
    the kernel order can put a gradient's producer after the update that reads
    a later bucket: the Llama FSDP step's backward scan computes its first
    norm's gradient last). Bucket a must then go before bucket b wherever
    b is ready no earlier than a's first reader; where each bucket's reader
    comes after it is ready, those constraints follow readiness and never
    cycle. The fix
    takes, each time, the first bucket in plan order that no remaining bucket
    must precede."""
    order = list(range(bucket_count))
    if first_reader is None:
        return order
    latest = -1
    for bucket in order:  # the common case: plan order is fine
        if latest >= first_reader[bucket]:
            break
        latest = max(latest, ready[bucket])
    else:
        return order
    remaining, placed = order, []
    while remaining:
        for index, bucket in enumerate(remaining):
            if all(ready[bucket] < first_reader[a] for a in remaining if a != bucket):
                placed.append(remaining.pop(index))
                break
        else:
            # A bucket read before its own last producer (a reader of one member
            # ordered before another member's producer): no order helps, and the
            # schedule reports that it cannot make progress.
            return placed + remaining
    return placed


class StreamRecorder(Protocol):
    """What a recording run reports, in the order the events happen.
    Communication tasks are numbered as the caller numbered them."""

    def concat(self, comm: int, start: int, end: int) -> None: ...

    def split(self, comm: int, start: int, end: int) -> None: ...

    def kernel(self, position: int, ready: int, start: int, end: int) -> None:
        """`ready`: when the compute stream was free for it (after its split
        copies); it then waited for the tasks it reads until `start`."""

    def comm(
        self,
        comm: int,
        queued: int,
        concat_end: int | None,
        compute_free: int,
        start: int,
        end: int,
    ) -> None:
        """`queued`: when its stream was free; `compute_free`: the compute
        stream's free time when it was issued."""


def streams_iteration_ps(
    kernel_count: int,
    prefix_ps: Callable[[list[int]], list[int]],
    waits: dict[int, list[int]],
    comm_ps: list[int],
    copy_ps: list[int],
    comm_stream: list[int],
    last_producer: list[int],
    comm_waits: list[list[int]],
    bucket_count: int | None = None,
    blocking: bool = False,
    recorder: StreamRecorder | None = None,
) -> int:
    """The iteration time of the `gpu-streams` model (see the module docstring).

    `prefix_ps(positions)` gives, for each position i, the summed duration of
    the kernels at positions below i; `waits[i]` the communication tasks
    (ascending) the kernel at position i reads; per communication task: its
    transfer and copy times, its stream, the position of its last producing
    kernel (-1: none) and the communication tasks it reads (ascending). Tasks
    from `bucket_count` on are other collectives (None: there are none); the
    tasks are first renumbered in `issue_order`. With `blocking`, each
    collective holds the compute stream. A `recorder` is told every event.
    Raises RuntimeError (`raise_no_progress`) where a task can never start."""
    comms = len(comm_ps)
    original = None  # the caller's number of each task, when renumbered
    if bucket_count is not None:
        first_reader: list[float] = [math.inf] * comms
        for position, read in waits.items():
            for c in read:
                first_reader[c] = min(first_reader[c], position)
        order = issue_order(last_producer, comm_waits, bucket_count, first_reader)
        if order != list(range(comms)):
            original = order
            place = [0] * comms
            for number, c in enumerate(order):
                place[c] = number
            comm_ps = [comm_ps[c] for c in order]
            copy_ps = [copy_ps[c] for c in order]
            comm_stream = [comm_stream[c] for c in order]
            last_producer = [last_producer[c] for c in order]
            comm_waits = [sorted(place[d] for d in comm_waits[c]) for c in order]
            waits = {k: sorted(place[c] for c in read) for k, read in waits.items()}
    run = _StreamRun(
        comm_ps, copy_ps, comm_stream, last_producer, comm_waits, blocking, recorder, original
    )
    return run.run(kernel_count, prefix_ps, waits)


class _StreamRun:
    """The state of one `streams_iteration_ps` run, tasks in issue order:
    tasks 0..done-1 are issued and have their finish times."""

    __slots__ = (
        "comm_ps",
        "copy_ps",
        "comm_stream",
        "last_producer",
        "comm_waits",
        "blocking",
        "recorder",
        "original",
        "finish",
        "stream_free",
        "done",
        "concat_end",
        "produced_at",
        "split_done",
        "concat_after",
    )

    def __init__(
        self, comm_ps, copy_ps, comm_stream, last_producer, comm_waits, blocking, recorder, original
    ):
        self.comm_ps, self.copy_ps, self.comm_stream = comm_ps, copy_ps, comm_stream
        self.last_producer, self.comm_waits = last_producer, comm_waits
        self.blocking, self.recorder = blocking, recorder
        self.original = original if original is not None else range(len(comm_ps))
        self.finish = [0] * len(comm_ps)
        self.stream_free = [0] * (max(comm_stream, default=0) + 1)
        self.done = 0
        self.concat_end: dict[int, int] = {}
        self.produced_at: dict[int, int] = {}  # position -> end of that kernel
        self.split_done: set[int] = set()
        self.concat_after: dict[int, list[int]] = {}  # position -> tasks copied after it
        for c, copy in enumerate(copy_ps):
            if copy > 0:
                self.concat_after.setdefault(self._copy_position(c), []).append(c)

    def _copy_position(self, c: int) -> int:
        """The kernel position after which task c's concatenation runs: after
        its last producer; for a task no kernel produces that reads other
        tasks (a data-parallel all-reduce of reduce-scattered blocks), after
        the latest kernel those tasks wait for, at any depth."""
        position, pending, seen = self.last_producer[c], list(self.comm_waits[c]), set()
        while pending:
            d = pending.pop()
            if d not in seen:
                seen.add(d)
                position = max(position, self.last_producer[d])
                pending.extend(self.comm_waits[d])
        return position

    def issue(self, passed: int, free: int) -> int:
        """Issue tasks in order while each can start: its last producer is below
        position `passed` and every task it reads is issued. Returns the compute
        stream's free time (a blocking collective holds it)."""
        c, comms, blocking = self.done, len(self.comm_ps), self.blocking
        comm_ps, comm_stream, produced_at = self.comm_ps, self.comm_stream, self.produced_at
        last_producer, comm_waits, finish = self.last_producer, self.comm_waits, self.finish
        stream_free, concat_end, recorder = self.stream_free, self.concat_end, self.recorder
        while c < comms:
            producer, reads = last_producer[c], comm_waits[c]
            if producer >= passed or (reads and reads[-1] >= c):
                break
            stream = comm_stream[c]
            start = stream_free[stream]
            ready = concat_end[c] if c in concat_end else produced_at.get(producer, 0)
            if ready > start:
                start = ready
            if blocking and free > start:
                start = free
            for dep in reads:
                if finish[dep] > start:
                    start = finish[dep]
            end = start + comm_ps[c]
            if recorder is not None:
                queued = stream_free[stream]
                recorder.comm(self.original[c], queued, concat_end.get(c), free, start, end)
            finish[c] = stream_free[stream] = end
            if blocking:
                free = end
            c += 1
        self.done = c
        return free

    def wait_for(self, last: int, passed: int, free: int) -> int:
        """Issue tasks up to task `last`, the kernels below `passed` having run."""
        if last >= self.done:
            free = self.issue(passed, free)
            if last >= self.done:
                raise_no_progress()
        return free

    def concats(self, after: int, free: int) -> int:
        """The concatenation copies after the kernel at position `after`."""
        finish, recorder = self.finish, self.recorder
        for c in self.concat_after.get(after, ()):
            reads = self.comm_waits[c]
            if reads:
                free = self.wait_for(reads[-1], after + 1, free)
                free = max([free] + [finish[d] for d in reads])
            start, free = free, free + self.copy_ps[c]
            self.concat_end[c] = free
            if recorder is not None:
                recorder.concat(self.original[c], start, free)
        return free

    def splits(self, read: list[int], free: int) -> int:
        """The split copies of the buckets a kernel reads, when first read."""
        copy_ps, split_done, recorder = self.copy_ps, self.split_done, self.recorder
        for c in read:
            if copy_ps[c] > 0 and c not in split_done:
                split_done.add(c)
                start = max(free, self.finish[c])
                free = start + copy_ps[c]
                if recorder is not None:
                    recorder.split(self.original[c], start, free)
        return free

    def points(self, kernel_count: int, waits: dict[int, list[int]]) -> list[int]:
        """The kernel positions visited: every one when recording; else those that
        read a task or produce one last (and the first, after which blocking
        collectives with no producer are issued)."""
        if self.recorder is not None:
            return list(range(kernel_count))
        found = set(waits).union([p for p in self.last_producer if p >= 0])
        if self.blocking and kernel_count:
            found.add(0)
        return sorted(found)

    def run(self, kernel_count: int, prefix_ps, waits: dict[int, list[int]]) -> int:
        free = self.concats(-1, 0)
        points = self.points(kernel_count, waits)
        count = len(points)
        sums = prefix_ps(points + [p + 1 for p in points] + [kernel_count])
        previous = 0  # prefix sum at the kernel after the last point; `free` is when it ended
        finish, produced_at, recorder = self.finish, self.produced_at, self.recorder
        get_waits, get_concats = waits.get, self.concat_after.get
        copies = bool(self.concat_after)  # some task has copies (split before it is read)
        checked = recorder is not None or self.blocking
        for n, position in enumerate(points):
            read = get_waits(position)
            if read:
                free += sums[n] - previous
                if read[-1] >= self.done:
                    free = self.wait_for(read[-1], position, free)
                if copies:
                    free = self.splits(read, free)
                ready = free
                for c in read:
                    if finish[c] > free:
                        free = finish[c]
                start, previous = free, sums[count + n]
                free += previous - sums[n]
            else:
                after = sums[count + n]
                free += after - previous
                previous = after
            produced_at[position] = free
            if checked and recorder is not None:
                if not read:
                    start = ready = free - (sums[count + n] - sums[n])
                recorder.kernel(position, ready, start, free)
            if get_concats(position):
                free = self.concats(position, free)
            if checked and self.blocking:
                free = self.issue(position + 1, free)
        free += sums[-1] - previous
        if self.done < len(finish):  # tasks whose results no kernel reads still run
            free = self.wait_for(len(finish) - 1, kernel_count, free)
        return max([free] + finish)
