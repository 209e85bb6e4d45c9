"""What `disco-xla optimize -o MODULE` measures beside the search's first choice."""

from __future__ import annotations

import pytest

from disco_xla.hlo_passes.graph import HloModule
from disco_xla.plan import Plan
from disco_xla.planning import measured_alternatives
from disco_xla.search.backtracking import greedy_fusion_plan


@pytest.fixture(scope="module")
def plans(captured):
    step = HloModule.from_bytes(captured["jax_pmap_step"][0], "step")
    unfused, greedy = Plan.unfused(step), greedy_fusion_plan(step)
    one_bucket = Plan(
        step.name,
        step.fingerprint,
        greedy.fusion_groups,
        (tuple(a.name for a in step.gradient_all_reduces),),
    )
    return unfused, greedy, one_bucket


def test_the_next_best_plans_and_the_best_baseline_are_measured(plans):
    unfused, greedy, one_bucket = plans
    top = ((1.0, greedy), (1.5, one_bucket), (2.0, unfused))
    baselines = {
        "xla": (one_bucket, 0.5),  # XLA's own program: the reference, not a candidate
        "none": (unfused, 0.1),  # no fusion: never measured as a baseline
        "ddp": (one_bucket, 3.0),
        "horovod": (greedy, 2.5),
    }
    alternatives, simulated = measured_alternatives(top, baselines, count=2)
    assert alternatives == {"candidate-2": one_bucket, "baseline:horovod": greedy}
    assert simulated == {"plan": 1.0, "candidate-2": 1.5, "baseline:horovod": 2.5}
    # More candidates than the search kept: all it kept.
    alternatives, _ = measured_alternatives(top, {}, count=10)
    assert list(alternatives) == ["candidate-2", "candidate-3"]
