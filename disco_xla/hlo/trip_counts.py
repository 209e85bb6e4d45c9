"""How many times each `while` loop runs, and so how often each computation runs
in one step (an analysis over the IR; it changes nothing).

A loop's trip count comes from, in order:
1. XLA's backend config, `{"known_trip_count": {"n": "N"}}`, which XLA writes on
   loops it has analysed (modules dumped after optimisation);
2. the induction variable, the way `jax.lax.scan` and `fori_loop` lower: the
   condition compares tuple element k of its parameter with a constant (`LT`,
   `LE`, `GT`, `GE`, either side), element k of the loop's initial tuple is a
   constant, and the body's root tuple sets element k to itself plus a constant;
3. otherwise it is unknown, and the loop counts as running once
   (`DEFAULT_TRIP_COUNT`): an under-estimate, said so by `inspect`.

A computation runs as often as its callers make it: a loop body once per trip,
its condition once more than that, a `call` or a `conditional` branch once per
run of its caller (every branch counts, as if each ran).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from disco_xla.hlo.graph import HloModule, Instruction

DEFAULT_TRIP_COUNT = 1


@dataclass(frozen=True)
class TripCount:
    count: int
    source: str  # 'backend config', 'induction variable' or 'unknown'


def trip_count(loop: Instruction) -> TripCount:
    """The trip count of a `while` instruction."""
    known = _from_backend_config(loop.proto.backend_config)
    if known is not None:
        return TripCount(known, "backend config")
    derived = _from_induction_variable(loop)
    if derived is not None:
        return TripCount(derived, "induction variable")
    return TripCount(DEFAULT_TRIP_COUNT, "unknown")


def loop_trip_counts(module: HloModule) -> dict[str, TripCount]:
    """Every `while` of the module, by name."""
    return {i.name: trip_count(i) for i in module.instructions() if i.opcode == "while"}


def executions(module: HloModule) -> dict[str, int]:
    """How many times each computation that runs as program code (entry, loop
    bodies and conditions, called computations, branches) runs in one step."""
    runs: dict[str, int] = {module.entry.name: 1}
    # Callers first: a computation's count is final once all its callers' are.
    for computation in reversed(module._callees_first()):
        count = runs.get(computation.name, 0)
        if not count:
            continue
        for instr in computation.instructions:
            if instr.opcode not in ("while", "call", "conditional"):
                continue
            for callee in instr.called_computations:
                runs[callee.name] = runs.get(callee.name, 0) + count * runs_per_call(instr, callee)
    return runs


def runs_per_call(instr: Instruction, callee) -> int:
    """How many times one run of the control instruction `instr` runs `callee`:
    a loop body once per trip, the condition once more, a called computation or
    a branch once."""
    if instr.opcode != "while":
        return 1
    trips = trip_count(instr).count
    return trips + 1 if _is_condition(instr, callee) else trips


def _is_condition(instr: Instruction, callee) -> bool:
    """A while's called computations are (body, condition), in XLA's order."""
    ids = instr.proto.called_computation_ids
    return instr.opcode == "while" and len(ids) == 2 and callee.id == ids[1]


def _from_backend_config(raw: bytes) -> int | None:
    if not raw:
        return None
    try:
        config = json.loads(raw.decode("utf-8", "replace"))
        return int(config["known_trip_count"]["n"])
    except (ValueError, KeyError, TypeError):
        return None


def _constant(instr: Instruction | None) -> int | None:
    """The value of a scalar integer constant (through converts and copies)."""
    while instr is not None and instr.opcode in ("convert", "copy") and instr.operands:
        instr = instr.operands[0]
    if instr is None or instr.opcode != "constant" or instr.shape.dims:
        return None
    literal = instr.proto.literal
    for values in (literal.s32s, literal.s64s, literal.u32s):
        if len(values) == 1:
            return int(values[0])
    return None


def element_of_parameter(instr: Instruction) -> int | None:
    """k when `instr` is get-tuple-element(parameter 0, k)."""
    if instr.opcode != "get-tuple-element" or not instr.operands:
        return None
    if instr.operands[0].opcode != "parameter":
        return None
    return instr.proto.tuple_index


_MIRRORED = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE"}


def induction_variable(loop: Instruction) -> tuple[int, int, int, str, int] | None:
    """(tuple element, start, step, comparison, bound) of a `while` loop's
    induction variable, the way `jax.lax.scan` and `fori_loop` lower it (the
    module's docstring, item 2), or None. The comparison reads `element <cmp> bound`."""
    ids = list(loop.proto.called_computation_ids)
    by_id = {c.id: c for c in loop.called_computations}
    if len(ids) != 2 or ids[0] not in by_id or ids[1] not in by_id:
        return None
    body, condition = by_id[ids[0]], by_id[ids[1]]  # XLA's order
    compare = condition.root
    if compare is None or compare.opcode != "compare" or len(compare.operands) != 2:
        return None
    direction = compare.proto.comparison_direction
    left, right = compare.operands
    index, bound = element_of_parameter(left), _constant(right)
    if index is None:
        index, bound = element_of_parameter(right), _constant(left)
        direction = _MIRRORED.get(direction, "")
    if index is None or bound is None or direction not in _MIRRORED:
        return None
    initial = loop.operands[0] if loop.operands else None
    if initial is None or initial.opcode != "tuple" or index >= len(initial.operands):
        return None
    start = _constant(initial.operands[index])
    step = _step(body, index)
    if start is None or not step:
        return None
    return index, start, step, direction, bound


def _from_induction_variable(loop: Instruction) -> int | None:
    found = induction_variable(loop)
    if found is None:
        return None
    _, start, step, direction, bound = found
    if direction in ("LT", "LE") and step > 0:
        span = bound - start + (1 if direction == "LE" else 0)
        return max(0, math.ceil(span / step))
    if direction in ("GT", "GE") and step < 0:
        span = start - bound + (1 if direction == "GE" else 0)
        return max(0, math.ceil(span / -step))
    return None


def _step(body, index: int) -> int | None:
    """The constant the body adds to tuple element `index` each iteration."""
    root = body.root
    if root is None or root.opcode != "tuple" or index >= len(root.operands):
        return None
    update = root.operands[index]
    if update.opcode not in ("add", "subtract") or len(update.operands) != 2:
        return None
    first, second = update.operands
    if element_of_parameter(first) == index and _constant(second) is not None:
        value = _constant(second)
        return value if update.opcode == "add" else -value
    if update.opcode == "add" and element_of_parameter(second) == index:
        return _constant(first)
    return None
