"""The strategy type, plus the one verifier of legality. A plan has five
dimensions (`search.ablation.DIMENSIONS`): which instructions are fused into
one kernel; how the gradient all-reduces (and reduce-scatters) are grouped into
buckets; how the all-gathers are grouped; which all-gathers are issued a loop
trip ahead; and which collectives are split into chunks with the dots next to
them.

A plan speaks of IR names only, so it is plain data: it serialises to JSON, and
can be cached, shown, diffed and applied to the module it was made for (checked
by the module's fingerprint).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import NamedTuple

from disco_xla.errors import DiscoInputError
from disco_xla.hlo.chunking import chunkable_collectives
from disco_xla.hlo.collectives import collective_scope, device_groups, gathered_devices
from disco_xla.hlo.custom_calls import is_library_call
from disco_xla.hlo.graph import (
    COLLECTIVE_DONE_OPCODES,
    COLLECTIVE_OPCODES,
    HloModule,
    Instruction,
)
from disco_xla.hlo.loops import prefetchable

PLAN_FORMAT = "disco-xla-plan/1"

# Instructions that are never part of a fused kernel: inputs, plumbing, control
# flow, markers and collectives. Everything else in program code is a compute
# instruction and belongs to exactly one fusion group.
NOT_FUSIBLE_OPCODES = frozenset(
    {
        "parameter",
        "constant",
        "bitcast",  # a view: no kernel of its own
        "tuple",
        "get-tuple-element",
        "after-all",
        "call",
        "while",
        "conditional",
        "custom-call",
        "partition-id",
        "replica-id",
        "opt-barrier",
        "infeed",
        "outfeed",
        "send",
        "send-done",
        "recv",
        "recv-done",
    }
    | COLLECTIVE_OPCODES
    | COLLECTIVE_DONE_OPCODES
)
# Ops that become a library call or a large loop nest; one per kernel by default.
EXPENSIVE_OPCODES = frozenset({"dot", "convolution"})


def is_compute(instr: Instruction) -> bool:
    """Whether a plan places `instr` in a fusion group: a compute instruction, or
    a library call (a custom call that computes, alone in its group)."""
    return instr.opcode not in NOT_FUSIBLE_OPCODES or is_library_call(instr)


def fusion_weight(instr: Instruction) -> int:
    """How much of a kernel's one library op `instr` takes, where a kernel of
    several instructions holds at most 1: a dot or convolution 1, a library
    call 2 (it is a kernel by itself, and nothing joins it), anything else 0."""
    if instr.opcode in EXPENSIVE_OPCODES:
        return 1
    return 2 if instr.opcode == "custom-call" and is_library_call(instr) else 0


@dataclass(frozen=True)
class Plan:
    """Op-fusion groups (a partition of the compute instructions), all-reduce
    buckets (an ordered partition of the gradient all-reduces, and of gradient
    reduce-scatters where a step sends its gradients sharded), and all-gather
    buckets (an ordered partition of the module's all-gathers, `all_gathers`;
    empty: each all-gather as the module has it), the all-gathers issued one
    loop trip ahead of their use (`prefetched_all_gathers`; empty: none), and
    the collectives split into chunks with the dots next to them
    (`chunked_collectives`: (name, chunks) pairs, `hlo.chunking`; empty: none),
    by name."""

    module_name: str
    fingerprint: str
    fusion_groups: tuple[tuple[str, ...], ...]
    all_reduce_buckets: tuple[tuple[str, ...], ...]
    all_gather_buckets: tuple[tuple[str, ...], ...] = ()
    prefetched_all_gathers: tuple[str, ...] = ()
    chunked_collectives: tuple[tuple[str, int], ...] = ()

    def to_json(self) -> str:
        data = {
            "format": PLAN_FORMAT,
            "module": self.module_name,
            "fingerprint": self.fingerprint,
            "fusion_groups": [list(g) for g in self.fusion_groups],
            "all_reduce_buckets": [list(b) for b in self.all_reduce_buckets],
        }
        if self.all_gather_buckets:  # a plan without them reads as before
            data["all_gather_buckets"] = [list(b) for b in self.all_gather_buckets]
        if self.prefetched_all_gathers:
            data["prefetched_all_gathers"] = list(self.prefetched_all_gathers)
        if self.chunked_collectives:
            data["chunked_collectives"] = dict(self.chunked_collectives)
        return json.dumps(data, indent=1)

    @classmethod
    def from_json(cls, text: str, source: str = "<plan>") -> Plan:
        try:
            data = json.loads(text)
            if data.get("format") != PLAN_FORMAT:
                raise ValueError(f"not a {PLAN_FORMAT} plan")
            return cls(
                module_name=str(data["module"]),
                fingerprint=str(data["fingerprint"]),
                fusion_groups=tuple(tuple(map(str, g)) for g in data["fusion_groups"]),
                all_reduce_buckets=tuple(tuple(map(str, b)) for b in data["all_reduce_buckets"]),
                all_gather_buckets=tuple(
                    tuple(map(str, b)) for b in data.get("all_gather_buckets", ())
                ),
                prefetched_all_gathers=tuple(map(str, _names(data, "prefetched_all_gathers"))),
                chunked_collectives=_chunk_counts(data),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise DiscoInputError(source, f"not a disco-xla plan ({error})") from None

    @classmethod
    def unfused(cls, module: HloModule) -> Plan:
        """No op fusion, one all-reduce per gradient: the `none` baseline."""
        return cls(
            module_name=module.name,
            fingerprint=module.fingerprint,
            fusion_groups=tuple((i.name,) for i in compute_instructions(module)),
            all_reduce_buckets=tuple((a.name,) for a in gradient_all_reduces_in_order(module)),
        )


def _names(data: dict, key: str) -> list:
    """The list of names a plan's JSON holds under `key` ([] when absent)."""
    names = data.get(key, [])
    if not isinstance(names, list):
        raise ValueError(f"{key} is not a list of names")
    return names


