"""The fusion and split neighbours of a loaded plan: whether a move is legal,
the child's kernel order over the window where it differs from the parent's
(Kahn's algorithm from the first changed position until both orders meet), and
the child's iteration time from the parent's timeline."""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterator
from dataclasses import replace

import numpy as np

from disco_xla.plan import Plan
from disco_xla.simulator.events import PS_PER_S
from disco_xla.simulator.incremental.child_order import (
    Child,
    KernelChange,
    NewKernels,
    OrdersMeeting,
)
from disco_xla.simulator.streams import streams_iteration_ps

# Fusions of kernels further apart than this in the order are not evaluated: the
# order would change over a long stretch, and XLA never fuses such pairs either.
MAX_FUSE_DISTANCE = 64
# A change whose kernel order differs from the parent's over more kernels than
# this is not evaluated (a split half that could run much earlier, for one).
MAX_REORDER_KERNELS = 160


class KernelMoves:
    """The fusion and split moves of `state.PlanState`, which holds the loaded
    plan: its kernels (`instances`, `atoms`, `preds`, `succs`, `reads`,
    `priority`, `duration`), their order (`order`, `pos`, `prefix`; `full_only`:
    moves are simulated in full) and its
    communication tasks (`comm_ps`, `last_producer`, `wait_list`, ...)."""

    def evaluate_fuse(self, first: int, second: int) -> float | None:
        """Simulated iteration seconds of the plan that fuses kernels `first` and
        `second` (None: not legal, or not evaluated: see `legal_fuse` and
        MAX_REORDER_KERNELS)."""
        if self.profile.execution != "gpu-streams" or self.full_only:
            if not self.legal_fuse(first, second):
                return None
            return self._simulated_ps(self.fused_plan(first, second)) / PS_PER_S
        change = self._fusion(first, second)
        child = None if change is None else self._child(change)
        if child is None:
            return None
        try:
            return self._child_time(child) / PS_PER_S
        except RuntimeError:  # the child's buckets reorder its kernels (`state.full_only`)
            return self._simulated_ps(self.fused_plan(first, second)) / PS_PER_S

    def evaluate_split(self, kernel: int) -> float | None:
        """Simulated iteration seconds of the plan that splits `kernel` into the
        earlier and the later half of its instructions (None: not `splittable`, or
        not evaluated: MAX_REORDER_KERNELS)."""
        if self.profile.execution != "gpu-streams" or self.full_only:
            if not self.splittable(kernel):
                return None
            return self._simulated_ps(self.split_plan(kernel)) / PS_PER_S
        change = self._split(kernel)
        child = None if change is None else self._child(change)
        if child is None:
            return None
        try:
            return self._child_time(child) / PS_PER_S
        except RuntimeError:  # the child's buckets reorder its kernels (`state.full_only`)
            return self._simulated_ps(self.split_plan(kernel)) / PS_PER_S

    def legal_fuse(self, first: int, second: int) -> bool:
        """Whether fusing `second` into `first` gives a plan `verify_plan` accepts:
        one instance each, the same computation, at most one dot or convolution,
        and no other path from one to the other (through kernels, all-reduces or
        plumbing)."""
        if first == second or not (self.single[first] and self.single[second]):
            return False
        if self.pos[first] > self.pos[second]:
            first, second = second, first
        index = self.index
        atoms_a, atoms_b = self.atoms[first], self.atoms[second]
        if index.atoms[atoms_a[0]][0].computation is not index.atoms[atoms_b[0]][0].computation:
            return False
        if self.expensive[first] + self.expensive[second] > 1:
            return False
        if self.pos[second] - self.pos[first] > MAX_FUSE_DISTANCE:
            return False
        # An edge from `first` to `second` through a non-compute instruction.
        inside_a = set(atoms_a)
        for atom in atoms_b:
            for source in index.indirect_inputs[atom]:
                if source in inside_a or (
                    not index.is_compute[source] and inside_a & index.through(source)
                ):
                    return False
        # A path first -> x -> ... -> second through another kernel.
        limit = self.pos[second]
        stack = [k for k in self.succs[first] if k != second and self.pos[k] < limit]
        seen = set(stack)
        while stack:
            kernel = stack.pop()
            if second in self.succs[kernel]:
                return False
            for user in self.succs[kernel]:
                if user not in seen and self.pos[user] < limit:
                    seen.add(user)
                    stack.append(user)
        return True

    def splittable(self, kernel: int) -> bool:
        """Whether `Split(kernel)` is a move: a group of several instructions in a
        computation run once."""
        return self.single[kernel] and len(self.groups[self.instances[kernel][0]]) > 1

    def halves(self, kernel: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The group's instructions in module order, cut in the middle."""
        return self.costs.halves(self.groups[self.instances[kernel][0]])

    def _merged(self, first: int, second: int) -> tuple[str, ...]:
        """Both groups' instructions in module order."""
        key = (first, second) if first < second else (second, first)
        found = self._merged_cache.get(key)
        if found is None:
            names = self.groups[self.instances[first][0]] + self.groups[self.instances[second][0]]
            found = self._merged_cache[key] = tuple(
                sorted(names, key=self.index.name_position.__getitem__)
            )
        return found

    def _fusion(self, first: int, second: int) -> KernelChange | None:
        """Fusing two kernels, as a change of kernels (None: not legal)."""
        if self.pos[first] > self.pos[second]:
            first, second = second, first
        if not self.legal_fuse(first, second):
            return None
        group_rank = min(self.instances[first][0], self.instances[second][0])
        return KernelChange(
            (first, second),
            [self._merged(first, second)],
            [self.atoms[first] + self.atoms[second]],
            [(group_rank, 0)],
            [2],
            (),
        )

    def _split(self, kernel: int) -> KernelChange | None:
        """Splitting a kernel, as a change of kernels (None: not `splittable`)."""
        if not self.splittable(kernel):
            return None
        groups = list(self.halves(kernel))
        # A group run once has one part, in its computation's only instance.
        kernel_parts = self.costs.kernel_parts
        halves = (kernel_parts(groups[0])[0], kernel_parts(groups[1])[0])
        group_rank = self.priority[kernel][2]
        return KernelChange(
            (kernel,),
            groups,
            [list(half.atoms) for half in halves],
            [(group_rank, 0), (group_rank, 1)],
            [0, 1],
            halves,
        )

    def _child(self, change: KernelChange) -> Child | None:
        """The child's new kernels and its order from the first changed position
        until it meets the parent's order again (None: not evaluated)."""
        new = self._new_kernels(change)
        first = self._first_changed(change, new)
        if first is None:
            return None
        start, skipped = first
        found = self._kahn_window(change, new, start, skipped)
        if found is None:
            return None
        window, parent_at = found
        # The new kernels' durations, once the change is known to be evaluated.
        runs = self.runs[change.removed[0]]  # a fused or split kernel is in one instance
        durations = self.costs.durations(change.groups)
        duration = {kernel: ps * runs for kernel, ps in zip(new.ids, durations, strict=True)}
        return Child(
            change.removed, new.ids, new.reads, duration, start, window, parent_at, new.kernel_of
        )

    def _new_kernels(self, change: KernelChange) -> NewKernels:
        """The kernels `change` adds, with their edges and priorities."""
        count = len(self.order)
        new = NewKernels(self, change.removed, list(range(count, count + len(change.groups))))
        for kernel, atoms in zip(new.ids, change.atoms, strict=True):
            for atom in atoms:
                new.kernel_of_atom[atom] = kernel
        if len(change.removed) == 2:
            kernel_ranks = self._fused_edges(change, new)
        else:
            kernel_ranks = self._split_edges(change, new)
        for kernel, rank, kernel_rank in zip(new.ids, change.ranks, kernel_ranks, strict=True):
            new.priority[kernel] = (bool(new.reads[kernel]), kernel_rank, *rank, ())
        return new

    def _fused_edges(self, change: KernelChange, new: NewKernels) -> list[int]:
        """A fusion's kernel has both kernels' edges. Returns its kernel rank."""
        first, second = change.removed
        (merged,) = new.ids
        new.preds[merged] = (self.preds[first] | self.preds[second]) - new.removed
        users = (self.succs[first] | self.succs[second]) - new.removed
        new.succs[merged] = users
        for user in users:
            new.readers_of_new[user] = {merged}
        new.reads[merged] = self.reads[first] | self.reads[second]
        return [self.index.kernel_rank(change.atoms[0])]

    def _split_edges(self, change: KernelChange, new: NewKernels) -> list[int]:
        """A split's halves have the edges of their atoms. Returns their kernel ranks."""
        count, kernel_of, readers_of_new = len(self.order), new.kernel_of, new.readers_of_new
        for kernel, half in zip(new.ids, change.halves, strict=True):
            preds = {kernel_of(s) for s in half.order_sources}
            preds.discard(kernel)
            new.preds[kernel] = preds
            succs = new.succs[kernel]
            for user_atom in half.order_targets:
                user = kernel_of(user_atom)
                if user != kernel:
                    succs.add(user)
                    if user < count:
                        readers_of_new.setdefault(user, set()).add(kernel)
            new.reads[kernel] = half.reads
        return [half.rank for half in change.halves]

    def _first_changed(self, change: KernelChange, new: NewKernels) -> tuple[int, int] | None:
        """(the first position where the child's order can differ from the
        parent's, how many positions before it were skipped as equal), or None
        when the order would change over too long a stretch (not evaluated)."""
        count, order, pos = len(self.order), self.order, self.pos
        # Nothing changes before the first removed kernel or the first step at
        # which a new kernel could be ready (it may rank above what ran there).
        first_removed = min(pos[k] for k in change.removed)
        start = first_removed
        for kernel in new.ids:
            earliest = 1 + max((pos[p] for p in new.preds[kernel] if p < count), default=-1)
            start = min(start, earliest)
        if max(pos[k] for k in change.removed) - start > MAX_REORDER_KERNELS:
            return None
        # Skip the steps where the child runs what the parent ran: until a removed
        # kernel, the parent's pick is ready in the child too and is the lowest
        # there, unless a new kernel is ready and ranks lower. The skipped steps
        # still count towards the reordering limit.
        skipped_from = start
        ready_from = {
            kernel: 1 + max((pos[p] for p in preds), default=-1)
            for kernel, preds in new.preds.items()
            if all(p < count for p in preds)
        }
        priority, new_priority = self.priority, new.priority
        while start < first_removed:
            here = priority[order[start]]
            if any(at <= start and new_priority[k] < here for k, at in ready_from.items()):
                break
            start += 1
        return start, start - skipped_from

    def _kahn_window(
        self, change: KernelChange, new: NewKernels, start: int, skipped: int
    ) -> tuple[list[int], int] | None:
        """Kahn's algorithm over the child's kernels from position `start`, until
        the child has run the same kernels as the parent (from there both orders
        are the same, `OrdersMeeting`) and every new kernel. Returns (the child's
        kernels from `start`, the parent's position where the orders meet), or
        None: the window grew past MAX_REORDER_KERNELS, or the child has a cycle."""
        priority, count = self.priority, len(self.order)
        sorted_ready = self._ready_at_start(start, new.removed)
        next_ready = next(sorted_ready, None)
        next_priority = None if next_ready is None else priority[next_ready]
        heap = new.ready_heap(start)
        new.index_readers()
        meeting = OrdersMeeting(self.order, change, new.ids, start)
        emitted: set[int] = set()
        remaining: dict[int, int] = {}
        window: list[int] = []
        heappop, ran, release = heapq.heappop, meeting.ran, self._release_users
        while heap or next_ready is not None:
            if next_ready is not None and (not heap or next_priority < heap[0][0]):
                kernel = next_ready
                next_ready = next(sorted_ready, None)
                next_priority = None if next_ready is None else priority[next_ready]
            else:
                kernel = heappop(heap)[1]
            window.append(kernel)
            if len(window) + skipped > MAX_REORDER_KERNELS:
                return None  # the order changes over too long a stretch: not evaluated
            emitted.add(kernel)
            if ran(kernel) and all(k in emitted for k in new.ids):
                break
            release(kernel, new, start, emitted, remaining, heap)
        else:
            if len(window) != count - len(change.removed) + len(new.ids) - start:
                return None  # a cycle: not a legal plan
        return window, meeting.parent_at

    def _ready_at_start(self, start: int, removed: set[int]) -> Iterator[int]:
        """The parent's kernels ready at `start` (all their inputs ran before it),
        in priority order. They stay ready until they run, so the parent ran them
        in priority order: in position order they are sorted, and they merge with
        the heap of the kernels that become ready later without being pushed."""
        order, max_pred_position = self.order, self.max_pred_position
        for low in range(start, len(order), 256):
            chunk = max_pred_position[low : low + 256]
            for position in (np.flatnonzero(chunk < start) + low).tolist():
                kernel = order[position]
                if kernel not in removed:
                    yield kernel

    def _release_users(
        self,
        kernel: int,
        new: NewKernels,
        start: int,
        emitted: set[int],
        remaining: dict[int, int],
        heap: list,
    ) -> None:
        """Push onto `heap` the users of `kernel` that it leaves with every input run."""
        count, pos, removed = len(self.order), self.pos, new.removed
        if kernel < count:
            users = self.succs[kernel]
            extra_users = new.readers_of.get(kernel)
            if extra_users:
                users = list(users) + extra_users
        else:
            users = new.succs[kernel]
        preds_of, priority_of = new.preds_of, new.priority_of
        for user in users:
            if user in emitted or user in removed:
                continue
            left = remaining.get(user)
            if left is not None:
                left -= 1
            else:
                left = 0
                for p in preds_of(user):
                    if p not in emitted and (p >= count or pos[p] >= start):
                        left += 1
            remaining[user] = left
            if left == 0:
                heapq.heappush(heap, (priority_of(user), user))

    def _child_time(self, child: Child) -> int:
        """Iteration ps of the child: the parent's timeline with the window's
        kernels in place of the parent's (`streams_iteration_ps`)."""
        start, window, parent_at = child.start, child.window, child.parent_at
        if parent_at <= self.first_point and not any(child.reads.values()):
            # The change and its reordering end before the timeline first meets
            # communication, and the new kernels read none: every later time is
            # a max-plus expression of prefix sums past the window, so the whole
            # timeline after it moves by the window's change in duration.
            removed_ps = sum(self.duration[kernel] for kernel in child.removed)
            return self.iteration_ps + sum(child.duration.values()) - removed_ps
        window_position = {k: start + n for n, k in enumerate(window)}
        shift = start + len(window) - parent_at
        kernel_count = len(self.order) - len(child.removed) + len(child.new_ids)
        return self.step_ps + streams_iteration_ps(
            kernel_count,
            self._child_prefix(child),
            self._child_waits(child, window_position, shift),
            self.comm_ps,
            self.copy_ps,
            self.stream,
            self._child_last_producers(child, window_position, shift),
            self.comm_waits,
            len(self.buckets),
        )

    def _child_prefix(self, child: Child) -> Callable[[list[int]], list[int]]:
        """`streams_iteration_ps`'s prefix sums of the child's order: the parent's
        before the window, the window's own, then the parent's moved by the
        window's change in length and duration."""
        start, window, prefix = child.start, child.window, self.prefix
        window_prefix = [prefix[start]]
        for kernel in window:
            duration = child.duration.get(kernel)
            window_prefix.append(
                window_prefix[-1] + (self.duration[kernel] if duration is None else duration)
            )
        end = start + len(window)
        shift = end - child.parent_at
        tail = window_prefix[-1] - prefix[child.parent_at]
        prefix_array = self.prefix_array

        def prefix_ps(positions: list[int]) -> list[int]:
            at = np.array(positions, dtype=np.int64)
            values = prefix_array[np.minimum(at, start)]
            inside = (at > start) & (at <= end)
            if inside.any():
                values[inside] = np.array(window_prefix, dtype=np.int64)[at[inside] - start]
            later = at > end
            values[later] = prefix_array[at[later] - shift] + tail
            return values.tolist()

        return prefix_ps

    def _child_waits(
        self, child: Child, window_position: dict[int, int], shift: int
    ) -> dict[int, list[int]]:
        """The communication tasks each kernel of the child reads, by position."""
        low = bisect.bisect_left(self.wait_positions, child.start)
        high = bisect.bisect_left(self.wait_positions, child.parent_at)
        waits = {position: comms for position, _, comms in self.wait_list[:low]}
        for _, kernel, comms in self.wait_list[low:high]:
            if kernel not in child.removed:
                waits[window_position[kernel]] = comms
        for position, _, comms in self.wait_list[high:]:
            waits[position + shift] = comms
        comm_of = self.comm_of_atom
        for kernel, reads in child.reads.items():
            if reads:
                waits[window_position[kernel]] = sorted({comm_of[a] for a in reads})
        return waits

    def _child_last_producers(
        self, child: Child, window_position: dict[int, int], shift: int
    ) -> list[int]:
        """The position of each communication task's last producer in the child."""
        start, parent_at, pos, kernel_of = child.start, child.parent_at, self.pos, child.kernel_of

        def position_of(kernel: int) -> int:
            found = window_position.get(kernel)
            if found is not None:
                return found
            position = pos[kernel]
            return position if position < start else position + shift

        last = list(self.last_producer)
        touched = set()
        for kernel in child.removed:
            touched.update(self.comms_of_kernel.get(kernel, ()))
        for number, parent_last in enumerate(last):
            if number in touched or start <= parent_last < parent_at:
                last[number] = max(position_of(kernel_of(a)) for a in self.producer_atoms[number])
            elif parent_last >= parent_at:
                last[number] = parent_last + shift
        return last

    def fused_plan(self, first: int, second: int) -> Plan:
        """The plan that fuses kernels `first` and `second`: the fused group takes
        the place of the earlier of the two in the plan's list, so every other
        group keeps its priority."""
        if self.pos[first] > self.pos[second]:
            first, second = second, first
        merged = self._merged(first, second)
        a, b = self.instances[first][0], self.instances[second][0]
        groups = list(self.groups)
        groups[min(a, b)] = merged
        del groups[max(a, b)]
        return self._with_groups(groups)

    def split_plan(self, kernel: int) -> Plan:
        """The plan that splits `kernel`: its halves take its group's place."""
        groups = list(self.groups)
        g = self.instances[kernel][0]
        groups[g : g + 1] = list(self.halves(kernel))
        return self._with_groups(groups)

    def _with_groups(self, groups: list[tuple[str, ...]]) -> Plan:
        plan = self.plan
        return replace(plan, fusion_groups=tuple(groups))
