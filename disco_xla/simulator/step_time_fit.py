"""Learning what each collective costs inside a step, from measured step times.

The communication model prices a collective from probes timed on their own or
in a small step. Inside a real step on some runtimes each message costs far
more: on 4 gloo processes sharing 2 cores, a plan with one all-reduce per
gradient ran 15x its simulated time while one with a single bucket ran 2x, so
the simulator ordered bucketings wrongly (benchmarks/BENCHMARKS.md, "Rank
fidelity on 4 processes"). Every measured first call times several programs of
one module that differ mostly in how many messages they send; this module fits
the one number that explains those differences, the profile's
`collective_message_s`.

The fit. Each observation is one program of one module: the messages it sends
per step (`messages_per_step`), its simulated time with no message cost, and
its measured time. For a message cost m, a program's time is modelled as
    measured ≈ scale_module · (simulated + m · messages),
with one scale per module (the machine's speed that day, the kernels' level),
so only the order and ratios within a module count, not the absolute error.
m is chosen from a fixed grid (0, then 10 points per decade from 1 us to
100 ms) to minimise the spread of log(measured / modelled) within each module.
The grid makes the result a step function of the data: a little more data
rarely moves it, so the plans searched with it stay cached.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from disco_xla.simulator.kernels import TaskGraph

# 0, then 1e-6 .. 1e-1 s at 10 points per decade.
MESSAGE_COST_GRID_S = (0.0,) + tuple(10.0 ** (exponent / 10) for exponent in range(-60, -9))


@dataclass(frozen=True, order=True)
class StepTime:
    """One measured program of one module."""

    module: str  # the module's fingerprint
    program: str  # what distinguishes the program (a plan's digest)
    messages: int  # messages it sends per step (`messages_per_step`)
    simulated_s: float  # simulated with no message cost
    measured_s: float


def messages_per_step(graph: TaskGraph) -> int:
    """The messages a step sends: each collective once, a tuple all-reduce once
    per tensor, each as often as its loop runs."""
    elements = graph.tuple_element_bytes
    runs = graph.communication_runs
    total = 0
    for index in range(len(graph.communications)):
        tensors = len(elements[index]) if index < len(elements) and elements[index] else 1
        total += tensors * (runs[index] if index < len(runs) else 1)
    return total


def _spread(groups: list[list[StepTime]], message_s: float) -> float:
    """Sum over modules of the squared deviations of log(measured / modelled)
    from the module's mean."""
    total = 0.0
    for group in groups:
        residuals = [
            math.log(t.measured_s) - math.log(t.simulated_s + message_s * t.messages) for t in group
        ]
        mean = sum(residuals) / len(residuals)
        total += sum((r - mean) ** 2 for r in residuals)
    return total


def fit_message_cost(observations: list[StepTime]) -> float | None:
    """The per-message cost (seconds) that best explains `observations`; None
    when they cannot tell (no module with 2 or more programs that send
    different numbers of messages)."""
    by_module: dict[str, dict[str, StepTime]] = {}
    for t in observations:
        if t.measured_s > 0 and t.simulated_s > 0 and t.messages >= 0:
            by_module.setdefault(t.module, {})[t.program] = t
    groups = [
        [group[program] for program in sorted(group)]
        for _, group in sorted(by_module.items())
        if len({t.messages for t in group.values()}) >= 2
    ]
    if not groups:
        return None
    spreads = [(_spread(groups, m), m) for m in MESSAGE_COST_GRID_S]
    return min(spreads)[1]