def _chunk_counts(data: dict) -> tuple[tuple[str, int], ...]:
    """The (name, chunks) pairs a plan's JSON holds ({name: chunks}; () when absent)."""
    counts = data.get("chunked_collectives", {})
    if not isinstance(counts, dict) or not all(
        isinstance(chunks, int) and not isinstance(chunks, bool) for chunks in counts.values()
    ):
        raise ValueError("chunked_collectives is not a map of names to chunk counts")
    return tuple((str(name), chunks) for name, chunks in counts.items())


def compute_instructions(module: HloModule) -> list[Instruction]:
    """The instructions a plan must place in fusion groups, in topological order."""
    return [
        instr
        for computation in module.computations
        if computation.role in ("entry", "program")
        for instr in computation.topological_order
        if is_compute(instr)
    ]


def gradient_all_reduces_in_order(module: HloModule) -> list[Instruction]:
    """Gradient all-reduce instructions in topological order."""
    names = {a.name for a in module.gradient_all_reduces}
    return [
        instr
        for computation in module.computations
        for instr in computation.topological_order
        if instr.name in names
    ]


def verify_plan(
    plan: Plan, module: HloModule, max_expensive_ops_per_kernel: int = 1, source: str = "<plan>"
) -> None:
    """Raise DiscoInputError with the reason if `plan` is not legal for `module`.

    Checks, in order: the fingerprint; the groups partition the compute
    instructions, each inside one computation, with at most
    `max_expensive_ops_per_kernel` dots or convolutions; contracting every group
    to one node leaves the program acyclic (so every group is convex and fusing
    creates no cycle); the buckets partition the gradient all-reduces; members of
    a bucket share dtype, reduction and device groups, and do not depend on each
    other; and no bucket depends on a later one. All-gather buckets, where the
    plan has them, by the same rules over the module's all-gathers. Prefetched
    all-gathers (`prefetchable` ones), each of a bucket's members or none.
    Chunked collectives (`hlo.chunking`), each once, in a count that divides
    its dimension, neither prefetched nor in a bucket of several, and no dot
    split by two of them.
    """
    if plan.fingerprint != module.fingerprint:
        raise DiscoInputError(
            source,
            f"the plan is for another module ({plan.module_name}, fingerprint "
            f"{plan.fingerprint[:12]}), not {module.name} ({module.fingerprint[:12]})",
        )
    by_name = _instructions_by_name(module, source)
    group_of = _check_groups(plan, module, by_name, max_expensive_ops_per_kernel, source)
    _check_contracted_graph_acyclic(module, group_of, plan, source)
    _check_buckets(plan, module, by_name, source)
    if plan.all_gather_buckets:
        _check_all_gather_buckets(plan, module, source)
    if plan.prefetched_all_gathers:
        _check_prefetched(plan, module, source)
    if plan.chunked_collectives:
        _check_chunked(plan, module, source)


def _instructions_by_name(module: HloModule, source: str) -> dict[str, Instruction]:
    by_name: dict[str, Instruction] = {}
    for instr in module.instructions():
        if instr.name in by_name:
            raise DiscoInputError(source, f"the module has two instructions named {instr.name!r}")
        by_name[instr.name] = instr
    return by_name


