"""What the two bucket dimensions share: a bucket partition's check, and the
dependencies among collectives that order the buckets."""

from __future__ import annotations

from typing import NamedTuple

from disco_xla.hlo.graph import HloModule
from disco_xla.plan.dimension import Verification


class BucketWords(NamedTuple):
    """How `check_partition`'s errors name one kind of bucket."""

    bucket: str  # 'bucket'
    member: str  # 'a gradient all-reduce'
    members: str  # 'all-reduces' (in a bucket that mixes them)
    shared: str  # what members must share
    unplaced: str  # '{count} gradient all-reduces are in no bucket'
    empty: str  # 'all-reduce bucket' (one that holds none)


def check_partition(
    buckets, kind: dict[str, tuple], words: BucketWords, verification: Verification
) -> dict[str, int]:
    """Raise unless `buckets` partition the names of `kind`, each bucket of one
    kind; returns each name's bucket."""
    fail = verification.fail
    bucket_of: dict[str, int] = {}
    for index, bucket in enumerate(buckets):
        if not bucket:
            raise fail(f"{words.empty} {index} is empty")
        for name in bucket:
            if name not in kind:
                raise fail(f"{words.bucket} {index}: {name!r} is not {words.member}")
            if name in bucket_of:
                raise fail(f"{name!r} is in {words.bucket}s {bucket_of[name]} and {index}")
            bucket_of[name] = index
        if len({kind[n] for n in bucket}) > 1:
            raise fail(f"{words.bucket} {index} mixes {words.members} of different {words.shared}")
    missing = sorted(set(kind) - set(bucket_of))
    if missing:
        unplaced = words.unplaced.format(count=len(missing))
        raise fail(f"{unplaced}, e.g. {missing[0]!r}")
    return bucket_of


def dependencies_among(module: HloModule, names: list[str]) -> dict[str, frozenset[str]]:
    """For each of the instructions `names` that reads, through its operands and
    control predecessors, the result of others of them: their names."""
    bit = {name: 1 << number for number, name in enumerate(names)}
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
                    found[instr.name] = frozenset(name for name in names if mask & bit[name])
                mask |= own
            depends[id(instr)] = mask
    return found


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
