"""Each baseline's bucketing rule, by name (`BUCKET_RULES`): XLA's combiners
(modelled on the GPU, its one combined all-reduce on the CPU), their thresholds
swept (`xla-tuned`) or as MaxText sets them, one all-reduce per gradient,
Horovod's fusion buffer and cycle, PyTorch DDP's buckets, MG-WFBP's merging,
and FSDP's units. `baselines` turns each bucketing into a plan."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from disco_xla.search.combiners import (
    MB,
    XLA_GPU_COMBINE_BYTES,
    Gradients,
    cycle_buckets,
    kind_threshold_buckets,
    mgwfbp_buckets,
    threshold_buckets,
    tuned_buckets,
    unit_buckets,
    xla_cpu_buckets,
)
from disco_xla.search.expert_flags import maxtext_thresholds, unmodelled_note
from disco_xla.simulator.comm import all_reduce_s
from disco_xla.simulator.profiles import ClusterProfile

FSDP_UNIT_BYTES = 4 * 10**8  # 1e8 parameters of 4 bytes

Bucketing = tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class BucketRequest:
    """What a baseline's rule reads: the gradients (in ready order), when each
    is ready, the cluster, which gradients are reduce-scatters, and the
    simulated step time of a bucketing (for `xla-tuned`'s sweep)."""

    gradients: Gradients
    ready_s: dict[str, float]
    profile: ClusterProfile
    kinds: dict[str, str]
    price: Callable[[Bucketing], float] | None

    @property
    def gpu(self) -> bool:
        return self.profile.execution == "gpu-streams"


def bucket_rules(
    name: str,
    gradients: Gradients,
    ready_s: dict[str, float],
    profile: ClusterProfile,
    kinds: dict[str, str] | None = None,
    price: Callable[[Bucketing], float] | None = None,
) -> tuple[Bucketing, str]:
    """The buckets baseline `name` makes of `gradients` (in ready order), and a
    note (`BUCKET_RULES`, one rule a baseline). `kinds` says which gradients
    are reduce-scatters (None: none are); the caller cuts buckets that mix
    kinds (`legal_buckets`). `xla-tuned` needs `price`, the simulated step time
    of a bucketing."""
    request = BucketRequest(gradients, ready_s, profile, kinds or {}, price)
    rule = BUCKET_RULES.get(name)
    if rule is None:
        raise ValueError(f"unknown baseline {name!r}")
    if name in XLA_BASELINES and not request.gpu:
        return _xla_cpu_rule(request)
    return rule(name, request)


def _xla_cpu_rule(request: BucketRequest) -> tuple[Bucketing, str]:
    """XLA's baselines on the CPU: its one combined all-reduce."""
    scattered = any(kind != "all-reduce" for kind in request.kinds.values())
    note = "XLA:CPU's combined all-reduce" + (", reduce-scatters one by one" if scattered else "")
    return xla_cpu_buckets(request.gradients, request.kinds), note


def _xla_gpu_rule(name: str, request: BucketRequest) -> tuple[Bucketing, str]:
    """XLA:GPU's combiner at its default threshold, with the latency-hiding
    scheduler off (`xla`) or on (`xla-overlap`)."""
    where = (
        "each holding the compute stream (latency-hiding scheduler off)"
        if name == "xla"
        else "beside compute (latency-hiding scheduler on)"
    )
    return (
        threshold_buckets(request.gradients, XLA_GPU_COMBINE_BYTES),
        f"XLA:GPU's combiner modelled: up to 30 MB per all-reduce, {where}",
    )


def _xla_tuned_rule(name: str, request: BucketRequest) -> tuple[Bucketing, str]:
    if request.price is None:
        raise ValueError("the xla-tuned baseline needs a price for its sweep")
    buckets, thresholds = tuned_buckets(request.gradients, request.kinds, request.price)
    chosen = ", ".join(f"{kind} {limit // MB} MB" for kind, limit in thresholds.items())
    return buckets, (
        f"XLA:GPU's combiners at the swept thresholds the simulator found fastest "
        f"({chosen}), beside compute (latency-hiding scheduler on)"
    )


def _maxtext_rule(name: str, request: BucketRequest) -> tuple[Bucketing, str]:
    profile, kinds = request.profile, request.kinds
    thresholds = maxtext_thresholds(profile)
    if thresholds is None:
        raise ValueError(f"MaxText published no thresholds for {profile.name}")
    sent = {kind: thresholds[kind] for kind in sorted({*kinds.values(), "all-reduce"})}
    chosen = ", ".join(f"{kind} {limit // MB} MB" for kind, limit in sent.items())
    return kind_threshold_buckets(request.gradients, kinds, thresholds), (
        f"XLA:GPU's combiners at MaxText's A3 thresholds for {profile.nodes} VMs "
        f"({chosen}), beside compute (latency-hiding scheduler on), reduce-scatters "
        f"and all-reduces pipelined a loop trip on{unmodelled_note()}"
    )


def _one_by_one_rule(name: str, request: BucketRequest) -> tuple[Bucketing, str]:
    holding = request.gpu and name != "none"
    note = "one all-reduce per gradient" + (", each holding the compute stream" if holding else "")
    return tuple((g,) for g, _ in request.gradients), note


def _horovod_rule(name: str, request: BucketRequest) -> tuple[Bucketing, str]:
    cycle_s, limit = (1e-3, 128 * MB) if name == "horovod" else (5e-3, 64 * MB)
    note = f"{limit // MB} MB fusion buffer, {cycle_s * 1e3:.0f} ms cycle"
    ready_s = request.ready_s
    if request.profile.collectives_after_compute:  # every gradient reaches Horovod in one cycle
        ready_s = dict.fromkeys(ready_s, 0.0)
        note += ", every gradient in one cycle (sent after the compute)"
    return cycle_buckets(request.gradients, ready_s, cycle_s, limit), note


def _ddp_rule(name: str, request: BucketRequest) -> tuple[Bucketing, str]:
    buckets = threshold_buckets(request.gradients, 25 * MB, first_bytes=1 * MB)
    return buckets, "25 MB buckets, the first 1 MB"


def _mgwfbp_rule(name: str, request: BucketRequest) -> tuple[Bucketing, str]:
    profile = request.profile
    alpha = all_reduce_s(1, profile)
    buckets = mgwfbp_buckets(
        request.gradients, request.ready_s, lambda size: all_reduce_s(size, profile), alpha
    )
    return buckets, f"MG-WFBP merging with alpha {alpha * 1e6:.1f} us"


def _fsdp_rule(name: str, request: BucketRequest) -> tuple[Bucketing, str]:
    buckets = unit_buckets(request.gradients, FSDP_UNIT_BYTES)
    return buckets, "FSDP units of 1e8 parameters, all-gathers issued when ready"


# XLA's own baselines: on the CPU each is XLA:CPU's one combined all-reduce.
XLA_BASELINES = ("xla", "xla-overlap", "xla-tuned")
# Each baseline's bucketing rule, by name.
BUCKET_RULES: dict[str, Callable[[str, BucketRequest], tuple[Bucketing, str]]] = {
    "xla": _xla_gpu_rule,
    "xla-overlap": _xla_gpu_rule,
    "xla-tuned": _xla_tuned_rule,
    "maxtext": _maxtext_rule,
    "xla-nocombine": _one_by_one_rule,
    "none": _one_by_one_rule,
    "horovod": _horovod_rule,
    "horovod-legacy": _horovod_rule,
    "ddp": _ddp_rule,
    "mgwfbp": _mgwfbp_rule,
    "fsdp": _fsdp_rule,
}