def _check_groups(plan, module, by_name, max_expensive, source) -> dict[int, int]:
    compute = compute_instructions(module)
    expected = {id(i) for i in compute}
    group_of: dict[int, int] = {}
    for index, group in enumerate(plan.fusion_groups):
        if not group:
            raise DiscoInputError(source, f"fusion group {index} is empty")
        members = []
        for name in group:
            instr = by_name.get(name)
            if instr is None:
                raise DiscoInputError(source, f"fusion group {index}: no instruction {name!r}")
            if id(instr) not in expected:
                raise DiscoInputError(
                    source, f"fusion group {index}: {name!r} ({instr.opcode}) cannot be fused"
                )
            if id(instr) in group_of:
                raise DiscoInputError(
                    source, f"{name!r} is in fusion groups {group_of[id(instr)]} and {index}"
                )
            group_of[id(instr)] = index
            members.append(instr)
        if len({id(m.computation) for m in members}) > 1:
            raise DiscoInputError(source, f"fusion group {index} spans several computations")
        library_calls = [m.name for m in members if fusion_weight(m) > 1]
        if library_calls and len(members) > 1:
            raise DiscoInputError(
                source,
                f"fusion group {index} joins the library call {library_calls[0]!r} with other "
                "instructions; a library call is a kernel by itself",
            )
        expensive = sum(m.opcode in EXPENSIVE_OPCODES for m in members)
        if expensive > max_expensive:
            raise DiscoInputError(
                source,
                f"fusion group {index} has {expensive} dots/convolutions; at most "
                f"{max_expensive} per kernel",
            )
    missing = [i.name for i in compute if id(i) not in group_of]
    if missing:
        raise DiscoInputError(
            source,
            f"{len(missing)} compute instructions are in no fusion group, e.g. {missing[0]!r}",
        )
    return group_of


def _check_contracted_graph_acyclic(module, group_of, plan, source) -> None:
    """Kahn's algorithm on the graph where each group is one node."""
    for computation in module.computations:
        if computation.role not in ("entry", "program"):
            continue
        node_of = {
            id(i): ("group", group_of[id(i)]) if id(i) in group_of else ("single", id(i))
            for i in computation.instructions
        }
        successors: dict[tuple, set] = defaultdict(set)
        indegree: dict[tuple, int] = dict.fromkeys(node_of.values(), 0)
        for instr in computation.instructions:
            for dep in instr.operands + instr.control_predecessors:
                a, b = node_of[id(dep)], node_of[id(instr)]
                if a != b and b not in successors[a]:
                    successors[a].add(b)
                    indegree[b] += 1
        ready = [node for node, degree in indegree.items() if degree == 0]
        seen = 0
        while ready:
            node = ready.pop()
            seen += 1
            for successor in successors[node]:
                indegree[successor] -= 1
                if indegree[successor] == 0:
                    ready.append(successor)
        if seen != len(indegree):
            stuck = sorted(n[1] for n, d in indegree.items() if d > 0 and n[0] == "group")
            where = (
                f"fusion group {stuck[0]} ({', '.join(plan.fusion_groups[stuck[0]][:3])})"
                if stuck
                else f"computation {computation.name!r}"
            )
            raise DiscoInputError(source, f"{where} is not convex: fusing it would create a cycle")


def bucket_kinds(module: HloModule) -> dict[str, tuple]:
    """What gradient all-reduces must share to go in one bucket, by name: kind
    (all-reduce or reduce-scatter), dtype, reduction, device groups, channel
    scope and computation. Reduce-scatters over different dimensions may share
    one: the bucket pass moves each one's scattered dimension to the front."""
    by_name = {i.name: i for i in module.instructions()}
    return {
        a.name: (
            a.kind,
            by_name[a.name].shape.leaves()[0].element_type,
            a.reduction,
            a.group_size,
            a.groups,
            a.scope,
            by_name[a.name].computation.name,
        )
        for a in module.gradient_all_reduces
    }


class _BucketWords(NamedTuple):
    """How `_check_partition`'s errors name one kind of bucket."""

    bucket: str  # 'bucket'
    member: str  # 'a gradient all-reduce'
    members: str  # 'all-reduces' (in a bucket that mixes them)
    shared: str  # what members must share
    unplaced: str  # '{count} gradient all-reduces are in no bucket'
    empty: str  # 'all-reduce bucket' (one that holds none)


