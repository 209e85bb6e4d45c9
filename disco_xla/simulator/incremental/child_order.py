"""The kernels a fusion or a split adds to a plan, and where the child's kernel
order meets the parent's again: the pieces of `moves`' windowed Kahn's
algorithm."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from disco_xla.simulator.plan_kernels import KernelPart


class KernelOrderState(Protocol):
    """What `NewKernels` reads of the parent plan's state."""

    order: list[int]
    pos: list[int]
    preds: list[set[int]]
    priority: list[tuple]
    kernel_of_atom: dict[int, int]


class KernelChange(NamedTuple):
    """A fusion or a split, as the kernels it removes and those it adds."""

    removed: tuple[int, ...]  # a fusion's two kernels (earlier first), or the split kernel
    groups: list[tuple[str, ...]]  # each new kernel's group
    atoms: list[list[int]]  # each new kernel's atoms
    ranks: list[tuple[int, int]]  # each new kernel's group number and half (its priority)
    # The parent's kernels each new kernel stands for in the order: the fusion's
    # two, or for a split nothing then the split kernel (its later half).
    units: list[int]
    halves: tuple[KernelPart, ...]  # a split's halves, else ()


class NewKernels:
    """The kernels a change adds (numbered from the parent's kernel count on):
    their edges to the parent's kernels, what they read and their priorities."""

    __slots__ = (
        "ids",
        "removed",
        "count",
        "parent_pos",
        "parent_preds",
        "parent_priority",
        "parent_kernel_of",
        "kernel_of_atom",
        "preds",
        "succs",
        "reads",
        "priority",
        "readers_of_new",
        "readers_of",
    )

    def __init__(self, state: KernelOrderState, removed: tuple[int, ...], ids: list[int]):
        self.ids = ids
        self.removed = set(removed)
        self.count = len(state.order)
        self.parent_pos = state.pos
        self.parent_preds, self.parent_priority = state.preds, state.priority
        self.parent_kernel_of = state.kernel_of_atom
        self.kernel_of_atom: dict[int, int] = {}  # the new kernels' atoms
        self.preds: dict[int, set[int]] = {}
        self.succs: dict[int, set[int]] = {kernel: set() for kernel in ids}
        self.reads: dict[int, frozenset[int]] = {}
        self.priority: dict[int, tuple] = {}
        self.readers_of_new: dict[int, set[int]] = {}  # parent kernel -> new kernels it reads
        self.readers_of: dict[int, list[int]] = {}  # kernel -> new kernels that read it

    def kernel_of(self, atom: int) -> int:
        """The child's kernel of `atom`."""
        found = self.kernel_of_atom.get(atom)
        return self.parent_kernel_of[atom] if found is None else found

    def preds_of(self, kernel: int):
        """The kernels `kernel` waits for in the child."""
        if kernel >= self.count:
            return self.preds[kernel]
        extra, removed = self.readers_of_new.get(kernel), self.removed
        if extra is None:
            return [p for p in self.parent_preds[kernel] if p not in removed]
        return (self.parent_preds[kernel] - removed) | extra

    def priority_of(self, kernel: int) -> tuple:
        found = self.priority.get(kernel)
        return self.parent_priority[kernel] if found is None else found

    def index_readers(self) -> None:
        """`readers_of`: for each kernel, the new kernels that wait for it."""
        for kernel in self.ids:
            for pred in self.preds[kernel]:
                self.readers_of.setdefault(pred, []).append(kernel)

    def ready_heap(self, start: int) -> list:
        """A heap of the new kernels whose inputs all ran before position `start`."""
        pos, preds = self.parent_pos, self.preds
        heap = [
            (self.priority_of(kernel), kernel)
            for kernel in self.ids
            if all(p not in preds and pos[p] < start for p in preds[kernel])
        ]
        heapq.heapify(heap)
        return heap


class OrdersMeeting:
    """Where the child's order meets the parent's again: for each kernel the
    child runs, the parent runs as many as it stands for (a fused kernel two, a
    split's first half none); they meet when both have run the same kernels."""

    __slots__ = ("order", "removed", "unit_of", "extra_child", "extra_parent", "parent_at")

    def __init__(self, order: list[int], change: KernelChange, ids: list[int], start: int):
        self.order, self.removed = order, change.removed
        self.unit_of = dict(zip(ids, change.units, strict=True))
        self.extra_child: set[int] = set()  # run by the child, not yet by the parent
        self.extra_parent: set[int] = set()  # run by the parent, not yet by the child
        self.parent_at = start  # the parent has run the kernels before this position

    def ran(self, kernel: int) -> bool:
        """The child ran `kernel`; whether both have now run the same kernels."""
        extra_child, extra_parent = self.extra_child, self.extra_parent
        units = self.unit_of.get(kernel)
        if units is None:
            if kernel in extra_parent:
                extra_parent.remove(kernel)
            else:
                extra_child.add(kernel)
            units = 1
        else:
            for item in self.removed if units else ():
                if item in extra_parent:
                    extra_parent.remove(item)
                else:
                    extra_child.add(item)
        order, parent_at = self.order, self.parent_at
        self.parent_at = parent_at + units
        while units:
            item = order[parent_at]
            parent_at += 1
            units -= 1
            if item in extra_child:
                extra_child.remove(item)
            else:
                extra_parent.add(item)
        return not extra_child and not extra_parent


@dataclass
class Child:
    """A fusion or split evaluated: its new kernels and the child's order over the
    window where it differs from the parent's."""

    removed: tuple[int, ...]
    new_ids: list[int]
    reads: dict[int, frozenset[int]]  # per new kernel
    duration: dict[int, int]  # per new kernel, ps
    start: int  # the window's first position
    window: list[int]  # the child's kernels from `start`
    parent_at: int  # the parent's position where the orders meet again
    kernel_of: Callable[[int], int]  # the child's kernel of an atom
