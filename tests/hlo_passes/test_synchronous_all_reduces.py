"""The synchronous-all-reduces and drop-schedule passes, on a module as XLA:GPU
writes it after its optimizations (scheduled, all-reduces as start/done pairs):
the pairs become all-reduces that keep the gradients' names, the schedule goes,
and the rewritten module computes what the original does."""

from __future__ import annotations

from pathlib import Path

import pytest

from disco_xla.hlo.graph import HloModule
from disco_xla.hlo.hlo_io import load_module
from disco_xla.hlo_passes.drop_schedule import DropSchedule
from disco_xla.hlo_passes.synchronous_all_reduces import SynchronousAllReduces
from disco_xla.runtime.candidate_timing import verify_rewrite
from disco_xla.runtime.xla_runner import devices_needed

SCHEDULED = Path(__file__).parents[1] / "data" / "hlo_corpus" / "async_collectives.hlo.txt"


@pytest.fixture(scope="module")
def scheduled() -> HloModule:
    return load_module(SCHEDULED)


def test_each_pair_becomes_one_all_reduce_under_the_start_name(scheduled):
    starts = [i.name for i in scheduled.instructions() if i.opcode == "all-reduce-start"]
    gradients = [a.name for a in scheduled.gradient_all_reduces]
    assert starts and set(gradients) <= set(starts)
    module = HloModule.from_bytes(scheduled.to_bytes(), scheduled.source)
    assert SynchronousAllReduces().run(module)
    opcodes = {i.name: i.opcode for i in module.instructions()}
    assert all(opcodes[name] == "all-reduce" for name in starts)
    assert "all-reduce-done" not in opcodes.values()
    assert [a.name for a in module.gradient_all_reduces] == gradients
    assert not SynchronousAllReduces().run(module)  # nothing left to do


def test_the_schedule_goes_and_the_module_computes_the_same(scheduled):
    assert scheduled.proto.schedule, "the test needs a scheduled module"
    module = HloModule.from_bytes(scheduled.to_bytes(), scheduled.source)
    assert DropSchedule().run(module) and not module.proto.schedule
    assert not DropSchedule().run(module)
    assert SynchronousAllReduces().run(module)
    verified = verify_rewrite(scheduled, module, devices_needed(scheduled), rounds=1)
    assert verified.equal