_ALL_REDUCE_WORDS = _BucketWords(
    "bucket",
    "a gradient all-reduce",
    "all-reduces",
    "dtype, reduction, device groups or computation",
    "{count} gradient all-reduces are in no bucket",
    "all-reduce bucket",
)
_ALL_GATHER_WORDS = _BucketWords(
    "all-gather bucket",
    "an all-gather of one array over one dimension",
    "all-gathers",
    "dtype, device groups or computation",
    "{count} all-gathers are in no all-gather bucket",
    "all-gather bucket",
)


def _check_partition(buckets, kind: dict[str, tuple], words: _BucketWords, source) -> dict:
    """Raise DiscoInputError unless `buckets` partition the names of `kind`,
    each bucket of one kind; returns each name's bucket."""
    bucket_of: dict[str, int] = {}
    for index, bucket in enumerate(buckets):
        if not bucket:
            raise DiscoInputError(source, f"{words.empty} {index} is empty")
        for name in bucket:
            if name not in kind:
                raise DiscoInputError(
                    source, f"{words.bucket} {index}: {name!r} is not {words.member}"
                )
            if name in bucket_of:
                raise DiscoInputError(
                    source, f"{name!r} is in {words.bucket}s {bucket_of[name]} and {index}"
                )
            bucket_of[name] = index
        if len({kind[n] for n in bucket}) > 1:
            raise DiscoInputError(
                source,
                f"{words.bucket} {index} mixes {words.members} of different {words.shared}",
            )
    missing = sorted(set(kind) - set(bucket_of))
    if missing:
        unplaced = words.unplaced.format(count=len(missing))
        raise DiscoInputError(source, f"{unplaced}, e.g. {missing[0]!r}")
    return bucket_of


def _check_buckets(plan, module, by_name, source) -> None:
    bucket_of = _check_partition(
        plan.all_reduce_buckets, bucket_kinds(module), _ALL_REDUCE_WORDS, source
    )
    # Each gradient after the gradients whose all-reduced values it is computed from.
    for name, earlier in gradient_dependencies(module).items():
        own = bucket_of[name]
        later = [bucket_of[e] for e in earlier if bucket_of[e] >= own]
        if own in later:
            raise DiscoInputError(
                source, f"bucket {own} depends on its own result (through {name!r})"
            )
        if later:
            raise DiscoInputError(
                source, f"bucket {own} depends on bucket {min(later)}, which comes after it"
            )


def gradient_dependencies(module: HloModule) -> dict[str, frozenset[str]]:
    """For each gradient all-reduce that reads, through its operands, the result
    of other gradient all-reduces: their names (instruction-level dependencies, the
    ones `verify_plan` checks). Most steps have none: then the dict is empty."""
    return _dependencies_among(module, [a.name for a in module.gradient_all_reduces])


def _dependencies_among(module: HloModule, names: list[str]) -> dict[str, frozenset[str]]:
    """For each of the instructions `names` that reads, through its operands and
    control predecessors, the result of others of them: their names."""
    gradients = names
    bit = {name: 1 << number for number, name in enumerate(gradients)}
    found: dict[str, frozenset[str]] = {}
    depends: dict[int, int] = {}
    for computation in module.computations:
        for instr in computation.topological_order:
            mask = 0
            for dep in instr.operands + instr.control_predecessors:
                mask |= depends.get(id(dep), 0)
            own = bit.get(instr.name)
            if own is not None:
                if mask:
                    found[instr.name] = frozenset(name for name in gradients if mask & bit[name])
                mask |= own
            depends[id(instr)] = mask
    return found


def all_gathers(module: HloModule) -> list[Instruction]:
    """The all-gathers a plan may bucket, in topological order: those of one
    array over one dimension (`gathered_devices`), in program code."""
    return [
        instr
        for computation in module.computations
        if computation.role in ("entry", "program")
        for instr in computation.topological_order
        if instr.opcode == "all-gather" and gathered_devices(instr)
    ]


def all_gather_kinds(module: HloModule) -> dict[str, tuple]:
    """What all-gathers must share to go in one bucket, by name: dtype, devices
    gathered from, device groups, channel scope and computation."""
    return {
        instr.name: (
            instr.proto.shape.element_type,
            gathered_devices(instr),
            device_groups(instr.proto),
            collective_scope(instr.proto),
            instr.computation.name,
        )
        for instr in all_gathers(module)
    }


def all_gather_dependencies(module: HloModule) -> dict[str, frozenset[str]]:
    """For each all-gather that reads, through its operands, the result of other
    all-gathers (`all_gathers`): their names."""
    return _dependencies_among(module, [instr.name for instr in all_gathers(module)])


