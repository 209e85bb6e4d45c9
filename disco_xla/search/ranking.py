"""How well simulated times order plans the way measured times do.

The simulator is judged by ranking, not by absolute error: a search
only needs it to put the plans in the right order. Two figures, over the same
plans' simulated and measured step times:

- Kendall's τ-b between the two: 1 when they order every pair alike, -1 when
  they order every pair the other way round (ties count as in τ-b);
- top-1 regret: the measured time of the plan the simulator ranks first, over
  the best measured time, less 1 (0 when the simulator's first choice is the
  fastest; 0.03 when it is 3% slower than the fastest).

A third figure judges the simulator as the entry points use it: they measure the
simulator's first k candidates and run the fastest. The top-k regret is the measured
time of the fastest of the k plans the simulator ranks first, over the best measured
time, less 1. It is the top-1 regret at k = 1 and 0 once k covers every plan."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankFidelity:
    kendall_tau: float  # NaN with fewer than two plans, or when a side is all ties
    top1_regret: float
    simulator_choice: str  # the plan with the least simulated time
    fastest: str  # the plan with the least measured time
    plans: int


def rank_fidelity(simulated_s: dict[str, float], measured_s: dict[str, float]) -> RankFidelity:
    """`RankFidelity` of the plans in both mappings (label -> seconds). Ties in
    the simulator's first place go to the label that sorts first."""
    from scipy.stats import kendalltau

    labels = _shared_labels(simulated_s, measured_s)
    simulated = [simulated_s[label] for label in labels]
    measured = [measured_s[label] for label in labels]
    tau = float("nan")
    if len(labels) > 1:
        tau = float(kendalltau(simulated, measured).statistic)
    choice = _simulator_order(labels, simulated_s)[0]
    fastest = min(labels, key=lambda label: (measured_s[label], label))
    regret = measured_s[choice] / measured_s[fastest] - 1.0
    return RankFidelity(tau, regret, choice, fastest, len(labels))


def top_k_regret(simulated_s: dict[str, float], measured_s: dict[str, float], k: int) -> float:
    """The measured time of the fastest of the `k` plans the simulator ranks
    first, over the best measured time, less 1, over the plans in both mappings
    (simulated ties go to the label that sorts first, as in `rank_fidelity`)."""
    if k < 1:
        raise ValueError(f"k must be at least 1, not {k}")
    labels = _shared_labels(simulated_s, measured_s)
    first = _simulator_order(labels, simulated_s)[:k]
    best = min(measured_s[label] for label in labels)
    return min(measured_s[label] for label in first) / best - 1.0


def _shared_labels(simulated_s: dict[str, float], measured_s: dict[str, float]) -> list[str]:
    """The labels of the plans both simulated and measured, sorted."""
    labels = sorted(set(simulated_s) & set(measured_s))
    if not labels:
        raise ValueError("no plan is both simulated and measured")
    return labels


def _simulator_order(labels: list[str], simulated_s: dict[str, float]) -> list[str]:
    """`labels` by simulated time, ties to the label that sorts first."""
    return sorted(labels, key=lambda label: (simulated_s[label], label))
