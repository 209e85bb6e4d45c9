"""The IR: a parsed HloModuleProto plus a graph view over it, built once.

`HloModule` owns the proto. Its graph view (computations, instructions, operands,
users, control predecessors, called computations) is built and validated when the
module is constructed, so every later stage reads one shared, checked object and
nothing re-parses. Opcodes the view does not model are kept as they are: they take
part in the graph like any other instruction and count zero FLOPs.

Beside the view, this module infers device counts and partitioning from the
module; the analyses `reductions` (every cross-device reduction, and which
reduce gradients: `gradients`) and `flops` (the FLOP model) back
`HloModule.all_reduces`, `Instruction.flops` and `HloModule.total_flops`.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable
from functools import cached_property

from google.protobuf.message import DecodeError

from disco_xla.errors import DiscoInputError
from disco_xla.hlo import hlo_schema
from disco_xla.hlo.analysis_cache import AnalysisCache
from disco_xla.hlo.devices import already_partitioned, device_counts, needs_partitioning
from disco_xla.hlo.flops import estimate_flops, total_flops
from disco_xla.hlo.opcodes import (
    ALL_REDUCE_OPCODES,
    COLLECTIVE_DONE_OPCODES,
    COLLECTIVE_OPCODES,
    CONTROL_FLOW_OPCODES,
    REDUCTION_OPCODES,
)
from disco_xla.hlo.reductions import AllReduce, cross_device_reductions
from disco_xla.hlo.shapes import Shape, shape_from_proto

__all__ = [  # the opcode sets are read through this module too
    "ALL_REDUCE_OPCODES",
    "COLLECTIVE_DONE_OPCODES",
    "COLLECTIVE_OPCODES",
    "CONTROL_FLOW_OPCODES",
    "REDUCTION_OPCODES",
]


class Instruction:
    """One HLO instruction, linked to its operands, users and called computations."""

    __slots__ = (
        "proto",
        "name",
        "opcode",
        "id",
        "computation",
        "_shape",
        "operands",
        "users",
        "control_predecessors",
        "called_computations",
    )

    def __init__(self, proto, computation: Computation):
        self.proto = proto
        self.name: str = proto.name
        self.opcode: str = proto.opcode
        self.id: int = proto.id
        self.computation = computation
        self._shape: Shape | None = None
        self.operands: list[Instruction] = []
        self.users: list[Instruction] = []
        self.control_predecessors: list[Instruction] = []
        self.called_computations: list[Computation] = []

    @property
    def shape(self) -> Shape:
        """The result's shape, converted from the proto when first read: most
        views (a module's copy before a pass rebuilds it, a compiled module
        searched for its all-reduces) never read most of their shapes."""
        if self._shape is None:
            self._shape = shape_from_proto(self.proto.shape)
        return self._shape

    @property
    def op_name(self) -> str:
        """The framework-level name XLA kept in `metadata.op_name` ('' if none)."""
        return self.proto.metadata.op_name

    @property
    def output_bytes(self) -> int:
        return self.shape.bytes

    @property
    def operand_bytes(self) -> int:
        return sum(op.shape.bytes for op in self.operands)

    @property
    def flops(self) -> int:
        """Estimated floating-point operations of this instruction alone."""
        return estimate_flops(self)

    def __repr__(self) -> str:
        return f"<{self.opcode} {self.name}: {self.shape}>"


class Computation:
    """An HLO computation: its instructions in proto order, and its root."""

    def __init__(self, proto, module: HloModule):
        self.proto = proto
        self.module = module
        self.name: str = proto.name
        self.id: int = proto.id
        self.instructions: list[Instruction] = [Instruction(p, self) for p in proto.instructions]
        self.by_name: dict[str, Instruction] = {i.name: i for i in self.instructions}
        self.callers: list[Instruction] = []
        self.root: Instruction | None = None

    @property
    def role(self) -> str:
        """'entry', 'program' (reached by call/while/...), 'fusion', or 'applied'
        (a reducer or comparator passed as `to_apply`)."""
        if self is self.module.entry:
            return "entry"
        if self.proto.is_fusion_computation or any(c.opcode == "fusion" for c in self.callers):
            return "fusion"
        if not self.callers or any(c.opcode in CONTROL_FLOW_OPCODES for c in self.callers):
            return "program"
        return "applied"

    @cached_property
    def topological_order(self) -> list[Instruction]:
        """Instructions with every operand and control predecessor before its users.
        Ties follow proto order, so the order is deterministic."""
        order: list[Instruction] = []
        state: dict[int, int] = {}  # id(instr) -> 1 while on the stack, 2 when placed
        for start in self.instructions:
            if id(start) in state:
                continue
            stack = [(start, iter(start.operands + start.control_predecessors))]
            state[id(start)] = 1
            while stack:
                node, pending = stack[-1]
                for dep in pending:
                    mark = state.get(id(dep))
                    if mark is None:
                        state[id(dep)] = 1
                        stack.append((dep, iter(dep.operands + dep.control_predecessors)))
                        break
                    if mark == 1:
                        raise DiscoInputError(
                            self.module.source,
                            f"computation {self.name!r} has a cycle through {dep.name!r}",
                        )
                else:
                    stack.pop()
                    state[id(node)] = 2
                    order.append(node)
        return order

    def __repr__(self) -> str:
        return f"<computation {self.name}: {len(self.instructions)} instructions>"


class HloModule:
    """A parsed HloModuleProto with its graph view.

    `source` names where it came from (a path, or '<jax:fn>'), for error messages;
    `file_format` is how it was stored ('pb', 'txt', 'pb.gz', 'txt.gz', 'memory').
    """

    def __init__(self, proto, source: str = "<memory>", file_format: str = "memory"):
        self.proto = proto
        self.source = source
        self.file_format = file_format
        self.name: str = proto.name
        if not proto.computations:
            raise DiscoInputError(source, "not an HloModuleProto: it has no computations")
        self.analyses = AnalysisCache()  # what later stages work out about it
        self._build_view()

    def _build_view(self) -> None:
        self._instruction_by_name: dict[str, Instruction] | None = None  # built on first use
        self.computations: list[Computation] = [
            Computation(c, self) for c in self.proto.computations
        ]
        self.entry: Computation = self._find_entry()
        self._link()
        self._check_calls_acyclic()

    def rebuild(self) -> None:
        """Rebuild the graph view after a pass changed the proto.

        Instructions are re-ordered in the proto so that each comes after its
        operands, and computations so that each comes after those it calls, as
        XLA requires when it reads a proto; a pass may therefore append new
        instructions and computations anywhere. Cached analyses are dropped
        (`analyses`, and the module's own).
        """
        for name in ("all_reduces", "total_flops", "fingerprint"):
            self.__dict__.pop(name, None)
        self.analyses.clear()
        self._build_view()
        if _reorder(self.proto.computations, self._callees_first()):
            self._build_view()
        moved = False
        for computation in self.computations:
            moved |= _reorder(computation.proto.instructions, computation.topological_order)
        if moved:  # reordering copies the protos: the view must hold the new ones
            self._build_view()

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "<memory>", file_format: str = "pb"):
        """Parse a serialized HloModuleProto, or the HloProto wrapper around one that
        XLA's `--xla_dump_hlo_as_proto` writes. Corrupt data raises DiscoInputError."""
        try:
            proto = hlo_schema.HloModuleProto.FromString(data)
        except (DecodeError, RuntimeError, ValueError) as error:
            proto = _module_inside_wrapper(data)
            if proto is None:
                detail = str(error) or "the data is truncated or corrupt"
                raise DiscoInputError(source, f"not a valid HloModuleProto ({detail})") from None
            return cls(proto, source, file_format)
        try:
            return cls(proto, source, file_format)
        except DiscoInputError:
            wrapped = _module_inside_wrapper(data)
            if wrapped is None:
                raise
            return cls(wrapped, source, file_format)

    def to_bytes(self) -> bytes:
        """Serialize deterministically; fields we do not model are kept."""
        return self.proto.SerializeToString(deterministic=True)

    @cached_property
    def fingerprint(self) -> str:
        """A hash of the program, equal across processes and runs: the sha256 of
        its serialization with the module `id` cleared, every computation and
        instruction id replaced by its position, and source locations dropped.
        XLA draws those ids from per-process counters, and the locations name the
        caller's line, so the same step lowered after other work, or from another
        line, would otherwise hash differently (and ranks could disagree)."""
        canonical = type(self.proto)()
        canonical.CopyFrom(self.proto)
        canonical.ClearField("id")
        # Where in the user's source each op came from is not the program: drop
        # it (source_file/line, and the stack frames we do not model).
        canonical.DiscardUnknownFields()
        computation_index = {c.id: n for n, c in enumerate(canonical.computations)}
        for computation in canonical.computations:
            position = {i.id: n for n, i in enumerate(computation.instructions)}
            computation.id = computation_index[computation.id]
            computation.root_id = position.get(computation.root_id, -1)
            for instr in computation.instructions:
                instr.metadata.ClearField("source_file")
                instr.metadata.ClearField("source_line")
                instr.id = position[instr.id]
                instr.operand_ids[:] = [position.get(o, -1) for o in instr.operand_ids]
                instr.control_predecessor_ids[:] = [
                    position.get(p, -1) for p in instr.control_predecessor_ids
                ]
                instr.called_computation_ids[:] = [
                    computation_index.get(c, -1) for c in instr.called_computation_ids
                ]
        canonical.entry_computation_id = computation_index.get(canonical.entry_computation_id, -1)
        return hashlib.sha256(canonical.SerializeToString(deterministic=True)).hexdigest()

    # -- lookup -------------------------------------------------------------
    def computation(self, name: str) -> Computation:
        return self._computation_by_name[name]

    def instructions(self):
        """Every instruction of every computation, in proto order."""
        for computation in self.computations:
            yield from computation.instructions

    def instruction(self, name: str) -> Instruction:
        """The instruction called `name` (XLA keeps names unique in a module; if
        two share one, the later in proto order). KeyError if there is none."""
        if self._instruction_by_name is None:
            self._instruction_by_name = {instr.name: instr for instr in self.instructions()}
        return self._instruction_by_name[name]

    # -- editing ------------------------------------------------------------
    def remove_instructions(self, instructions: Iterable[Instruction]) -> int:
        """Delete these instructions' protos from their computations' protos;
        returns how many were deleted. The graph view is left as it was: a pass
        calls `rebuild()` once it is done. Deleting rebuilds a computation's
        repeated field, and protobuf copies the kept messages into it, so protos
        of that computation held from before describe the module as it was."""
        doomed: dict[int, tuple[Computation, set[int]]] = {}
        for instr in instructions:
            doomed.setdefault(id(instr.computation), (instr.computation, set()))[1].add(instr.id)
        removed = 0
        for computation, ids in doomed.values():
            protos = computation.proto.instructions
            kept = [proto for proto in protos if proto.id not in ids]
            if len(kept) != len(protos):
                removed += len(protos) - len(kept)
                del protos[:]
                protos.extend(kept)
        return removed

    @property
    def instruction_count(self) -> int:
        return sum(len(c.instructions) for c in self.computations)

    # -- construction -------------------------------------------------------
    def _find_entry(self) -> Computation:
        self._computation_by_id: dict[int, Computation] = {}
        self._computation_by_name: dict[str, Computation] = {}
        for computation in self.computations:
            if not computation.instructions:
                raise DiscoInputError(
                    self.source, f"computation {computation.name!r} has no instructions"
                )
            if computation.id in self._computation_by_id:
                raise DiscoInputError(self.source, f"duplicate computation id {computation.id}")
            self._computation_by_id[computation.id] = computation
            self._computation_by_name[computation.name] = computation
        entry = self._computation_by_id.get(self.proto.entry_computation_id)
        if entry is None or (
            self.proto.entry_computation_name and entry.name != self.proto.entry_computation_name
        ):
            entry = self._computation_by_name.get(self.proto.entry_computation_name)
        if entry is None:
            raise DiscoInputError(
                self.source,
                "the entry computation "
                f"({self.proto.entry_computation_name or self.proto.entry_computation_id!r}) "
                "is not in the module",
            )
        return entry

    def _link(self) -> None:
        for computation in self.computations:
            by_id: dict[int, Instruction] = {}
            for instr in computation.instructions:
                if not instr.opcode:
                    raise DiscoInputError(self.source, f"instruction {instr.name!r} has no opcode")
                if instr.id in by_id:
                    raise DiscoInputError(
                        self.source,
                        f"computation {computation.name!r} has two instructions with id {instr.id}",
                    )
                by_id[instr.id] = instr
            for instr in computation.instructions:
                proto = instr.proto
                instr.operands = [
                    self._resolve(by_id, i, instr, "operand") for i in proto.operand_ids
                ]
                instr.control_predecessors = [
                    self._resolve(by_id, i, instr, "control predecessor")
                    for i in proto.control_predecessor_ids
                ]
                for operand in instr.operands:
                    operand.users.append(instr)
                for called_id in proto.called_computation_ids:
                    called = self._computation_by_id.get(called_id)
                    if called is None:
                        raise DiscoInputError(
                            self.source,
                            f"instruction {instr.name!r} calls unknown computation id {called_id}",
                        )
                    instr.called_computations.append(called)
                    called.callers.append(instr)
            computation.root = by_id.get(computation.proto.root_id)
            if computation.root is None:
                raise DiscoInputError(
                    self.source,
                    f"computation {computation.name!r} has no root instruction "
                    f"(root id {computation.proto.root_id})",
                )

    def _callees_first(self) -> list[Computation]:
        """Computations in proto order, moved as needed so callees come first."""
        placed: set[int] = set()
        order: list[Computation] = []

        def place(computation: Computation) -> None:
            # Call depth is small (a handful of nested loops and calls), and the
            # call graph is checked acyclic before this runs.
            if computation.id in placed:
                return
            placed.add(computation.id)
            for instr in computation.instructions:
                for called in instr.called_computations:
                    place(called)
            order.append(computation)

        for computation in self.computations:
            place(computation)
        return order

    def _check_calls_acyclic(self) -> None:
        state: dict[int, int] = {}
        for start in self.computations:
            if start.id in state:
                continue
            state[start.id] = 1
            stack = [(start, iter([c for i in start.instructions for c in i.called_computations]))]
            while stack:
                computation, pending = stack[-1]
                for called in pending:
                    mark = state.get(called.id)
                    if mark == 1:
                        raise DiscoInputError(
                            self.source, f"computation {called.name!r} calls itself (a call cycle)"
                        )
                    if mark is None:
                        state[called.id] = 1
                        callees = [c for i in called.instructions for c in i.called_computations]
                        stack.append((called, iter(callees)))
                        break
                else:
                    stack.pop()
                    state[computation.id] = 2

    def _resolve(self, by_id: dict[int, Instruction], target: int, user: Instruction, what: str):
        found = by_id.get(target)
        if found is None:
            raise DiscoInputError(
                self.source,
                f"instruction {user.name!r} in {user.computation.name!r} refers to unknown "
                f"{what} id {target}",
            )
        return found

    # -- analyses -----------------------------------------------------------
    @cached_property
    def all_reduces(self) -> list[AllReduce]:
        """Every all-reduce and reduce-scatter, with which ones reduce gradients
        (`reductions.cross_device_reductions`)."""
        return cross_device_reductions(self)

    @property
    def gradient_all_reduces(self) -> list[AllReduce]:
        """The gradient reductions a plan buckets: all-reduces, and reduce-scatters
        (a bucket holds one kind)."""
        return [a for a in self.all_reduces if a.is_gradient]

    @cached_property
    def total_flops(self) -> int:
        """FLOPs of one run of the program (`flops.total_flops`)."""
        return total_flops(self)

    def opcode_histogram(self) -> Counter:
        return Counter(instr.opcode for instr in self.instructions())

    def device_counts(self) -> dict[str, int]:
        """num_replicas and num_partitions (`devices.device_counts`)."""
        return device_counts(self)

    def worker_count(self) -> int:
        """The devices the step runs on: replicas times partitions."""
        counts = self.device_counts()
        return counts["num_replicas"] * counts["num_partitions"]

    @property
    def already_partitioned(self) -> bool:
        """Whether this is one partition's program, as XLA's SPMD partitioner
        leaves it (`devices.already_partitioned`)."""
        return already_partitioned(self)

    @property
    def needs_partitioning(self) -> bool:
        """Whether XLA's SPMD partitioner will split this module over several
        devices by its shardings alone (`devices.needs_partitioning`)."""
        return needs_partitioning(self)

    def __repr__(self) -> str:
        return f"<HloModule {self.name}: {len(self.computations)} computations>"


def _reorder(repeated, items) -> bool:
    """Make a repeated proto field hold `items`' protos in this order. Returns
    whether the order changed."""
    if [item.id for item in items] == [proto.id for proto in repeated]:
        return False
    ordered = [type(item.proto)() for item in items]
    for copy, item in zip(ordered, items, strict=True):
        copy.CopyFrom(item.proto)
    del repeated[:]
    repeated.extend(ordered)
    return True


def _module_inside_wrapper(data: bytes):
    """The HloModuleProto inside an HloProto, or None if `data` is not one."""
    try:
        wrapper = hlo_schema.HloProto.FromString(data)
    except (DecodeError, RuntimeError, ValueError):
        return None
    if wrapper.HasField("hlo_module") and wrapper.hlo_module.computations:
        return wrapper.hlo_module
    return None
