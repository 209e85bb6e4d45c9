"""The collective census: whether XLA's compile of a rewritten module sends
the plan's collectives, no more and no fewer (`check_collectives`).

XLA may still drop an all-reduce it proves redundant, and a planned chunk
compiles to chunk-sized collectives; both are allowed for. A failed census
raises RewriteError, and the caller runs the original program.
"""

from __future__ import annotations

from collections import Counter

from disco_xla.errors import RewriteError
from disco_xla.hlo.graph import HloModule
from disco_xla.plan import Plan, all_gathers
from disco_xla.runtime.xla_runner import NO_COMBINER, compile_module


def check_collectives(original: HloModule, plan: Plan, compiled: HloModule) -> None:
    """Raise RewriteError unless `compiled` sends the plan's buckets of both
    kinds (`check_all_reduces`, `check_all_gathers`)."""
    check_all_reduces(original, plan, compiled)
    check_all_gathers(original, plan, compiled)


def check_all_reduces(original: HloModule, plan: Plan, compiled: HloModule) -> None:
    """Raise RewriteError unless `compiled` (the rewritten module as XLA compiled
    it, combiner off) has exactly the plan's all-reduces: each bucket of several
    gradients as one all-reduce of their elements, and the others as XLA
    compiles the original (`_expected_all_reduce_elements`), or as the original
    has them less at most as many as XLA drops there. XLA drops an all-reduce
    whose operand computes what another's does (its CSE: on resnet50 the offset
    gradients of a block's last batch norm and of its shortcut's are one sum, so
    each block with a shortcut sends one all-reduce fewer); a bucket that takes
    one of such a pair leaves the other to be sent (`_only_duplicates_kept`)."""
    expected = _expected_all_reduce_elements(original, plan)
    got = _all_reduce_elements(compiled)
    if plan.prefetched_all_gathers:
        several = {
            sum(original.instruction(name).shape.elements for name in bucket)
            for bucket in plan.all_reduce_buckets
            if len(bucket) > 1
        }
        _check_sizes_only("all-reduces", got, expected, several)
        return
    if got != expected and not _only_duplicates_kept(original, plan, got):
        raise RewriteError(
            f"the compiled module has all-reduces of {got} elements, the plan asks for {expected}"
        )


def check_all_gathers(original: HloModule, plan: Plan, compiled: HloModule) -> None:
    """Raise RewriteError if `compiled` (the rewritten module as XLA compiled it)
    has more all-gathers than the plan's buckets and the all-gathers a plan does
    not bucket (`plan.all_gathers`): a bucket that XLA split again. (Fewer is
    XLA's own doing: it may drop an all-gather whose result is unused.) Where
    the plan prefetches, the count is not fixed (`_check_sizes_only`)."""
    if plan.prefetched_all_gathers:
        expected = _all_gather_elements_planned(original, plan)
        got = _elements(compiled, ("all-gather", "all-gather-start"))
        _check_sizes_only("all-gathers", got, expected, set())
        return
    if not plan.all_gather_buckets:
        return
    unbucketed = sum(1 for i in original.instructions() if i.opcode == "all-gather") - len(
        all_gathers(original)
    )
    expected = len(plan.all_gather_buckets) + unbucketed
    expected += sum(chunks - 1 for _, chunks in _chunk_sizes(original, plan, "all-gather"))
    got = sum(1 for i in compiled.instructions() if i.opcode in ("all-gather", "all-gather-start"))
    if got > expected:
        raise RewriteError(
            f"the compiled module has {got} all-gathers, the plan's buckets make {expected}"
        )


def _check_sizes_only(what: str, got: list[int], expected: list[int], required: set[int]) -> None:
    """The census of a plan that prefetches: its loops run one trip fewer, and
    their last trip runs after them as a copy of the body, with the body's
    collectives (`prefetch_all_gathers`), and XLA may unroll a loop left with
    one trip. How many collectives of each size the compiled module holds then
    depends on XLA, but no size may be new (XLA split or merged a bucket), and
    each of the `required` sizes (buckets of several) must be there. Raises
    RewriteError otherwise."""
    new = sorted(set(got) - set(expected))
    missing = sorted(required - set(got))
    if new or missing:
        raise RewriteError(
            f"the compiled module's {what} have sizes {new} the plan does not make"
            if new
            else f"the compiled module has no {what} of sizes {missing}, the plan's buckets"
        )


