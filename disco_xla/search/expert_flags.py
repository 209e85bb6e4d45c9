"""The XLA:GPU flags an expert runs, and what the simulator makes of each.

Two sets are modelled as baselines (`baselines`):
- `xla-tuned`: what XLA:GPU turns on at optimisation level O1 (XLA's
  `docs/effort_levels.md`): the latency-hiding scheduler; pipelined
  all-gathers, reduce-scatters and all-reduces; while-loop double buffering.
  An expert keeps each pipelining where it simulates faster (O1 slowed one
  published GB200 workload by 3.7%), and tunes each kind's combine threshold
  by a sweep finer than NVIDIA's powers of two (`refined_thresholds`).
- `maxtext`: the whole `XLA_FLAGS` of MaxText's A3 Llama2-7B scripts
  (AI-Hypercomputer/maxtext, `MaxText/configs/a3/llama_2_7b/<N>vm.sh`, read
  December 2026), flag by flag in `MAXTEXT_A3_FLAGS`, with its per-scale
  thresholds (`MAXTEXT_A3_LLAMA2_7B`).

Every flag is listed with how it is modelled; one the simulator cannot model
is named in the baseline's note (`unmodelled_note`). Every program XLA runs
itself is simulated as XLA:GPU compiles it (`xla_gpu_run`), its combiners
seeing the reduce-scatters its creator makes (`combiner_kinds`).
"""

from __future__ import annotations

from disco_xla.hlo.graph import HloModule
from disco_xla.hlo.xla_gpu_patterns import scattering_all_reduces
from disco_xla.simulator.profiles import ClusterProfile
from disco_xla.simulator.xla_gpu_run import PIPELINED_KINDS, XlaGpuRun

MB = 1 << 20

# The combine thresholds of MaxText's Llama2-7B scripts for A3 VMs (8 H100s each),
# by VM count. Their mesh is 8-way FSDP inside a VM, data parallel across VMs.
_MAXTEXT_A3_SMALL = {"all-gather": 128 * MB, "reduce-scatter": 64 * MB}
_MAXTEXT_A3_LARGE = {"all-gather": 128 * MB, "reduce-scatter": 128 * MB}
MAXTEXT_A3_LLAMA2_7B = {
    1: {"all-reduce": 128 * MB, **_MAXTEXT_A3_SMALL},
    2: {"all-reduce": 64 * MB, **_MAXTEXT_A3_SMALL},
    4: {"all-reduce": 512 * MB, **_MAXTEXT_A3_SMALL},
    8: {"all-reduce": 1024 * MB, **_MAXTEXT_A3_SMALL},
    **{vms: {"all-reduce": 1024 * MB, **_MAXTEXT_A3_LARGE} for vms in (16, 32, 64, 128)},
}

