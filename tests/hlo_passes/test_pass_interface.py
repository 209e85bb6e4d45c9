"""Every rewrite pass has XLA's shape (a `name`, and `run(module) -> changed`),
and a pipeline runs them in order with a verifier after each change."""

from __future__ import annotations

import pytest

from disco_xla.hlo.graph import HloModule
from disco_xla.hlo.hlo_io import module_from_text
from disco_xla.hlo_passes.bucket_all_reduces import BucketAllReduces
from disco_xla.hlo_passes.fusion_boundaries import OutlineFusionGroups
from disco_xla.hlo_passes.inline_calls import InlineCalls
from disco_xla.hlo_passes.insert_gradient_all_reduces import InsertGradientAllReduces
from disco_xla.hlo_passes.partitions_as_replicas import PartitionsAsReplicas
from disco_xla.hlo_passes.pass_interface import HloPass, run_pipeline

PASSES = [
    InlineCalls(),
    InsertGradientAllReduces([0], replicas=2),
    OutlineFusionGroups([("a",)]),
    BucketAllReduces([("a",)]),
    PartitionsAsReplicas(),
]

STEP = """HloModule step

sum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}

negated {
  p = f32[4] parameter(0)
  ROOT n = f32[4] negate(p)
}

ENTRY main {
  x = f32[4] parameter(0)
  y = f32[4] parameter(1)
  gx = f32[4] call(x), to_apply=negated
  rx = f32[4] all-reduce(gx), replica_groups={{0,1}}, to_apply=sum
  ry = f32[4] all-reduce(y), replica_groups={{0,1}}, to_apply=sum
  ROOT t = (f32[4], f32[4]) tuple(rx, ry)
}
"""


@pytest.mark.parametrize("hlo_pass", PASSES, ids=lambda p: p.name)
def test_every_pass_has_a_distinct_name_and_a_run(hlo_pass):
    assert isinstance(hlo_pass, HloPass)
    assert [p.name for p in PASSES].count(hlo_pass.name) == 1


def test_the_pipeline_verifies_after_each_pass_that_changed_the_module():
    module = module_from_text(STEP, "step")
    verified = []

    def verifier(checked: HloModule, name: str) -> None:
        assert checked is module
        verified.append(name)

    pipeline = [
        InlineCalls(),
        PartitionsAsReplicas(),  # nothing to do: not partitioned
        BucketAllReduces([("rx", "ry")]),
    ]
    assert run_pipeline(module, pipeline, verifier)
    assert verified == ["inline-calls", "bucket-all-reduces"]
    (bucket,) = module.all_reduces
    assert bucket.shape == "f32[8]" and bucket.is_gradient
    assert not run_pipeline(module, [InlineCalls(), PartitionsAsReplicas()], verifier)
    assert verified == ["inline-calls", "bucket-all-reduces"]
