"""Learning what collectives cost inside a step, from measured step times.

The communication model prices a collective from probes timed on their own or
in a small step. Inside a real step on some runtimes each one costs far more:
on 4 gloo processes sharing 2 cores, a plan with one all-reduce per gradient ran
15x its simulated time while one with a single bucket ran 2x, so the simulator
ordered bucketings wrongly (benchmarks/BENCHMARKS.md, "Rank fidelity on 4
processes"). Every measured first call times several programs of one module
that differ mostly in how many collectives they run; this module fits the two
numbers that explain those differences:

- `collective_message_s`, what each collective costs beyond the model (a
  rendezvous of the workers and a message);
- `tuple_all_reduce_element_s`, what each tensor after the first of a tuple
  all-reduce costs (XLA:CPU's combined all-reduce sends its tensors one after
  another). The calibrated figure is timed on a small probe; the measured
  steps tell what it is in a real step. The two are learned apart: counting a
  tuple's tensors as collectives, Keras Xception's one tuple all-reduce of 156
  tensors (XLA's program, the fastest measured in one process) had to cost as
  much as 156 separate all-reduces, which ran 14% slower (benchmarks/BENCHMARKS.md,
  "Rank fidelity on the Keras set").

The fit. Each observation is one program of one module: the collectives it runs
per step and the tensors after the first in its tuple all-reduces
(`message_counts`), its simulated time with neither cost, and its measured
time. For costs (m, e) a program's time is modelled as
    measured ≈ scale_module · (simulated + m · collectives + e · tuple tensors),
with one scale per module (the machine's speed that day, the kernels' level),
so only the order and ratios within a module count, not the absolute error.
m and e are chosen from a fixed grid (0, then 10 points per decade from 1 us to
100 ms) to minimise the spread of log(measured / modelled) within each module;
a cost the observations cannot tell (no module whose programs differ in that
count) is left unlearned.

The costs may not make a module's programs modelled more than 3x slower than
measured (scale_module ≥ `MIN_MODULE_SCALE`) unless its simulation alone already
is. When a module's measured times follow the collectives its programs send, a
larger cost always explains them a little better, the simulated time drowning in
cost · collectives and the scale absorbing the level: unbounded, the fit learned
39.8 ms a collective on gpt2_small (4 gloo processes; its programs then modelled
7x their measured times) and 100 ms, the grid's top, on bert_base (over 10x;
benchmarks/BENCHMARKS.md, "The learned collective cost at the grid's top"). 3x
is what this machine's drift (up to 1.8x) and the GNN's level on a family it
was not trained on (0.7-1.7) can explain together.

The grid makes the result a step function of the data: a little more data
rarely moves it, so the plans searched with it stay cached.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from disco_xla.simulator.kernels import TaskGraph
from disco_xla.simulator.profiles import ClusterProfile

# 0, then 1e-6 .. 1e-1 s at 10 points per decade.
MESSAGE_COST_GRID_S = (0.0,) + tuple(10.0 ** (exponent / 10) for exponent in range(-60, -9))

# The least measured / modelled level the learned costs may give a module.
MIN_MODULE_SCALE = 1 / 3


@dataclass(frozen=True, order=True)
class StepTime:
    """One measured program of one module."""

    module: str  # the module's fingerprint
    program: str  # what distinguishes the program (a plan's digest)
    messages: int  # collectives it runs per step (`message_counts`)
    simulated_s: float  # simulated with no message or tuple tensor cost
    measured_s: float
    tuple_tensors: int = 0  # tensors after the first of its tuple all-reduces, per step


@dataclass(frozen=True)
class CollectiveCosts:
    """What the fit learned; None where the observations could not tell."""

    message_s: float | None  # each collective (`ClusterProfile.collective_message_s`)
    tuple_element_s: float | None  # each tuple tensor after the first

    def applied_to(self, profile: ClusterProfile) -> ClusterProfile:
        """`profile` with the costs learned in place of its own."""
        if self.message_s is not None:
            profile = replace(profile, collective_message_s=self.message_s)
        if self.tuple_element_s is not None:
            profile = replace(profile, tuple_all_reduce_element_s=self.tuple_element_s)
        return profile


def message_counts(graph: TaskGraph) -> tuple[int, int]:
    """(collectives, tuple tensors) of a step: each collective once, and the
    tensors after the first of each tuple all-reduce, each as often as its loop
    runs."""
    elements = graph.tuple_element_bytes
    runs = graph.communication_runs
    collectives = tensors = 0
    for index in range(len(graph.communications)):
        count = runs[index] if index < len(runs) else 1
        collectives += count
        if index < len(elements) and elements[index]:
            tensors += (len(elements[index]) - 1) * count
    return collectives, tensors


def _spreads(
    groups: list[list[StepTime]], message_grid: tuple, tensor_grid: tuple
) -> list[tuple[float, float, float]]:
    """(spread, m, e) for every pair of the grids that keeps each module's scale
    within its bound: the spread is the sum over modules of the squared
    deviations of log(measured / modelled) from the module's mean (the log of its
    scale). Both grids start at 0, so the first pair adds no cost and is always
    kept."""
    flat = [t for group in groups for t in group]
    module = np.repeat(np.arange(len(groups)), [len(group) for group in groups])
    sizes = np.bincount(module).astype(np.float64)
    measured = np.log(np.array([t.measured_s for t in flat]))
    simulated = np.array([t.simulated_s for t in flat])
    messages = np.array([t.messages for t in flat], dtype=np.float64)
    tensors = np.array([t.tuple_tensors for t in flat], dtype=np.float64)
    pairs = [(m, e) for m in message_grid for e in tensor_grid]
    m = np.array([pair[0] for pair in pairs])[:, None]
    e = np.array([pair[1] for pair in pairs])[:, None]
    residuals = measured - np.log(simulated + m * messages + e * tensors)
    one_hot = np.eye(len(groups))[module]
    log_scales = residuals @ one_hot / sizes  # [pairs, modules]
    spread = ((residuals - log_scales[:, module]) ** 2).sum(axis=1)
    floor = np.minimum(np.log(MIN_MODULE_SCALE), log_scales[0])  # the cost-free scale if below
    kept = (log_scales >= floor - 1e-12).all(axis=1)
    return [
        (float(total), me[0], me[1])
        for total, me, keep in zip(spread, pairs, kept, strict=True)
        if keep
    ]


def fit_collective_costs(observations: list[StepTime]) -> CollectiveCosts:
    """The per-collective and per-tuple-tensor costs (seconds) that best
    explain `observations`. Each is None when they cannot tell it: no module
    with 2 or more programs that differ in that count."""
    by_module: dict[str, dict[str, StepTime]] = {}
    for t in observations:
        if t.measured_s > 0 and t.simulated_s > 0 and t.messages >= 0 and t.tuple_tensors >= 0:
            by_module.setdefault(t.module, {})[t.program] = t
    groups = [[group[name] for name in sorted(group)] for _, group in sorted(by_module.items())]
    tells_messages = any(len({t.messages for t in group}) >= 2 for group in groups)
    tells_tensors = any(len({t.tuple_tensors for t in group}) >= 2 for group in groups)
    groups = [group for group in groups if len(group) >= 2]
    if not (tells_messages or tells_tensors):
        return CollectiveCosts(None, None)
    message_grid = MESSAGE_COST_GRID_S if tells_messages else (0.0,)
    tensor_grid = MESSAGE_COST_GRID_S if tells_tensors else (0.0,)
    _, message_s, tuple_element_s = min(_spreads(groups, message_grid, tensor_grid))
    return CollectiveCosts(
        message_s if tells_messages else None, tuple_element_s if tells_tensors else None
    )