MODELLED, NOT_MODELLED = "modelled", "not modelled"
# Every flag of those scripts but the dump path, and how the simulator takes it:
# (flag, MODELLED or NOT_MODELLED, how).
MAXTEXT_A3_FLAGS = (
    (
        "--xla_gpu_enable_latency_hiding_scheduler=true",
        MODELLED,
        "collectives run on their own streams beside compute",
    ),
    (
        "--xla_gpu_enable_triton_gemm=false",
        NOT_MODELLED,
        "GEMMs are priced from XLA's measured table, whichever emitter runs them",
    ),
    ("--xla_gpu_graph_level=0", MODELLED, "every kernel pays its own launch (no CUDA graphs)"),
    (
        "--xla_gpu_enable_highest_priority_async_stream=true",
        NOT_MODELLED,
        "the simulator's collectives never share SMs with compute, which this flag aims for",
    ),
    (
        "--xla_gpu_all_reduce_combine_threshold_bytes",
        MODELLED,
        "all-reduces combined in ready order up to the script's threshold",
    ),
    (
        "--xla_gpu_all_gather_combine_threshold_bytes",
        MODELLED,
        "all-gathers combined up to the script's threshold",
    ),
    (
        "--xla_gpu_reduce_scatter_combine_threshold_bytes",
        MODELLED,
        "reduce-scatters (the creator's too) combined up to the script's threshold",
    ),
    (
        "--xla_gpu_enable_pipelined_all_gather=true",
        MODELLED,
        "loop-body all-gathers issued a trip ahead",
    ),
    (
        "--xla_gpu_enable_pipelined_reduce_scatter=true",
        MODELLED,
        "loop-body reduce-scatters sunk into the next trip",
    ),
    (
        "--xla_gpu_enable_pipelined_all_reduce=true",
        MODELLED,
        "loop-body all-reduces sunk into the next trip",
    ),
    (
        "--xla_gpu_enable_while_loop_double_buffering=true",
        MODELLED,
        "as part of the pipelining: a loop's trips are one task, so a moved "
        "collective overlaps the neighbouring trip",
    ),
    (
        "--xla_gpu_enable_triton_softmax_fusion=false",
        NOT_MODELLED,
        "the fusion is XLA:CPU's or the dump's, not XLA:GPU's under this flag",
    ),
    (
        "--xla_gpu_enable_all_gather_combine_by_dim=false",
        MODELLED,
        "the combiners never look at the gathered dimension",
    ),
    (
        "--xla_gpu_enable_reduce_scatter_combine_by_dim=false",
        MODELLED,
        "the combiners never look at the scattered dimension",
    ),
    (
        "--xla_disable_hlo_passes=rematerialization",
        NOT_MODELLED,
        "memory is not priced, so XLA's rematerialisation never runs in the simulator",
    ),
)


def maxtext_thresholds(profile: ClusterProfile) -> dict[str, int] | None:
    """MaxText's published combine thresholds for the profile's scale
    (`MAXTEXT_A3_LLAMA2_7B`), or None where it published none: a profile of
    8 H100s a node, at a VM count it has a script for."""
    if "H100" not in profile.device_name or profile.devices_per_node != 8:
        return None
    return MAXTEXT_A3_LLAMA2_7B.get(profile.nodes)


def unmodelled_note() -> str:
    """The MaxText flags the simulator cannot model, for the baseline's note."""
    names = [flag.split("=")[0] for flag, how, _ in MAXTEXT_A3_FLAGS if how == NOT_MODELLED]
    return "; flags not modelled: " + ", ".join(names)


def refined_thresholds(best: int, tried: list[int]) -> list[int]:
    """Thresholds between `best` and its neighbours in the sweep `tried`, a
    quarter of an octave apart: the finer sweep after the powers of two."""
    below = max((t for t in tried if t < best), default=best // 2)
    above = min((t for t in tried if t > best), default=best * 2)
    steps = [round(best * 2 ** (k / 4)) for k in (-3, -2, -1, 1, 2, 3)]
    return [t for t in steps if below < t < above and t not in tried]


# The baselines whose program XLA:GPU compiles with its own combiners.
COMBINED_BY_XLA_GPU = ("xla", "xla-overlap", "xla-tuned", "maxtext", "xla-nocombine")


def xla_gpu_run(name: str, profile: ClusterProfile) -> XlaGpuRun | None:
    """How XLA:GPU runs baseline `name`'s collectives on `profile`: its
    reduce-scatter creator before its combiners, and, for `maxtext`, its
    pipelining of reduce-scatters and all-reduces (`xla-tuned` chooses its
    own, `tuned_pipelining`). None where XLA:GPU does not run the baseline."""
    if profile.execution != "gpu-streams" or name not in COMBINED_BY_XLA_GPU:
        return None
    pipelined = frozenset(PIPELINED_KINDS) if name == "maxtext" else frozenset()
    return XlaGpuRun(buckets_by_xla=True, pipelined=pipelined)


def combiner_kinds(module: HloModule, kinds: dict[str, str]) -> dict[str, str]:
    """`kinds` as XLA:GPU's combiners see the gradients: a partitioner's
    all-reduce + dynamic-slice is a reduce-scatter by then
    (`xla_gpu_patterns.scattering_all_reduces`)."""
    scattering = scattering_all_reduces(module)
    return {name: "reduce-scatter" if name in scattering else k for name, k in kinds.items()}
