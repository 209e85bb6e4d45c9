"""The chunk dimension: which collectives are split into chunks together with
the dots next to them (`Plan.chunked_collectives`: (name, chunks) pairs,
`hlo.chunking`; empty: none).

Each is split once, into a count that divides its dimension, is neither
prefetched nor in an all-gather bucket of several, and no dot is split by two
of them. Realised by `hlo_passes.chunk_collectives`; priced by
`simulator.chunks`; chosen by `search.chunking`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from disco_xla.hlo.chunking import chunkable_collectives
from disco_xla.plan.dimension import Dimension, Verification

if TYPE_CHECKING:
    from disco_xla.plan.core import Plan


def check(plan: Plan, verification: Verification) -> None:
    if not plan.chunked_collectives:
        return
    fail = verification.fail
    splits = {split.collective.name: split for split in chunkable_collectives(verification.module)}
    names = [name for name, _ in plan.chunked_collectives]
    if len(set(names)) != len(names):
        raise fail("a collective is split into chunks twice")
    prefetched = set(plan.prefetched_all_gathers)
    bucket_of = {n: b for b in plan.all_gather_buckets for n in b}
    split_by: dict[str, str] = {}
    for name, chunks in plan.chunked_collectives:
        split = splits.get(name)
        if split is None:
            raise fail(
                f"{name!r} cannot be split into chunks: it must be an all-reduce of a dot "
                "read by nothing else (not a gradient's), or an all-gather read only by dots"
            )
        if not split.allows(chunks):
            raise fail(
                f"{name!r} cannot be split into {chunks} chunks: its dimension has "
                f"{split.size} elements"
            )
        if name in prefetched:
            raise fail(f"{name!r} is both prefetched and split into chunks")
        if len(bucket_of.get(name, (name,))) > 1:
            raise fail(f"{name!r} is split into chunks but shares an all-gather bucket")
        for dot in split.dots:
            if dot.name in split_by:
                raise fail(
                    f"{dot.name!r} would be split twice, by {split_by[dot.name]!r} and {name!r}"
                )
            split_by[dot.name] = name


def _read(data: dict) -> tuple[tuple[str, int], ...]:
    """The (name, chunks) pairs under 'chunked_collectives' ({name: chunks};
    () when absent)."""
    counts = data.get("chunked_collectives", {})
    if not isinstance(counts, dict) or not all(
        isinstance(chunks, int) and not isinstance(chunks, bool) for chunks in counts.values()
    ):
        raise ValueError("chunked_collectives is not a map of names to chunk counts")
    return tuple((str(name), chunks) for name, chunks in counts.items())


def describe(plan: Plan) -> str | None:
    chunked = plan.chunked_collectives
    if not chunked:
        return None
    counts = ", ".join(f"{name} in {chunks}" for name, chunks in chunked)
    return f"{len(chunked)} collectives split into chunks ({counts})"


CHUNKS = Dimension(
    name="chunks",
    field="chunked_collectives",
    meaning="which collectives are split into chunks with the dots next to them",
    read=_read,
    write=dict,
    check=check,
    describe=describe,
    after=("all-gather buckets",),
)
