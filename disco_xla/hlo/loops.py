"""What a `while` loop's body computes from values that do not change between
trips (an analysis over the IR; it changes nothing).

An instruction of a loop body can be computed one trip early when everything it
reads comes from:
- tuple elements the body passes through unchanged (loop-invariant: root
  element j is element j of the body's parameter);
- the induction variable (`trip_counts.induction_variable`), whose next value
  is the body's own update of it;
- constants, iotas, partition and replica ids;
- pure instructions over those. An element read through a `tuple` or an
  `opt-barrier` of a tuple is read from the tuple's operand (a barrier is the
  identity on values; it only orders work).

That is what prefetching an FSDP all-gather needs: in a layer loop the
parameters of every layer are one invariant stacked array, and trip i gathers
the slice at i. Trip i can gather the slice at i + step for the next trip
(`hlo_passes.prefetch_all_gathers`).
"""

from __future__ import annotations

from dataclasses import dataclass

from disco_xla.hlo.graph import Computation, Instruction
from disco_xla.hlo.trip_counts import element_of_parameter, induction_variable, trip_count

# Instructions whose result is not a pure function of their operands, or that
# talk to other devices or the host: never computed early.
_NOT_PURE = frozenset(
    {
        "all-gather",
        "all-gather-start",
        "all-gather-done",
        "all-reduce",
        "all-reduce-start",
        "all-reduce-done",
        "reduce-scatter",
        "all-to-all",
        "collective-permute",
        "collective-permute-start",
        "collective-permute-done",
        "collective-broadcast",
        "send",
        "send-done",
        "recv",
        "recv-done",
        "infeed",
        "outfeed",
        "rng",
        "rng-get-and-update-state",
        "rng-bit-generator",
        "custom-call",
        "while",
        "conditional",
        "call",
        "fusion",
        "after-all",
        "add-dependency",
        "parameter",
        "domain",
    }
)
_LEAVES = frozenset({"constant", "iota", "partition-id", "replica-id"})


@dataclass(frozen=True)
class Loop:
    """A `while` loop whose trips are counted by an induction variable."""

    instruction: Instruction
    body: Computation
    condition: Computation
    induction_element: int
    trips: int

    @property
    def next_induction(self) -> Instruction:
        """The body's update of the induction variable: its value next trip."""
        return self.body.root.operands[self.induction_element]

    @property
    def invariant_elements(self) -> frozenset[int]:
        """The tuple elements the body passes through unchanged."""
        operands = self.body.root.operands
        return frozenset(k for k, value in enumerate(operands) if element_of_parameter(value) == k)


def loop_of_body(body: Computation) -> Loop | None:
    """The loop whose body `body` is, if `body` is the body of exactly one
    `while`, its root is a tuple, its parameter is read only by
    get-tuple-element, and the loop has an induction variable."""
    if len(body.callers) != 1 or body.callers[0].opcode != "while":
        return None
    loop = body.callers[0]
    ids = list(loop.proto.called_computation_ids)
    if len(ids) != 2 or ids[0] != body.id or body.root is None or body.root.opcode != "tuple":
        return None
    found = induction_variable(loop)
    if found is None:
        return None
    condition = next(c for c in loop.called_computations if c.id == ids[1])
    parameters = [i for i in body.instructions if i.opcode == "parameter"]
    if len(parameters) != 1 or any(u.opcode != "get-tuple-element" for u in parameters[0].users):
        return None
    return Loop(loop, body, condition, found[0], trip_count(loop).count)


def computed_from_invariants(loop: Loop, instr: Instruction) -> list[Instruction] | None:
    """The body instructions `instr` is computed from, itself included, in
    topological order and each seen through tuples and barriers (`source`),
    if `instr` can be computed one trip early (the module's docstring); else
    None. Leaves (invariant or induction elements, constants) are included."""
    invariant = loop.invariant_elements
    order: list[Instruction] = []
    seen: set[int] = set()

    def visit(node: Instruction) -> bool:
        node = source(node)
        if node.id in seen:
            return True
        element = element_of_parameter(node)
        if element is not None:
            ok = element == loop.induction_element or element in invariant
        elif node.opcode in _LEAVES:
            ok = True
        elif node.opcode in _NOT_PURE or node.opcode == "get-tuple-element":
            ok = False
        else:
            ok = all(visit(operand) for operand in node.operands)
        if ok:
            seen.add(node.id)
            order.append(node)
        return ok

    return order if visit(instr) else None


def source(instr: Instruction) -> Instruction:
    """What `instr` reads, seen through get-tuple-element of a tuple or of an
    opt-barrier of a tuple."""
    while instr.opcode == "get-tuple-element" and instr.operands:
        holder = instr.operands[0]
        if holder.opcode == "opt-barrier" and holder.operands:
            holder = holder.operands[0]
        if holder.opcode != "tuple":
            return instr
        instr = holder.operands[instr.proto.tuple_index]
    return instr


def prefetchable(instr: Instruction) -> bool:
    """Whether all-gather `instr` can be issued one trip ahead: it lies in the
    body of a loop with more than one trip (`loop_of_body`) and no loop of its
    own (the rewrite copies the body, and a copied inner loop would share its
    body with the original), and its operand is computed from invariants
    (`computed_from_invariants`)."""
    loop = loop_of_body(instr.computation)
    return (
        loop is not None
        and loop.trips > 1
        and not any(i.opcode == "while" for i in loop.body.instructions)
        and bool(instr.operands)
        and computed_from_invariants(loop, instr.operands[0]) is not None
    )
