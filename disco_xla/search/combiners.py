"""How the baselines pack gradients into buckets: the combiners' and the other
systems' rules, as pure functions of the gradients in ready order (`baselines`
applies them to a module).

- `threshold_buckets`: consecutive gradients up to a size (XLA:GPU's
  combiners, PyTorch DDP's buckets); `kind_threshold_buckets`: one combiner a
  kind, each with its threshold; `tuned_buckets`: the thresholds an expert's
  sweep finds fastest (`threshold_sweep`, then a quarter of an octave apart,
  `expert_flags.refined_thresholds`).
- `unit_buckets`: PyTorch FSDP's size-based units; `cycle_buckets`: Horovod's
  fusion cycles; `mgwfbp_buckets`: MG-WFBP's merge rule; `xla_cpu_buckets`:
  XLA:CPU's one combined all-reduce.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from disco_xla.search.expert_flags import refined_thresholds

MB = 1 << 20
XLA_GPU_COMBINE_BYTES = 30 * MB  # xla_gpu_all_reduce_combine_threshold_bytes
# (name, bytes) of each gradient all-reduce, in the order the gradients become ready.
Gradients = list[tuple[str, int]]


def threshold_buckets(gradients: Gradients, limit_bytes: int, first_bytes: int | None = None):
    """Consecutive gradients packed into buckets of at most `limit_bytes` (the
    first at most `first_bytes`); a larger gradient gets a bucket of its own."""
    buckets: list[list[str]] = []
    filled = math.inf
    for name, size in gradients:
        # While the first bucket is open it has its own limit.
        limit = first_bytes if (first_bytes is not None and len(buckets) == 1) else limit_bytes
        if buckets and filled + size <= limit:
            buckets[-1].append(name)
            filled += size
        else:
            buckets.append([name])
            filled = size
    return tuple(tuple(b) for b in buckets)


def threshold_sweep(total_bytes: int) -> list[int]:
    """The thresholds NVIDIA's guide sweeps: powers of two from 16 MB up to the
    first at least `total_bytes`, and XLA's default."""
    sweep = {XLA_GPU_COMBINE_BYTES}
    threshold = 16 * MB
    while True:
        sweep.add(threshold)
        if threshold >= total_bytes:
            return sorted(sweep)
        threshold *= 2


def kind_threshold_buckets(
    gradients: Gradients, kinds: dict[str, str], thresholds: dict[str, int]
) -> tuple[tuple[str, ...], ...]:
    """XLA:GPU's combiners, one for each kind with its own threshold: a kind's
    gradients packed in ready order up to its threshold (XLA's default where
    `thresholds` has none), the buckets in the order their last one is ready."""
    position = {name: index for index, (name, _) in enumerate(gradients)}
    buckets: list[tuple[str, ...]] = []
    for kind in sorted({kinds.get(name, "all-reduce") for name, _ in gradients}):
        own = [(name, size) for name, size in gradients if kinds.get(name, "all-reduce") == kind]
        buckets.extend(threshold_buckets(own, thresholds.get(kind, XLA_GPU_COMBINE_BYTES)))
    return tuple(sorted(buckets, key=lambda bucket: position[bucket[-1]]))


def tuned_buckets(
    gradients: Gradients,
    kinds: dict[str, str],
    price: Callable[[tuple[tuple[str, ...], ...]], float],
    more_thresholds: dict[str, list[int]] | None = None,
) -> tuple[tuple[tuple[str, ...], ...], dict[str, int]]:
    """The buckets and per-kind thresholds of the fastest sweep, by `price`
    (the simulated step time of a bucketing; inf where it cannot run). Each
    kind in turn, the others at their best so far, sweeps `threshold_sweep`
    and `more_thresholds` of that kind, then a quarter of an octave apart
    around the best of those (`expert_flags.refined_thresholds`)."""
    more_thresholds = more_thresholds or {}
    present = sorted({kinds.get(name, "all-reduce") for name, _ in gradients})
    thresholds = dict.fromkeys(present, XLA_GPU_COMBINE_BYTES)
    best = kind_threshold_buckets(gradients, kinds, thresholds)
    best_s = price(best)
    for kind in present:
        total = sum(size for name, size in gradients if kinds.get(name, "all-reduce") == kind)
        sweep = sorted({*threshold_sweep(total), *more_thresholds.get(kind, ())})
        for finer in (False, True):
            if finer:
                sweep = refined_thresholds(thresholds[kind], sweep)
            for threshold in sweep:
                trial = {**thresholds, kind: threshold}
                buckets = kind_threshold_buckets(gradients, kinds, trial)
                seconds = price(buckets)
                if seconds < best_s:
                    best, best_s, thresholds = buckets, seconds, trial
    return best, thresholds


def unit_buckets(gradients: Gradients, min_bytes: int):
    """Consecutive gradients in units that close once they hold `min_bytes`."""
    buckets: list[list[str]] = []
    filled = min_bytes
    for name, size in gradients:
        if filled >= min_bytes:
            buckets.append([])
            filled = 0
        buckets[-1].append(name)
        filled += size
    return tuple(tuple(b) for b in buckets)


def cycle_buckets(
    gradients: Gradients, ready_s: dict[str, float], cycle_s: float, limit_bytes: int
):
    """Horovod's tensor fusion: each cycle, the gradients that became ready since
    the last one are sent, packed into buffers of at most `limit_bytes`."""
    by_cycle: dict[int, Gradients] = {}
    for name, size in gradients:
        by_cycle.setdefault(math.ceil(ready_s[name] / cycle_s - 1e-12), []).append((name, size))
    buckets: list[tuple[str, ...]] = []
    for cycle in sorted(by_cycle):
        buckets.extend(threshold_buckets(by_cycle[cycle], limit_bytes))
    return tuple(buckets)


def mgwfbp_buckets(
    gradients: Gradients, ready_s: dict[str, float], comm_s: Callable[[int], float], alpha_s: float
):
    """MG-WFBP's merge rule over gradients in ready order."""
    buckets: list[list[str]] = []
    bucket_bytes = 0
    comm_free = 0.0
    for name, size in gradients:
        if not buckets:
            buckets.append([name])
            bucket_bytes = size
        else:
            start = max(comm_free, ready_s[buckets[-1][-1]])
            if start >= ready_s[name] or ready_s[name] - start < alpha_s:
                buckets[-1].append(name)
                bucket_bytes += size
            else:
                comm_free = start + comm_s(bucket_bytes)
                buckets.append([name])
                bucket_bytes = size
    return tuple(tuple(b) for b in buckets)


def xla_cpu_buckets(gradients: Gradients, kinds: dict[str, str]):
    """XLA:CPU's combiner: every gradient all-reduce in one bucket, sent once the
    last is ready; reduce-scatters one by one (it has no combiner for them)."""
    combined = tuple(g for g, _ in gradients if kinds.get(g, "all-reduce") == "all-reduce")
    buckets: list[tuple[str, ...]] = []
    for name, _ in gradients:
        if name not in combined:
            buckets.append((name,))
        elif name == combined[-1]:
            buckets.append(combined)
    return tuple(buckets)
