"""`benchmarks/rank_fidelity.py` on one tiny model in one process: at least 8
distinct programs, each measured (in two passes) and simulated, and the ranking
figures computed from them (no timing checks: the figures are what they are on
this machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from disco_xla.search.ranking import rank_fidelity, top_k_regret

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_one_model_gets_eight_distinct_programs_and_its_ranking_figures():
    command = [sys.executable, "benchmarks/rank_fidelity.py", "--models", "gpt2_small"]
    command += ["--rounds", "1", "--max-evals", "20", "--passes", "2", "--json"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (row,) = json.loads(result.stdout)
    plans = row["plans"]
    assert len(plans) >= 8 and "xla" in plans
    assert all(cell["measured_s"] > 0 and cell["simulated_s"] > 0 for cell in plans.values())
    # Every rewritten program computes what XLA's does.
    assert all(cell["equal"] for cell in plans.values()), plans
    # Plans that made the same program were counted once, and say which.
    for label, why in row["left_out"].items():
        assert label not in plans
        assert why.startswith(("the same program as ", "not rewritten"))
    # The figures are those of the plans' own times.
    fidelity = rank_fidelity(
        {label: cell["simulated_s"] for label, cell in plans.items()},
        {label: cell["measured_s"] for label, cell in plans.items()},
    )
    assert row["kendall_tau"] == pytest.approx(fidelity.kendall_tau)
    assert row["top1_regret"] == pytest.approx(fidelity.top1_regret) and row["top1_regret"] >= 0
    assert row["simulator_choice"] == fidelity.simulator_choice in plans
    # Measuring the simulator's first k programs (the entry points' default k)
    # leaves at most the top-1 regret (every program here has equal outputs).
    simulated = {label: cell["simulated_s"] for label, cell in plans.items()}
    measured = {label: cell["measured_s"] for label, cell in plans.items()}
    assert row["measured_choice_k"] == 4
    assert row["measured_choice_regret"] == pytest.approx(top_k_regret(simulated, measured, 4))
    assert 0 <= row["measured_choice_regret"] <= row["top1_regret"]
    # Two independent passes: the measured time is their mean, and the first
    # pass ranked against the second gives the measurement's own figures.
    first, second = row["passes_s"]
    assert set(first) == set(second) == set(plans)
    for label, cell in plans.items():
        assert cell["measured_s"] == pytest.approx((first[label] + second[label]) / 2)
    between = rank_fidelity(first, second)
    assert row["between_passes_kendall_tau"] == pytest.approx(between.kendall_tau)
    assert row["between_passes_top1_regret"] == pytest.approx(between.top1_regret)
