"""Where XLA's own fusion of a module comes from, for the baselines and the
search's bounds: every report says which source it used.

- `compile`: XLA's compile of the module on this host, its kernels mapped back
  onto the module (`xla_fusion.xla_fusion_plan`);
- `dump`: the module XLA wrote after its optimizations on the machine that
  runs the job (`--xla_dump_to`, the `*after_optimizations*` file), mapped back
  the same way: on a GPU job, XLA:GPU's real kernels;
- `model`: XLA's fusion rules applied to the module (`fusion_model`), when
  there is no dump and the module does not compile here (custom calls this
  host has no handler for).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from disco_xla.errors import DiscoInputError
from disco_xla.hlo.graph import HloModule, Instruction
from disco_xla.hlo.opcodes import REDUCTION_OPCODES
from disco_xla.plan import Plan, compute_instructions, gradient_all_reduces_in_order, is_compute
from disco_xla.search.fusion_model import modelled_xla_fusion
from disco_xla.search.xla_fusion import xla_fusion_plan, xla_kernel_candidates

SOURCES = ("compile", "dump", "model")


@dataclass(frozen=True)
class XlaFusion:
    """XLA's fusion over the captured module, one all-reduce per gradient."""

    plan: Plan
    source: str  # one of SOURCES
    note: str  # a few words for reports: where the fusion comes from
    # From a dump: XLA's own gradient all-reduces (its combiner's buckets), in
    # the order its schedule issues them (`dumped_buckets`); else None.
    buckets: tuple[tuple[str, ...], ...] | None = None

    @property
    def groups(self) -> tuple[tuple[str, ...], ...]:
        return self.plan.fusion_groups


def compiled_fusion(module: HloModule, compiled: HloModule) -> XlaFusion:
    """XLA's fusion from its compile of `module` on this host (combiner off)."""
    return XlaFusion(xla_fusion_plan(module, compiled), "compile", "XLA's fusion (compiled here)")


def dumped_fusion(module: HloModule, dump: HloModule) -> XlaFusion:
    """XLA's fusion, and its all-reduces where they map back, from its
    after-optimizations dump of `module`."""
    buckets = dumped_buckets(module, dump)
    note = f"XLA's fusion (from its dump {dump.source}"
    if buckets is None:
        note += "; its all-reduces do not map back onto the module's gradients"
    return XlaFusion(xla_fusion_plan(module, dump), "dump", note + ")", buckets)


# What passes a tensor on unchanged between a kernel and a collective.
_PASS_THROUGH = frozenset({"bitcast", "copy", "get-tuple-element", "reshape"})


def dumped_buckets(module: HloModule, dump: HloModule) -> tuple[tuple[str, ...], ...] | None:
    """The gradient all-reduces of `module` as XLA's dump sends them: one bucket
    per all-reduce (or reduce-scatter) of the dump, in the dump's order (its
    schedule, in a scheduled module), each holding the gradients whose tensors
    it sends. A gradient maps to a tensor of the same size produced by a dump
    kernel that computes its operand (`xla_fusion.xla_kernel_candidates`).
    None when some gradient maps to no tensor."""
    kernels = xla_kernel_candidates(module, dump).kernels
    position = {id(i): n for n, i in enumerate(compute_instructions(dump))}
    sent = []  # per dump collective: [(producing kernel, elements, gradients sent), ...]
    for instr in _program_instructions(dump):
        if instr.opcode in REDUCTION_OPCODES:
            sent.append([(_producer(o, position), o.shape.elements, []) for o in instr.operands])
    left = gradient_all_reduces_in_order(module)
    wanted = {g.name: set(kernels.get(_producer_name(g), ())) for g in left}
    # By size and producing kernel; then by size alone (an operand XLA's kernels
    # do not account for); then beside a tensor of its size already taken (XLA
    # sends two gradients that compute the same value once).
    for kernels_of, shared in ((wanted.get, False), (lambda name: None, False)):
        left = [g for g in left if not _take(sent, g, kernels_of(g.name), shared)]
    left = [g for g in left if not _take(sent, g, wanted[g.name], True)]
    if any(not _take(sent, g, None, True) for g in left):
        return None
    buckets = [tuple(n for t in tensors for n in t[2]) for tensors in sent]
    return tuple(b for b in buckets if b)


def _take(sent: list, gradient: Instruction, kernels: set[int] | None, shared: bool) -> bool:
    """Give `gradient` the first tensor of its size not yet taken (with
    `shared`, one already taken), produced by one of `kernels` (None: by any);
    whether there was one."""
    for tensors in sent:
        for producer, elements, taken in tensors:
            if bool(taken) == shared and elements == gradient.shape.elements:
                if kernels is None or producer in kernels:
                    taken.append(gradient.name)
                    return True
    return False


def _program_instructions(module: HloModule):
    for computation in module.computations:
        if computation.role in ("entry", "program"):
            yield from computation.instructions


def _producer(instr: Instruction, position: dict[int, int]) -> int | None:
    """The dump kernel (its place among the compute instructions) that computes
    `instr`, seen through instructions that pass a tensor on."""
    while id(instr) not in position and instr.opcode in _PASS_THROUGH and instr.operands:
        instr = instr.operands[0]
    return position.get(id(instr))


def _producer_name(gradient: Instruction) -> str:
    """The name of the captured compute instruction whose value `gradient` sends."""
    instr = gradient.operands[0]
    while not is_compute(instr) and instr.opcode in _PASS_THROUGH and instr.operands:
        instr = instr.operands[0]
    return instr.name


def modelled_fusion(module: HloModule, why: str) -> XlaFusion:
    """XLA's fusion by the model, `why` there is neither a compile nor a dump."""
    note = f"XLA's fusion (modelled: {why})"
    return XlaFusion(modelled_xla_fusion(module), "model", note)


def xla_fusion_of(
    module: HloModule,
    compile_separately: Callable[[HloModule], HloModule] | None,
    dump: HloModule | None = None,
) -> XlaFusion:
    """XLA's fusion of `module` from the best source there is: a `dump`, else a
    compile here (`compile_separately`: XLA's compile with its all-reduce
    combiner off), else the model, saying why."""
    if dump is not None:
        return dumped_fusion(module, dump)
    if compile_separately is None:
        return modelled_fusion(module, "no compile asked for")
    compiled, why = compiled_or_why(module, compile_separately)
    return compiled_fusion(module, compiled) if compiled else modelled_fusion(module, why)


def compiled_or_why(
    module: HloModule, compile_separately: Callable[[HloModule], HloModule]
) -> tuple[HloModule | None, str]:
    """(XLA's compile of `module` here, ''), or (None, why it does not compile
    here). An input error (what the module is, not what this host lacks) is
    raised: it is the user's one line."""
    try:
        return compile_separately(module), ""
    except DiscoInputError:
        raise
    except Exception as error:  # noqa: BLE001 - XLA's errors: the module does not compile here
        return None, f"it does not compile here: {_first_line(error)}"


def _first_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text[:160] + ("..." if len(text) > 160 else "")
