"""The baselines every result is compared with, as plans.

- `none`: no op fusion, one all-reduce per gradient.
- `xla`: XLA's fusion and combiner as compiled. On CPU profiles that is XLA:CPU's
  one combined all-reduce; on GPU profiles XLA:GPU's combiner is modelled instead:
  groups of up to 30 MB, each sent once its last member is ready. XLA:GPU's
  latency-hiding scheduler is off by default, and without it
  XLA does not overlap a collective with compute (NVIDIA's JAX-Toolbox GPU
  performance guide: overlap needs `--xla_gpu_enable_latency_hiding_scheduler`),
  so on GPU profiles each all-reduce holds the compute stream until it ends.
- `xla-overlap`: as `xla`, with the latency-hiding scheduler on: on GPU profiles
  the 30 MB groups run beside compute. XLA:CPU has no asynchronous collectives,
  so on CPU profiles it is `xla`.
- `xla-tuned`: `xla-overlap` as an expert runs it (`expert_flags`): what
  XLA:GPU turns on at optimisation level O1, each pipelining kept where it
  simulates faster (all-gathers a loop trip ahead, reduce-scatters and
  all-reduces a trip on: `tuned_pipelining`), and each kind's combine
  threshold swept: NVIDIA's JAX-Toolbox GPU performance guide says to try
  the all-reduce threshold in powers of two from 16 MB up to the total
  gradient size, and to size the reduce-scatter threshold likewise. Each
  kind's threshold is swept over those powers of two (and XLA's default
  30 MB), then a quarter of an octave apart around the best, one kind after
  the other, and the simulator keeps the fastest (`tuned_buckets`). Last, the
  windowed-einsum threshold that simulates fastest, or none
  (`windowed_einsum`). XLA:CPU has no such thresholds: on CPU profiles it is
  `xla`.
- `maxtext` (not among BASELINES: only where a configuration exists, see
  `expert_flags.maxtext_thresholds`): `xla-overlap` with every flag of
  MaxText's published A3 scripts for that many 8-GPU nodes, flag by flag
  (`expert_flags.MAXTEXT_A3_FLAGS`); its note names those not modelled.
- `xla-nocombine`: XLA's fusion, one all-reduce per gradient (on GPU profiles
  in line with compute, as `xla`).
- `horovod`: a 128 MB fusion buffer filled every 1 ms cycle; `horovod-legacy`:
  64 MB and 5 ms (Horovod before v0.21).
- `ddp`: 25 MB buckets in the order gradients become ready, the first 1 MB.
- `mgwfbp`: merge a gradient into the bucket before it when that bucket's
  all-reduce could not start before the gradient is ready, or would start less
  than the latency alpha earlier (MG-WFBP, Shi et al.).
- `fsdp`: PyTorch FSDP's size-based wrapping (`size_based_auto_wrap_policy`,
  min_num_params 1e8): gradients in ready order form units that close once
  they hold 1e8 parameters (4e8 bytes at 4 bytes a parameter), and each unit's
  gradients are sent as one collective (a reduce-scatter where the step
  reduce-scatters them). Its all-gathers stay one per parameter: the
  simulator issues each as soon as its input is ready, which is FSDP's
  prefetch of the next unit's parameters.

Gradients sent by reduce-scatter are bucketed by the same rules, never with
all-reduces; XLA:GPU's combiners have a 30 MB threshold for each kind
(`kDefaultReduceScatterCombineThreshold` beside the all-reduce's, in XLA's
collective_utils.h), and XLA:CPU combines all-reduces only. On GPU profiles
`xla`, `xla-overlap`, `xla-tuned` and `maxtext` also combine the module's
all-gathers as XLA:GPU's all-gather combiner does, at XLA's default, the swept
or MaxText's threshold (`xla_gpu_all_gathers`); the other baselines keep one
all-gather per parameter.

On GPU profiles every program XLA runs itself (`expert_flags.COMBINED_BY_XLA_GPU`) is
simulated as XLA:GPU compiles it (`simulator.xla_gpu_run`): its
reduce-scatter creator turns the partitioner's all-reduce + dynamic-slice
pairs into reduce-scatters before its combiners group them by kind
(`expert_flags.combiner_kinds`).

XLA's fusion comes from the module XLA compiled. `baseline` gives the plans over
that compiled module, where each fusion is one kernel. `captured_baselines` gives
every baseline as a plan over the captured module itself, with XLA's kernels
mapped back to the captured instructions (`xla_fusion`), so that they and the
search's plans are simulated alike and the search can start from them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from disco_xla.errors import DiscoInputError
from disco_xla.hlo.collectives import collective_bytes
from disco_xla.hlo.graph import HloModule
from disco_xla.hlo.xla_gpu_patterns import sinkable_collectives
from disco_xla.plan import (
    Plan,
    bucket_kinds,
    gradient_all_reduces_in_order,
    gradient_dependencies,
    verify_plan,
)
from disco_xla.search.all_gather_buckets import (
    xla_gpu_all_gathers,
)
from disco_xla.search.baseline_rules import bucket_rules
from disco_xla.search.combiners import (
    Gradients,
)
from disco_xla.search.expert_flags import (
    MAXTEXT_A3_LLAMA2_7B,
    combiner_kinds,
    maxtext_thresholds,
    xla_gpu_run,
)
from disco_xla.search.fusion_source import XlaFusion, compiled_fusion
from disco_xla.search.windowed_einsum import with_windowed_einsum
from disco_xla.simulator.cost_models import CostModel
from disco_xla.simulator.events import simulate
from disco_xla.simulator.kernels import TaskGraph, build_task_graph
from disco_xla.simulator.profiles import ClusterProfile
from disco_xla.simulator.xla_gpu_run import PIPELINED_KINDS, XlaGpuRun, as_xla_gpu_runs

BASELINES = (
    "none",
    "xla",
    "xla-overlap",
    "xla-tuned",
    "xla-nocombine",
    "horovod",
    "horovod-legacy",
    "ddp",
    "mgwfbp",
    "fsdp",
)
# The baselines XLA runs itself: on GPU profiles their collectives hold the compute
# stream (the latency-hiding scheduler is off by default).
RUN_BY_XLA = ("xla", "xla-nocombine")


def baseline_names(profile: ClusterProfile) -> tuple[str, ...]:
    """The baselines for `profile`: BASELINES, and `maxtext` after `xla-tuned`
    where MaxText published thresholds for its scale."""
    if maxtext_thresholds(profile) is None:
        return BASELINES
    after = BASELINES.index("xla-tuned") + 1
    return (*BASELINES[:after], "maxtext", *BASELINES[after:])


def _check_baseline_name(name: str, profile: ClusterProfile) -> None:
    if name == "maxtext" and maxtext_thresholds(profile) is None:
        raise DiscoInputError(
            profile.name,
            "MaxText published combine thresholds for 8 H100s a node at "
            f"{', '.join(map(str, MAXTEXT_A3_LLAMA2_7B))} nodes only: no maxtext baseline here",
        )
    if name not in baseline_names(profile):
        raise ValueError(f"unknown baseline {name!r}")


def gradients_in_ready_order(
    module: HloModule, ready_s: dict[str, float] | None = None
) -> Gradients:
    """Gradient all-reduces (and reduce-scatters) with the bytes of their whole
    buffers, by ready time (else program order)."""
    ordered = gradient_all_reduces_in_order(module)
    if ready_s is not None:
        ordered = sorted(ordered, key=lambda i: (ready_s[i.name], ordered.index(i)))
    return [(i.name, collective_bytes(i)) for i in ordered]


def with_buckets(plan: Plan, buckets) -> Plan:
    return replace(plan, all_reduce_buckets=tuple(buckets))


@dataclass(frozen=True)
class Baseline:
    name: str
    module: HloModule  # the original, or the module XLA compiled
    plan: Plan
    note: str
    # The buckets are tuple all-reduces, as XLA's combiner makes them, not the
    # concatenations a plan's buckets become: simulate with
    # `build_task_graph(module, plan, tuple_buckets=True)`.
    tuple_buckets: bool = False
    # Each collective holds the compute stream until it ends (XLA:GPU's default).
    collectives_block_compute: bool = False
    # What XLA:GPU's compiler does to its collectives (`expert_flags.xla_gpu_run`): a
    # program XLA runs on a GPU profile; None elsewhere.
    xla_run: XlaGpuRun | None = None

    def task_graph(self) -> TaskGraph:
        graph = build_task_graph(
            self.module, self.plan, self.tuple_buckets, self.collectives_block_compute
        )
        return graph if self.xla_run is None else as_xla_gpu_runs(graph, self.module, self.xla_run)


def tuned_pipelining(chosen: Baseline, profile: ClusterProfile, cost_model: CostModel) -> Baseline:
    """`chosen` (an XLA-run baseline) with the pipelining of reduce-scatters
    and all-reduces that simulates fastest, of none, each kind alone, and
    both (O1 turns both on; ties keep the fewer). Unchanged where no
    collective can be sunk."""
    if chosen.xla_run is None or not sinkable_collectives(chosen.module):
        return chosen
    best, best_s = chosen, simulate(chosen.task_graph(), profile, cost_model).iteration_s
    for kinds in (("reduce-scatter",), ("all-reduce",), PIPELINED_KINDS):
        trial = replace(chosen, xla_run=replace(chosen.xla_run, pipelined=frozenset(kinds)))
        seconds = simulate(trial.task_graph(), profile, cost_model).iteration_s
        if seconds < best_s:
            best, best_s = trial, seconds
    if best is chosen:
        return chosen
    sunk = " and ".join(k + "s" for k in PIPELINED_KINDS if k in best.xla_run.pipelined)
    return replace(best, note=f"{best.note}, {sunk} pipelined a loop trip on")


def sends_tuples(name: str, profile: ClusterProfile) -> bool:
    """Whether baseline `name`'s buckets go out as tuple all-reduces, one
    message per tensor: XLA:CPU's combiner makes one tuple all-reduce; XLA:GPU's
    sends each combined group as one message."""
    return name in ("xla", "xla-overlap", "xla-tuned") and profile.execution != "gpu-streams"


def baseline(
    name: str,
    original: HloModule,
    compiled_combined: HloModule | None,
    compiled_separate: HloModule | None,
    profile: ClusterProfile,
    cost_model: CostModel,
) -> Baseline:
    """The baseline plan `name` (one of BASELINES). Except for `none`, it needs
    the module as XLA compiled it with its all-reduce combiner on and off."""
    if name == "none":
        return Baseline(
            name, original, Plan.unfused(original), "no fusion, one all-reduce per gradient"
        )
    _check_baseline_name(name, profile)
    if compiled_combined is None or compiled_separate is None:
        raise ValueError(f"the {name} baseline needs the module compiled by XLA")
    gpu = profile.execution == "gpu-streams"
    fusion_note = "XLA:CPU's fusion" + (" (standing in for XLA:GPU's)" if gpu else "")
    if name in ("xla", "xla-overlap", "xla-tuned") and not gpu:
        plan = Plan.unfused(compiled_combined)
        return Baseline(
            name, compiled_combined, plan, f"{fusion_note}, XLA:CPU's combined all-reduce"
        )
    separate = Plan.unfused(compiled_separate)
    singletons = simulate(build_task_graph(compiled_separate, separate), profile, cost_model)
    ready = singletons.collective_ready_s
    gradients = gradients_in_ready_order(compiled_separate, ready)
    run = xla_gpu_run(name, profile)
    price = bucketing_price(compiled_separate, separate, profile, cost_model, run)
    kinds = gradient_kinds(compiled_separate)
    if run is not None:
        kinds = combiner_kinds(compiled_separate, kinds)
    buckets, note = bucket_rules(name, gradients, ready, profile, kinds, price)
    plan, gather_note = xla_gpu_all_gathers(
        name,
        compiled_separate,
        with_buckets(separate, legal_buckets(compiled_separate, buckets)),
        profile,
        cost_model,
    )
    chosen = Baseline(
        name,
        compiled_separate,
        plan,
        f"{fusion_note}, {note}{gather_note}",
        collectives_block_compute=gpu and name in RUN_BY_XLA,
        xla_run=run,
    )
    return tuned_by_expert(chosen, profile, cost_model) if name == "xla-tuned" else chosen


def tuned_by_expert(chosen: Baseline, profile: ClusterProfile, cost_model: CostModel) -> Baseline:
    """`xla-tuned`'s last two choices, each kept where faster: O1's pipelining
    (`tuned_pipelining`), then the windowed-einsum threshold (`windowed_einsum`)."""
    piped = tuned_pipelining(chosen, profile, cost_model)
    return with_windowed_einsum(piped, profile, cost_model)


def bucketing_price(
    module: HloModule,
    plan: Plan,
    profile: ClusterProfile,
    cost_model: CostModel,
    run: XlaGpuRun | None = None,
) -> Callable[[tuple[tuple[str, ...], ...]], float]:
    """The simulated step time of `plan` with given buckets (made legal), its
    collectives beside compute, as XLA:GPU runs them under `run` where given;
    inf where the plan cannot run (refused by `verify_plan`, or no kernel order
    runs it: a reader of one member would come before a kernel another member
    waits for through a collective it reads)."""

    def price(buckets: tuple[tuple[str, ...], ...]) -> float:
        bucketed = with_buckets(plan, legal_buckets(module, buckets))
        try:
            verify_plan(bucketed, module)
        except DiscoInputError:
            return math.inf
        graph = build_task_graph(module, bucketed)
        if run is not None:
            graph = as_xla_gpu_runs(graph, module, run)
        try:
            return simulate(graph, profile, cost_model).iteration_s
        except RuntimeError:  # no kernel order runs these buckets (`plan_kernels.bucket_waits`)
            return math.inf

    return price


def legal_buckets(module: HloModule, buckets) -> tuple[tuple[str, ...], ...]:
    """`buckets` with each bucket cut where consecutive members differ in kind,
    dtype, reduction, device groups or computation, and before a member computed
    from the reduced value of one already in the bucket (a batch-norm statistic
    or a partitioner's all-reduce of a reduced gradient)."""
    kind = bucket_kinds(module)
    dependencies = gradient_dependencies(module)
    out: list[tuple[str, ...]] = []
    for bucket in buckets:
        run: list[str] = []
        for name in bucket:
            reads_run = not dependencies.get(name, frozenset()).isdisjoint(run)
            if run and (kind[name] != kind[run[-1]] or reads_run):
                out.append(tuple(run))
                run = []
            run.append(name)
        if run:
            out.append(tuple(run))
    return tuple(out)


def gradient_kinds(module: HloModule) -> dict[str, str]:
    """'all-reduce' or 'reduce-scatter', by gradient name."""
    return {a.name: a.kind for a in module.gradient_all_reduces}


def captured_baselines(
    module: HloModule,
    fusion: XlaFusion | HloModule,
    profile: ClusterProfile,
    cost_model: CostModel,
    names: tuple[str, ...] | None = None,
) -> dict[str, Baseline]:
    """Every baseline of `names` (default `baseline_names(profile)`) as a plan
    over the captured `module`.

    `fusion` is XLA's own fusion (`fusion_source.XlaFusion`: compiled here,
    from XLA's dump, or modelled), or the module as XLA compiled it with its
    all-reduce combiner off, whose kernels give it. Ready times for the
    bucketing rules come from simulating XLA's fusion with one all-reduce per
    gradient. A plan a rule makes that `verify_plan` refuses (a bucket that
    would depend on a later one) falls back to one all-reduce per gradient, and
    says so in its note."""
    if isinstance(fusion, HloModule):
        fusion = compiled_fusion(module, fusion)
    gpu = profile.execution == "gpu-streams"
    fusion_note = fusion.note + (
        " (XLA:CPU's, standing in for XLA:GPU's)" if gpu and fusion.source == "compile" else ""
    )
    xla_fusion = fusion.plan
    singletons = simulate(build_task_graph(module, xla_fusion), profile, cost_model)
    ready = singletons.collective_ready_s
    gradients = gradients_in_ready_order(module, ready)
    kinds = gradient_kinds(module)
    # The sweep of `xla-tuned`, as XLA runs its program (None on CPU profiles).
    price = bucketing_price(module, xla_fusion, profile, cost_model, xla_gpu_run("xla", profile))
    baselines = {}
    for name in names or baseline_names(profile):
        _check_baseline_name(name, profile)
        if name == "none":
            baselines[name] = Baseline(
                "none", module, Plan.unfused(module), "no fusion, one all-reduce per gradient"
            )
            continue
        run = xla_gpu_run(name, profile)
        seen_kinds = kinds if run is None else combiner_kinds(module, kinds)
        buckets, note = bucket_rules(name, gradients, ready, profile, seen_kinds, price)
        plan, note = _bucketed_plan(name, module, fusion, buckets, note, gpu)
        plan, gather_note = xla_gpu_all_gathers(name, module, plan, profile, cost_model)
        note += gather_note
        chosen = Baseline(
            name,
            module,
            plan,
            f"{fusion_note}, {note}",
            sends_tuples(name, profile),
            collectives_block_compute=gpu and name in RUN_BY_XLA,
            xla_run=run,
        )
        baselines[name] = (
            tuned_by_expert(chosen, profile, cost_model) if name == "xla-tuned" else chosen
        )
    return baselines


def _bucketed_plan(
    name: str, module: HloModule, fusion: XlaFusion, buckets, note: str, gpu: bool
) -> tuple[Plan, str]:
    """XLA's fusion with baseline `name`'s buckets (made legal), or with the
    all-reduces of XLA's dump for `xla` and `xla-overlap`; one all-reduce per
    gradient where `verify_plan` refuses them. Returns the plan and its note."""
    if fusion.buckets is not None and name in ("xla", "xla-overlap"):
        buckets = fusion.buckets
        note = f"XLA's {len(buckets)} all-reduces from its dump, in its order" + (
            ", each holding the compute stream" if name == "xla" and gpu else ""
        )
    plan = with_buckets(fusion.plan, legal_buckets(module, buckets))
    try:
        verify_plan(plan, module)
    except DiscoInputError as error:
        return (
            fusion.plan,
            f"{note} is not legal here ({error}); one all-reduce per gradient instead",
        )
    return plan, note