def _check_all_gather_buckets(plan: Plan, module: HloModule, source: str) -> None:
    _check_partition(plan.all_gather_buckets, all_gather_kinds(module), _ALL_GATHER_WORDS, source)
    if not buckets_follow_dependencies(plan.all_gather_buckets, all_gather_dependencies(module)):
        raise DiscoInputError(
            source, "an all-gather bucket depends on itself or on a bucket after it"
        )


def prefetchable_all_gathers(module: HloModule) -> list[str]:
    """The all-gathers (`all_gathers`) a plan may issue one loop trip ahead
    (`loops.prefetchable`), in topological order."""
    return [instr.name for instr in all_gathers(module) if prefetchable(instr)]


def _check_prefetched(plan: Plan, module: HloModule, source: str) -> None:
    allowed = set(prefetchable_all_gathers(module))
    chosen = set(plan.prefetched_all_gathers)
    for name in plan.prefetched_all_gathers:
        if name not in allowed:
            raise DiscoInputError(
                source,
                f"{name!r} is not an all-gather a loop trip can issue ahead: it must be in a "
                "counted loop's body, of values the loop does not change",
            )
    if len(chosen) != len(plan.prefetched_all_gathers):
        raise DiscoInputError(source, "an all-gather is prefetched twice")
    for index, bucket in enumerate(plan.all_gather_buckets):
        if 0 < len(chosen.intersection(bucket)) < len(bucket):
            raise DiscoInputError(
                source, f"all-gather bucket {index} is prefetched in part: all its members or none"
            )


def _check_chunked(plan: Plan, module: HloModule, source: str) -> None:
    splits = {split.collective.name: split for split in chunkable_collectives(module)}
    names = [name for name, _ in plan.chunked_collectives]
    if len(set(names)) != len(names):
        raise DiscoInputError(source, "a collective is split into chunks twice")
    prefetched = set(plan.prefetched_all_gathers)
    bucket_of = {n: b for b in plan.all_gather_buckets for n in b}
    split_by: dict[str, str] = {}
    for name, chunks in plan.chunked_collectives:
        split = splits.get(name)
        if split is None:
            raise DiscoInputError(
                source,
                f"{name!r} cannot be split into chunks: it must be an all-reduce of a dot "
                "read by nothing else (not a gradient's), or an all-gather read only by dots",
            )
        if not split.allows(chunks):
            raise DiscoInputError(
                source,
                f"{name!r} cannot be split into {chunks} chunks: its dimension has "
                f"{split.size} elements",
            )
        if name in prefetched:
            raise DiscoInputError(source, f"{name!r} is both prefetched and split into chunks")
        if len(bucket_of.get(name, (name,))) > 1:
            raise DiscoInputError(
                source, f"{name!r} is split into chunks but shares an all-gather bucket"
            )
        for dot in split.dots:
            if dot.name in split_by:
                raise DiscoInputError(
                    source,
                    f"{dot.name!r} would be split twice, by {split_by[dot.name]!r} and {name!r}",
                )
            split_by[dot.name] = name


def buckets_follow_dependencies(
    buckets: tuple[tuple[str, ...], ...], dependencies: dict[str, frozenset[str]]
) -> bool:
    """Whether every gradient's bucket comes after the buckets of the gradients it
    depends on (`gradient_dependencies`): the rule `verify_plan` enforces."""
    if not dependencies:
        return True
    bucket_of = {name: number for number, bucket in enumerate(buckets) for name in bucket}
    return all(
        bucket_of[before] < bucket_of[name]
        for name, earlier in dependencies.items()
        for before in earlier
    )


def needs_boundary(
    members: Sequence[Instruction], left_to_xla: AbstractSet[frozenset[str]]
) -> bool:
    """Whether a fusion group of `members` gets a kernel boundary when the plan
    is realised (`hlo_passes.fusion_boundaries`): XLA does not form it by itself
    (it is not in `left_to_xla`, XLA's own groups as sets of names), and it holds
    no library op (convolution, dot, library call), which stays in the caller."""
    return frozenset(m.name for m in members) not in left_to_xla and not any(
        fusion_weight(m) for m in members
    )


def departing_groups(
    module: HloModule, plan: Plan, left_to_xla: Iterable[tuple[str, ...]] | None
) -> list[tuple[str, ...]]:
    """The plan's groups that get a kernel boundary (`needs_boundary`); with
    `left_to_xla` None, every group without a library op."""
    by_name = {i.name: i for i in module.instructions()}
    own = {frozenset(g) for g in left_to_xla} if left_to_xla is not None else set()
    return [g for g in plan.fusion_groups if needs_boundary([by_name[n] for n in g], own)]
