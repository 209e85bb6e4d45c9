"""Which collectives a plan splits into chunks, and into how many
(`Plan.chunked_collectives`, realised by `hlo_passes.chunk_collectives`).

After the fusion, the buckets and the prefetches are chosen, the collectives
that can be split (`hlo.chunking`) take the chunk counts of `CHUNK_COUNTS`
that simulate fastest, or stay whole where no split is faster (`best_chunks`:
one count for all, then each in turn; deterministic). XLA's nearest
counterpart is its windowed einsum (`--xla_gpu_threshold_for_windowed_einsum_mib`),
priced as this dimension with a chunk a device (`windowed_einsum`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from disco_xla.hlo.chunking import CHUNK_COUNTS, ChunkSplit, chunkable_collectives
from disco_xla.hlo.graph import HloModule
from disco_xla.plan import Plan


def chunk_candidates(module: HloModule, plan: Plan) -> list[ChunkSplit]:
    """The collectives `plan` may still split: not prefetched, not in an
    all-gather bucket of several, and sharing no dot with one it splits."""
    prefetched = set(plan.prefetched_all_gathers)
    shared = {name for bucket in plan.all_gather_buckets if len(bucket) > 1 for name in bucket}
    chosen = {name for name, _ in plan.chunked_collectives}
    splits = chunkable_collectives(module)
    taken = {dot.name for split in splits if split.collective.name in chosen for dot in split.dots}
    return [
        split
        for split in splits
        if split.collective.name not in prefetched | shared | chosen
        and not taken.intersection(dot.name for dot in split.dots)
    ]


def best_chunks(
    module: HloModule, plan: Plan, price: Callable[[Plan], float], rounds: int = 2
) -> tuple[Plan, float]:
    """`plan` with the fastest chunks by `price` (simulated seconds) that this
    finds, and its seconds: first the best of every candidate in the same
    count (one pipeline, `hlo.chunking.chunked_computation`, needs one count
    along it) or none; then, `rounds` times, each candidate in program order
    takes the count (or none) that is fastest with the others kept. A plan
    changes only where that is faster, so ties keep fewer chunks."""
    splits = {split.collective.name: split for split in chunk_candidates(module, plan)}
    candidates = list(splits)
    if not candidates:
        return plan, price(plan)
    kept = plan.chunked_collectives

    def with_counts(counts: dict[str, int]) -> Plan:
        pairs = tuple((name, counts[name]) for name in candidates if counts.get(name))
        return replace(plan, chunked_collectives=(*kept, *pairs))

    best_counts: dict[str, int] = {}
    best, best_s = plan, price(plan)
    for chunks in CHUNK_COUNTS:
        counts = {name: chunks for name in candidates if splits[name].allows(chunks)}
        trial = with_counts(counts)
        seconds = price(trial) if counts else math.inf
        if seconds < best_s:
            best, best_s, best_counts = trial, seconds, counts
    for _ in range(rounds):
        improved = False
        for name in candidates:
            for chunks in (0, *CHUNK_COUNTS):
                if chunks == best_counts.get(name, 0) or (
                    chunks and not splits[name].allows(chunks)
                ):
                    continue
                counts = {**best_counts, name: chunks}
                trial = with_counts(counts)
                seconds = price(trial)
                if seconds < best_s:
                    best, best_s, best_counts, improved = trial, seconds, counts, True
        if not improved:
            break
    return best, best_s
