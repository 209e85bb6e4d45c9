"""One analysis cache beside each module (`HloModule.analyses`): the
simulator's index and the kernels' parts are computed once, and dropped when a
pass changes the module."""

from __future__ import annotations

from disco_xla.hlo.graph import HloModule
from disco_xla.hlo_passes.bucket_all_reduces import BucketAllReduces
from disco_xla.plan import Plan
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.module_index import module_index


def test_analyses_are_kept_beside_the_module_until_a_pass_changes_it(captured):
    module = HloModule.from_bytes(captured["jax_pmap_step"][0], "step")
    assert len(module.analyses) == 0
    index = module_index(module)
    assert module_index(module) is index
    plan = Plan.unfused(module)
    build_task_graph(module, plan)
    kept = len(module.analyses)
    assert kept > 1  # the index, the collectives, the kernels' parts, the signatures
    build_task_graph(module, plan)
    assert len(module.analyses) == kept  # nothing computed again
    other = HloModule.from_bytes(captured["jax_pmap_step"][0], "copy")
    assert module_index(other) is not index  # a module of its own, analyses of its own
    one_bucket = (tuple(name for bucket in plan.all_reduce_buckets for name in bucket),)
    assert BucketAllReduces(one_bucket).run(module)
    assert len(module.analyses) == 0
    assert module_index(module) is not index
