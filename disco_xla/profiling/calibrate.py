"""`disco-xla calibrate`'s measurements: all-reduce times on the current
runtime, from 4 KB to 256 MB, to which `cpu_profile.fit_ring_model` fits the
ring model's alpha (latency per step) and B (bandwidth). Two runtimes:
N CPU devices in one process, or N `jax.distributed` processes on loopback (gloo).
The same run measures this machine's f32 matmul rate and memory bandwidth, and
what each tensor of a tuple all-reduce (XLA:CPU's combined all-reduce) adds
inside a computing step, and what a step costs beyond its kernels and
all-reduces (see `StepCosts`). `cpu_profile` writes the `cpu-threads` profile.

A tuple tensor is timed against the alternative it competes with in a plan: the
same k tensors sent as k separate all-reduces, each after a chain of kernels
(`tuple_element_in_step`; timed in a step of its own it came out 5-7x smaller,
see benchmarks/BENCHMARKS.md, "Rank fidelity"). Its cost is the share
(T(tuple) - T(one)) / (T(separate) - T(one)) of what a separate small
all-reduce adds to a step, times the profile's own price of one
(`StepCosts.all_reduce_in_step_s`): the order between a tuple and separate
all-reduces is then the measured one, whatever the machine's speed when each
probe ran (the raw per-tensor time drifted from 71 to 43 us between sessions).

Each all-reduce point is what an all-reduce of that size adds to a computing
step (`in_step_points`): the wall time of a step that runs only that psum, less
the least such time, plus what the smallest size measured inside a computing
step. The step's own dispatch is counted once per step (`step_overhead_s`,
`step_buffer_s`), not once per all-reduce.

The other collectives (all-gather, reduce-scatter, all-to-all, collective-permute)
are timed the same way at every other size (`collective_probes`), each on a
buffer of that size as `collectives.collective_bytes` counts it (the gathered result,
the scattered operand), and become what each adds to a computing step with its
own in-step probe (`in_step_points`). The profile carries them as
`calibration.collective_points`, which `comm.collective_s` reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from disco_xla.simulator.profiles import MEASURED_COLLECTIVE_KINDS
from disco_xla.timing import (
    median_seconds,
    paired_median_seconds,
    rotating_median_seconds,
    summed_per_run,
    thunk_seconds,
    traced_events,
)

SIZES_BYTES = [4096 * 4**k for k in range(9)]  # 4 KB ... 256 MB
# The tuple all-reduce probe: the in-step probe's all-reduce (IN_STEP_BYTES) as a
# tuple of TUPLE_TENSORS tensors, against it as one tensor (`in_step_probe`).
TUPLE_TENSORS = 16
TUPLE_ALL_REDUCE = "tuple all-reduce"
# The same tensors as TUPLE_TENSORS separate all-reduces (XLA's combiner off;
# the pass's name as `runtime.xla_runner.ALL_REDUCE_COMBINER`, a layer above this one).
SEPARATE_ALL_REDUCES = "separate all-reduces"
ALL_REDUCE_COMBINER = "cpu-all-reduce-combiner"
# The largest buffer the other collectives are timed on: gloo's all-gather of
# 256 MB (128 MB from each of 2 processes) hung on loopback in 2 of 3 runs here.
OTHER_KINDS_MAX_BYTES = 16 * 2**20
# The empty-step probe: steps of 1 and of STEP_PAIRS (argument, result) pairs,
# each timed over STEP_RUNS runs (a step takes tens of microseconds).
STEP_PAIRS, STEP_RUNS = 64, 200
# The compute probe (`compute_probe`), timed over PROBE_RUNS runs and traced
# over PROBE_TRACED_RUNS.
PROBE_LAYERS, PROBE_CHANNELS, PROBE_RUNS, PROBE_TRACED_RUNS = 8, 32, 30, 8
# The in-step all-reduce probe (`in_step_probe`): IN_STEP_ROUNDS all-reduces of
# IN_STEP_BYTES (the smallest calibrated size), each after IN_STEP_KERNELS kernels.
IN_STEP_ROUNDS, IN_STEP_KERNELS, IN_STEP_BYTES, IN_STEP_RUNS = 16, 8, 4096, 40
# The worker-lag probe: the in-step probe with IN_STEP_LAG_BYTES per worker for
# its kernels (about 0.75 ms of them a round here), the same all-reduces.
IN_STEP_LAG_BYTES = 64 * IN_STEP_BYTES


@dataclass(frozen=True)
class StepCosts:
    """What a step costs on this runtime beyond the kernel and all-reduce times.

    - The host's cost, from empty steps (each of its k results is its argument
      times 2) over all the workers: T(k) = step_overhead_s + 2k·step_buffer_s.
      It is dispatching the step to every worker (JAX's argument checks and
      placement, the runtime launching each device's program, one after another)
      and handing back its results. A training step's arguments and results are
      its parameters and optimizer state, so the per-buffer term grows with the
      model's tensor count. Measured with k = 1 and k = STEP_PAIRS; one tiny
      kernel per result is inside the per-buffer term.
    - `kernel_time_scale`: wall time per second of profiled kernel time while
      every worker computes at once. The workers share this machine's cores (and
      other processes may too): a worker's kernels wait for a core while another
      worker's kernel runs, which the profiler's kernel durations do not show.
      Measured on a probe (`compute_probe`): (T_probe - T(1)) / (median over
      workers and runs of its kernels' summed durations in a profiler trace).
    - `all_reduce_in_step_s`: what one all-reduce of IN_STEP_BYTES adds to a step
      whose workers compute between all-reduces (`in_step_probe`), against
      what it takes alone in a step (the smallest all-reduce point): there the
      workers start it one after another, inside a step they reach it together.
      `collective_in_step_s` holds the same for each of MEASURED_COLLECTIVE_KINDS
      (`in_step_s` reads either).
    - `worker_lag`: how far behind the slowest worker reaches a collective, as a
      fraction of the kernel time since the workers last met. Workers that share
      cores drift apart as they compute, and the first to arrive waits. Measured
      as what an all-reduce adds to the in-step probe with IN_STEP_LAG_BYTES of
      kernels a round, less what it adds with IN_STEP_BYTES, over the difference
      in their rounds' kernel time."""

    step_overhead_s: float
    step_buffer_s: float
    empty_step_s: float  # T(1): one argument, one result
    kernel_time_scale: float = 1.0
    all_reduce_in_step_s: float | None = None
    worker_lag: float = 0.0
    collective_in_step_s: dict[str, float] = field(default_factory=dict)

    def in_step_s(self, kind: str) -> float | None:
        """What one collective `kind` of IN_STEP_BYTES adds to a computing step,
        or None where not measured."""
        if kind == "all-reduce":
            return self.all_reduce_in_step_s
        return self.collective_in_step_s.get(kind)

    @classmethod
    def from_times(
        cls,
        one_pair_s: float,
        many_pairs_s: float,
        probe_s: float | None = None,
        probe_kernel_s: float | None = None,
        all_reduce_in_step_s: float | None = None,
        worker_lag: float = 0.0,
        collective_in_step_s: dict[str, float] | None = None,
    ) -> StepCosts:
        buffer_s = max(0.0, (many_pairs_s - one_pair_s) / (2 * (STEP_PAIRS - 1)))
        scale = 1.0
        if probe_s is not None and probe_kernel_s:
            scale = max(probe_s - one_pair_s, 0.0) / probe_kernel_s or 1.0
        return cls(
            max(0.0, one_pair_s - 2 * buffer_s),
            buffer_s,
            one_pair_s,
            scale,
            all_reduce_in_step_s,
            worker_lag,
            collective_in_step_s or {},
        )


def empty_steps(mesh, place: Callable) -> dict[int, Callable[[], object]]:
    """{pairs: a call of the empty step with that many (argument, result) pairs}
    over `mesh`; `place(array)` makes a replicated global array of one local one."""
    steps = {}
    for pairs in (1, STEP_PAIRS):
        step = jax.jit(
            jax.shard_map(
                lambda *xs: tuple(x * 2 for x in xs), mesh=mesh, in_specs=P(), out_specs=P()
            )
        )
        arguments = [place(np.full((8,), i, np.float32)) for i in range(pairs)]
        steps[pairs] = lambda step=step, arguments=arguments: jax.block_until_ready(
            step(*arguments)
        )
    return steps


def compute_probe(mesh, place: Callable, place_split: Callable) -> Callable[[], object]:
    """A call of the compute probe over `mesh`: on each worker, the gradient of
    a loss over PROBE_LAYERS layers of a 3x3 convolution (PROBE_CHANNELS
    channels, a 4x16x16 batch), ReLU and a normalisation, XLA's fusion on: a
    training step's big and small kernels and its independent branches (each
    weight's gradient beside the backward pass), and no collective.
    `place_split(local)` makes a global array split over the workers from this
    worker's part."""

    def loss(weights, x):
        for weight in weights:
            x = jax.lax.conv_general_dilated(
                x, weight, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
            )
            x = jax.nn.relu(x)
            x = x / (1 + jnp.mean(x * x))
        return jnp.mean(x)

    def gradients(x, weights):
        return jax.grad(loss)(weights, x)

    axis = mesh.axis_names[0]
    step = jax.jit(
        jax.shard_map(
            gradients, mesh=mesh, in_specs=(P(axis), P()), out_specs=P(axis), check_vma=False
        )
    )
    batch = place_split(np.ones((4, 16, 16, PROBE_CHANNELS), np.float32))
    shape = (3, 3, PROBE_CHANNELS, PROBE_CHANNELS)
    weights = [place(np.full(shape, 0.01, np.float32)) for _ in range(PROBE_LAYERS)]
    return lambda: jax.block_until_ready(step(batch, weights))


def traced_kernel_s(run: Callable[[], object], runs: int) -> float:
    """The median, over runs and this process's devices, of the summed durations
    of the kernels one run of `run` executes (`timing.traced_events`, each
    asynchronous one until its completion: `timing.thunk_seconds`)."""
    return summed_per_run(thunk_seconds(traced_events(run, runs, ("/host:CPU",))))


def in_step_probe(
    mesh, place_split: Callable, collective: str | None, kernel_bytes: int = IN_STEP_BYTES
) -> Callable[[], object]:
    """A call of a step that runs IN_STEP_ROUNDS times a chain of IN_STEP_KERNELS
    elementwise kernels (XLA's fusion off, so each is a kernel) on a vector of
    `kernel_bytes` per worker, each chain followed by the `collective` (a kind
    of `collective_probes`; TUPLE_ALL_REDUCE: the all-reduce's buffer as a
    tuple of TUPLE_TENSORS; SEPARATE_ALL_REDUCES: as that many all-reduces, with
    XLA's combiner off; none when None) of a buffer of IN_STEP_BYTES taken from
    the vector's start, whose result replaces as much of the vector."""
    axis, workers = mesh.axis_names[0], mesh.size
    elements = IN_STEP_BYTES // 4
    probes = collective_probes(axis, workers)
    probes[TUPLE_ALL_REDUCE] = (tuple_probe(axis), lambda n: n)
    probes[SEPARATE_ALL_REDUCES] = (tuple_probe(axis, separate=True), lambda n: n)
    apply, part = probes[collective or "all-reduce"]

    def rounds(x):
        for _ in range(IN_STEP_ROUNDS):
            for _ in range(IN_STEP_KERNELS):
                x = jnp.sin(x)
            if collective is not None:
                result = apply(x[: part(elements)])
                x = (
                    result
                    if result.shape == x.shape
                    else jnp.concatenate([result, x[result.shape[0] :]])
                )
        return x

    vector = place_split(np.ones((kernel_bytes // 4,), np.float32))
    passes_off = ["fusion"] + ([ALL_REDUCE_COMBINER] if collective == SEPARATE_ALL_REDUCES else [])
    step = (
        jax.jit(jax.shard_map(rounds, mesh=mesh, in_specs=P(axis), out_specs=P(axis)))
        .lower(vector)
        .compile(compiler_options={"xla_disable_hlo_passes": ",".join(passes_off)})
    )
    return lambda: jax.block_until_ready(step(vector))


def collective_in_step(
    mesh, place_split: Callable, kernel_bytes: int = IN_STEP_BYTES, kind: str = "all-reduce"
) -> tuple[float, float]:
    """(what one collective `kind` adds to a computing step, the kernel time of a
    round): the medians of paired, alternating runs of `in_step_probe` with and
    without its collectives, their difference divided by their count (at least
    0), and the step without them divided by its rounds."""
    calls = [in_step_probe(mesh, place_split, chosen, kernel_bytes) for chosen in (kind, None)]
    for call in calls * 3:
        call()
    without_s, with_s = paired_median_seconds(*reversed(calls), IN_STEP_RUNS)
    return in_step_from(with_s, without_s)


def in_step_from(with_s: float, without_s: float) -> tuple[float, float]:
    """`collective_in_step` from the in-step probe's times with and without its
    collectives."""
    return max(0.0, (with_s - without_s) / IN_STEP_ROUNDS), without_s / IN_STEP_ROUNDS


def worker_lag(small: tuple[float, float], large: tuple[float, float]) -> float:
    """`StepCosts.worker_lag` from `collective_in_step` with little and with much
    kernel time a round: the all-reduce's growth over the kernel time's (>= 0)."""
    (small_s, small_round_s), (large_s, large_round_s) = small, large
    if large_round_s <= small_round_s:
        return 0.0
    return max(0.0, (large_s - small_s) / (large_round_s - small_round_s))


def measure_step_costs(mesh, place: Callable, place_split: Callable) -> StepCosts:
    """`StepCosts` of the workers of `mesh` (see `empty_steps`, `compute_probe`,
    `in_step_probe`); every worker must call it at the same time."""
    steps = empty_steps(mesh, place)
    probe = compute_probe(mesh, place, place_split)
    one_pair_s = median_seconds(steps[1], STEP_RUNS, warmup=10)
    many_pairs_s = median_seconds(steps[STEP_PAIRS], STEP_RUNS, warmup=10)
    probe_s = median_seconds(probe, PROBE_RUNS, warmup=3)
    small = collective_in_step(mesh, place_split)
    large = collective_in_step(mesh, place_split, IN_STEP_LAG_BYTES)
    others = {
        kind: collective_in_step(mesh, place_split, kind=kind)[0]
        for kind in MEASURED_COLLECTIVE_KINDS
    }
    return StepCosts.from_times(
        one_pair_s,
        many_pairs_s,
        probe_s,
        traced_kernel_s(probe, PROBE_TRACED_RUNS),
        small[0],
        worker_lag(small, large),
        others,
    )


def in_step_points(
    measured: list[tuple[int, float]], step: StepCosts, kind: str = "all-reduce"
) -> list[tuple[int, float]]:
    """Times of collective `kind` as they add to a computing step: each measured
    time (a step of that collective alone) less the least of them (the latency of
    such a step alone; the least, since a single size can stall), plus what the
    smallest size measured inside a computing step (`StepCosts.in_step_s`): the
    size-dependent part comes from the points, the fixed part from the step. No
    point goes below that in-step time. Without that measurement, each time less
    the empty step's, and at least 1% of it (a profile's points must be positive)."""
    in_step_s = step.in_step_s(kind)
    if in_step_s is None:
        return [(size, max(t - step.empty_step_s, 0.01 * t)) for size, t in measured]
    in_step_s = max(in_step_s, 1e-9)
    offset_s = min(seconds for _, seconds in measured) - in_step_s
    return [(size, max(seconds - offset_s, in_step_s)) for size, seconds in measured]


def sizes_by_kind(sizes: list[int]) -> dict[str, list[int]]:
    """The sizes each collective is timed at: the all-reduce at `sizes`, the
    others (MEASURED_COLLECTIVE_KINDS) at every other one of them up to
    OTHER_KINDS_MAX_BYTES."""
    others = [size for size in sizes[::2] if size <= OTHER_KINDS_MAX_BYTES]
    return {"all-reduce": sizes, **{kind: others for kind in MEASURED_COLLECTIVE_KINDS}}


def collective_probes(axis: str, workers: int) -> dict[str, tuple[Callable, Callable]]:
    """{kind: (the collective on one worker's part of a vector over `axis`, the
    length of that part for a buffer of n elements)} for the all-reduce and each
    of MEASURED_COLLECTIVE_KINDS. The buffer is what `collectives.collective_bytes`
    counts: an all-gather's result (each worker gives n/p), a reduce-scatter's
    operand; an all-reduce, an all-to-all and a permute (to the next worker in a
    ring) move n."""
    ring = [(rank, (rank + 1) % workers) for rank in range(workers)]
    return {
        "all-reduce": (lambda x: jax.lax.psum(x, axis), lambda n: n),
        "all-gather": (lambda x: jax.lax.all_gather(x, axis, tiled=True), lambda n: n // workers),
        "reduce-scatter": (lambda x: jax.lax.psum_scatter(x, axis, tiled=True), lambda n: n),
        "all-to-all": (lambda x: jax.lax.all_to_all(x, axis, 0, 0, tiled=True), lambda n: n),
        "collective-permute": (lambda x: jax.lax.ppermute(x, axis, ring), lambda n: n),
    }


def measure_collectives(
    mesh,
    place_split: Callable,
    sizes: list[int],
    repeats: int,
    tick: Callable[[], None] = lambda: None,
    kinds: tuple[str, ...] = ("all-reduce", *MEASURED_COLLECTIVE_KINDS),
) -> dict[str, list[tuple[int, float]]]:
    """{kind: [(bytes, seconds of a step that runs only that collective)]} for
    the `kinds` of `collective_probes` over the workers of `mesh` at
    `sizes_by_kind(sizes)`; each buffer is rounded down to a whole number of
    elements per worker. Every worker must call it at the same time."""
    axis, workers = mesh.axis_names[0], mesh.size
    measured: dict[str, list[tuple[int, float]]] = {}
    for kind in kinds:
        kind_sizes = sizes_by_kind(sizes)[kind]
        collective, part = collective_probes(axis, workers)[kind]
        step = jax.jit(jax.shard_map(collective, mesh=mesh, in_specs=P(axis), out_specs=P(axis)))
        for size in kind_sizes:
            elements = size // 4 // workers * workers
            data = place_split(np.ones((part(elements),), np.float32))
            measured.setdefault(kind, []).append((4 * elements, _time_call(step, data, repeats)))
            tick()
    return measured


def measure_in_process(
    devices: int, sizes: list[int], repeats: int, tick: Callable[[], None] = lambda: None
) -> tuple[dict[str, list[tuple[int, float]]], float, StepCosts]:
    """`measure_collectives`, a tuple tensor's share of a separate all-reduce
    (`tuple_element_in_step`) and the `StepCosts` over `devices` CPU devices of
    this process, in the order the processes take."""
    chosen = jax.devices("cpu")[:devices]
    if len(chosen) < devices:
        raise RuntimeError(f"need {devices} CPU devices, JAX has {len(chosen)}")
    mesh = Mesh(np.array(chosen), ("d",))
    replicated, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("d"))

    def place_split(x):
        return jax.device_put(np.concatenate([x] * devices), split)

    measured = measure_collectives(mesh, place_split, sizes, repeats, tick, ("all-reduce",))
    tuple_share = tuple_element_in_step(mesh, place_split)
    step = measure_step_costs(mesh, lambda x: jax.device_put(x, replicated), place_split)
    others = measure_collectives(mesh, place_split, sizes, repeats, tick, MEASURED_COLLECTIVE_KINDS)
    return {**measured, **others}, tuple_share, step


def _time_call(fn: Callable, argument, repeats: int) -> float:
    return median_seconds(lambda: fn(argument).block_until_ready(), repeats)


def tuple_element_in_step(mesh, place_split: Callable) -> float:
    """What each tensor after the first adds to a tuple all-reduce inside a
    computing step, as a share of what each adds as a separate all-reduce
    (`tuple_element_share`): `in_step_probe` with one all-reduce, with
    TUPLE_ALL_REDUCE and with SEPARATE_ALL_REDUCES of the same bytes, timed in
    rounds whose order rotates. Every worker must call it at the same time."""
    kinds = ("all-reduce", TUPLE_ALL_REDUCE, SEPARATE_ALL_REDUCES)
    calls = {kind: in_step_probe(mesh, place_split, kind) for kind in kinds}
    for call in list(calls.values()) * 3:
        call()
    times = rotating_median_seconds(calls, IN_STEP_RUNS)
    return tuple_element_share(*(times[kind] for kind in kinds))


def tuple_element_share(one_s: float, tuple_s: float, separate_s: float) -> float:
    """What a tuple tensor after the first adds to a step, as a share of what a
    separate all-reduce adds (>= 0), from the in-step probe's times with one
    all-reduce, with the same bytes as a tuple of TUPLE_TENSORS, and as that
    many separate all-reduces. 1 where the separate all-reduces measured no
    dearer than one (noise: the share cannot be told)."""
    if separate_s <= one_s:
        return 1.0
    return max(0.0, (tuple_s - one_s) / (separate_s - one_s))


def tuple_element_seconds(share: float, step: StepCosts) -> float:
    """A tuple tensor's cost for the profile: `share` (`tuple_element_share`) of
    what the profile charges a separate small all-reduce, the in-step time of
    one (`StepCosts.all_reduce_in_step_s`, the least of its points:
    `in_step_points`)."""
    return share * (step.all_reduce_in_step_s or 0.0)


def tuple_probe(axis: str, separate: bool = False) -> Callable:
    """A psum over `axis` of a vector as a tuple of TUPLE_TENSORS equal slices
    (or, `separate`, a psum of each slice), the results joined again (its
    length a multiple of TUPLE_TENSORS)."""

    def as_tuple(x):
        length = x.shape[0] // TUPLE_TENSORS
        parts = tuple(x[i * length : (i + 1) * length] for i in range(TUPLE_TENSORS))
        if separate:
            return jnp.concatenate([jax.lax.psum(part, axis) for part in parts])
        return jnp.concatenate(jax.lax.psum(parts, axis))

    return as_tuple


def measure_device(repeats: int = 5) -> tuple[float, float]:
    """(f32 matmul FLOP/s, memory bandwidth bytes/s) of one CPU device."""
    n = 2048
    a = jnp.ones((n, n), jnp.float32)
    matmul = jax.jit(lambda x: x @ x)
    flops = 2 * n**3 / median_seconds(lambda: matmul(a).block_until_ready(), repeats)
    big = jnp.ones((64 * 2**20,), jnp.float32)  # 256 MB
    scale = jax.jit(lambda x: x * 1.5)
    bandwidth = 2 * big.nbytes / median_seconds(lambda: scale(big).block_until_ready(), repeats)
    return flops, bandwidth