def _elements(module: HloModule, opcodes: tuple[str, ...]) -> list[int]:
    """The element counts of the results of a module's instructions of `opcodes`
    (of an asynchronous start: its largest tuple element, the gathered result)."""
    return [
        max(leaf.elements for leaf in instr.shape.leaves())
        for instr in module.instructions()
        if instr.opcode in opcodes
    ]


def _all_gather_elements_planned(original: HloModule, plan: Plan) -> list[int]:
    """The result sizes of the all-gathers a plan makes: each bucket's (each
    all-gather's where it has none), and those of the all-gathers it does not
    bucket."""
    by_name = {instr.name: instr for instr in all_gathers(original)}
    buckets = plan.all_gather_buckets or tuple((name,) for name in by_name)
    chunked = dict(plan.chunked_collectives)
    sizes = [
        sum(by_name[name].shape.elements for name in bucket) // chunked.get(bucket[0], 1)
        for bucket in buckets
    ]
    sizes += [
        instr.shape.elements
        for instr in original.instructions()
        if instr.opcode == "all-gather" and instr.name not in by_name
    ]
    return sizes


def _only_duplicates_kept(original: HloModule, plan: Plan, got: list[int]) -> bool:
    """Whether the compiled all-reduces `got` are the plan's buckets of several
    gradients, each once, and otherwise the original's other all-reduces less
    at most as many as XLA drops from the original (duplicates it merges: where
    a bucket took one of a pair, the other stays, and the exact count of
    `_expected_all_reduce_elements` is one too low)."""
    several = [bucket for bucket in plan.all_reduce_buckets if len(bucket) > 1]
    bucketed = {name for bucket in several for name in bucket}
    buckets = Counter(
        sum(original.instruction(name).shape.elements for name in bucket) for bucket in several
    )
    others = Counter(
        sum(leaf.elements for leaf in original.instruction(a.name).shape.leaves())
        for a in original.all_reduces
        if a.name not in bucketed
    )
    dropped = len(original.all_reduces) - len(compile_module(original, NO_COMBINER).all_reduces)
    found = Counter(got)
    rest = found - buckets
    return (
        not buckets - found
        and not rest - others
        and others.total() - rest.total() <= max(dropped, 0)
    )


def _all_reduce_elements(module: HloModule) -> list[int]:
    """The element counts of a module's all-reduces (elements, not bytes: XLA:CPU
    reduces bf16 in f32)."""
    return sorted(
        sum(leaf.elements for leaf in module.instruction(a.name).shape.leaves())
        for a in module.all_reduces
    )


def _expected_all_reduce_elements(module: HloModule, plan: Plan) -> list[int]:
    """The all-reduce sizes the rewritten module must compile to: those of the
    original as XLA compiles it with the combiner off (XLA may already drop or
    merge duplicates there), with each bucket of several gradients in place of
    its members."""
    sizes = Counter(_all_reduce_elements(compile_module(module, NO_COMBINER)))
    for bucket in plan.all_reduce_buckets:
        if len(bucket) < 2:
            continue
        members = [module.instruction(name).shape.elements for name in bucket]
        for size in members:
            if sizes[size] > 0:
                sizes[size] -= 1
        sizes[sum(members)] += 1
    for size, chunks in _chunk_sizes(module, plan, "all-reduce"):
        if sizes[size] > 0:
            sizes[size] -= 1
        sizes[size // chunks] += chunks
    return sorted(sizes.elements())


def _chunk_sizes(module: HloModule, plan: Plan, opcode: str) -> list[tuple[int, int]]:
    """(elements, chunks) of each of the plan's chunked collectives of `opcode`."""
    found = []
    for name, chunks in plan.chunked_collectives:
        instr = module.instruction(name)
        if instr.opcode == opcode:
            found.append((instr.shape.elements, chunks))
    return found
