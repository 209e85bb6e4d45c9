"""The simulator's ranking figures (`search.ranking`) on cases with known answers."""

from __future__ import annotations

import math

import pytest

from disco_xla.search.ranking import rank_fidelity, top_k_regret


def test_the_same_order_is_tau_one_and_no_regret():
    simulated = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}
    measured = {"a": 10.0, "b": 25.0, "c": 26.0, "d": 90.0}  # other scale, same order
    fidelity = rank_fidelity(simulated, measured)
    assert fidelity.kendall_tau == pytest.approx(1.0)
    assert fidelity.top1_regret == 0.0
    assert fidelity.simulator_choice == fidelity.fastest == "a"
    assert fidelity.plans == 4


def test_the_reverse_order_is_tau_minus_one_and_the_slowest_plan_chosen():
    simulated = {"a": 4.0, "b": 3.0, "c": 2.0, "d": 1.0}
    measured = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}
    fidelity = rank_fidelity(simulated, measured)
    assert fidelity.kendall_tau == pytest.approx(-1.0)
    assert (fidelity.simulator_choice, fidelity.fastest) == ("d", "a")
    assert fidelity.top1_regret == pytest.approx(3.0)  # 4 s against the best 1 s


def test_one_swapped_pair_of_four():
    # Of the 6 pairs, one (a, b) is ordered the other way: tau = (5 - 1) / 6.
    simulated = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}
    measured = {"a": 1.03, "b": 1.0, "c": 3.0, "d": 4.0}
    fidelity = rank_fidelity(simulated, measured)
    assert fidelity.kendall_tau == pytest.approx(4 / 6)
    assert fidelity.top1_regret == pytest.approx(0.03)
    assert (fidelity.simulator_choice, fidelity.fastest) == ("a", "b")


def test_only_plans_both_simulated_and_measured_count():
    fidelity = rank_fidelity({"a": 1.0, "b": 2.0, "gone": 0.1}, {"a": 2.0, "b": 1.0})
    assert fidelity.plans == 2 and fidelity.simulator_choice == "a"
    assert math.isnan(rank_fidelity({"a": 1.0}, {"a": 1.0}).kendall_tau)
    with pytest.raises(ValueError, match="no plan"):
        rank_fidelity({"a": 1.0}, {"b": 1.0})


def test_top_k_regret_is_what_measuring_the_first_k_plans_leaves():
    # The simulator's order is d, c, b, a; the fastest measured is a (1 s).
    simulated = {"a": 4.0, "b": 3.0, "c": 2.0, "d": 1.0}
    measured = {"a": 1.0, "b": 1.1, "c": 2.0, "d": 1.5}
    assert top_k_regret(simulated, measured, 1) == pytest.approx(0.5)  # d alone
    assert top_k_regret(simulated, measured, 1) == pytest.approx(
        rank_fidelity(simulated, measured).top1_regret
    )
    assert top_k_regret(simulated, measured, 2) == pytest.approx(0.5)  # d, c: d is faster
    assert top_k_regret(simulated, measured, 3) == pytest.approx(0.1)  # b joins
    assert top_k_regret(simulated, measured, 4) == 0.0
    assert top_k_regret(simulated, measured, 10) == 0.0
    with pytest.raises(ValueError, match="at least 1"):
        top_k_regret(simulated, measured, 0)
    with pytest.raises(ValueError, match="no plan"):
        top_k_regret({"a": 1.0}, {"b": 1.0}, 2)
