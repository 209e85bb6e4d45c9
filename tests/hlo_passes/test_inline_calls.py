"""The inline-calls pass: every inlineable call site gets its own copy, results
stay bit-equal, and the simulator can order the kernels (a computation called
from two places gives one task per instruction only once it is copied)."""

from __future__ import annotations

import pytest

from disco_xla.capture import capture_jax
from disco_xla.hlo.graph import HloModule
from disco_xla.hlo_passes.inline_calls import InlineCalls
from disco_xla.plan import Plan, verify_plan
from disco_xla.runtime.candidate_timing import verify_rewrite
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.zoo.jax_steps import build_jax_step


@pytest.fixture(scope="module")
def gpt2_module() -> HloModule:
    step = build_jax_step("gpt2_small", "tiny", replicas=2, global_batch=4)
    return capture_jax(step.fn, *step.args)


def _calls(module: HloModule):
    return [i for i in module.instructions() if i.opcode == "call"]


def test_every_inlineable_call_is_gone_and_shared_callees_were_copied(gpt2_module):
    callees = [c.called_computations[0].name for c in _calls(gpt2_module)]
    assert len(callees) > len(set(callees)), "the test needs a computation called twice"
    inlined = HloModule.from_bytes(gpt2_module.to_bytes())
    assert InlineCalls().run(inlined)
    left = _calls(inlined)
    assert left and all(c.proto.frontend_attributes.map["inlineable"] == "false" for c in left)
    assert len(inlined.computations) < len(gpt2_module.computations)
    assert len(inlined.gradient_all_reduces) == len(gpt2_module.gradient_all_reduces)
    assert not InlineCalls().run(inlined)  # nothing left to do


def test_inlined_module_computes_bit_equal_results(gpt2_module):
    inlined = HloModule.from_bytes(gpt2_module.to_bytes())
    InlineCalls().run(inlined)
    assert verify_rewrite(gpt2_module, inlined, devices=2, rounds=1).bit_equal


def test_the_simulator_orders_the_kernels_of_the_inlined_module(gpt2_module):
    inlined = HloModule.from_bytes(gpt2_module.to_bytes())
    InlineCalls().run(inlined)
    plan = Plan.unfused(inlined)
    verify_plan(plan, inlined)
    graph = build_task_graph(inlined, plan)
    assert len(graph.kernels) == len(plan.fusion_groups)


# One computation called twice, and a call XLA must keep.
CALLS = """HloModule calls

double {
  p = f32[4] parameter(0)
  ROOT d = f32[4] add(p, p)
}

kept {
  q = f32[4] parameter(0)
  ROOT n = f32[4] negate(q)
}

ENTRY main {
  x = f32[4] parameter(0)
  a = f32[4] call(x), to_apply=double
  b = f32[4] call(a), to_apply=double
  ROOT r = f32[4] call(b), to_apply=kept, frontend_attributes={inlineable="false"}
}
"""


def test_each_call_site_gets_its_own_copy_and_a_second_run_changes_nothing():
    from disco_xla.hlo.hlo_io import module_from_text

    module = module_from_text(CALLS, "calls")
    assert InlineCalls().run(module)
    entry = module.entry
    assert [i.opcode for i in entry.topological_order] == ["parameter", "add", "add", "call"]
    first, second = (i for i in entry.instructions if i.opcode == "add")
    (x,) = (i for i in entry.instructions if i.opcode == "parameter")
    assert first.operands == [x, x] and second.operands == [first, first]
    assert entry.root.called_computations[0].name == "kept"  # marked inlineable="false"
    assert sorted(c.name for c in module.computations) == ["kept", "main"]
    before = module.to_bytes()
    assert not InlineCalls().run(module)
    assert module.to_bytes() == before
