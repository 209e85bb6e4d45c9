"""Parsing with our run-time schema and re-serialising loses nothing."""

from __future__ import annotations

import pytest

from disco_xla.hlo.graph import HloModule
from tests.conftest import assert_round_trip_is_lossless

CAPTURES = ["jax_pmap_step", "jax_shard_map_step", "jax_conv_dot_sort", "tf_train_step"]


@pytest.mark.parametrize("name", CAPTURES)
def test_round_trip_gives_same_hlo_text_and_stablehlo(captured, name):
    assert_round_trip_is_lossless(captured[name][0])


def test_unknown_fields_survive_at_module_and_instruction_level(captured):
    raw = captured["jax_pmap_step"][0]
    # Field 1000, varint 42: a field no version of XLA defines.
    unknown_field = bytes([0xC0, 0x3E, 42])
    module = HloModule.from_bytes(raw + unknown_field, "with-unknown")
    instruction = module.entry.instructions[0].proto
    instruction.MergeFromString(unknown_field)
    out = module.to_bytes()
    assert out.count(unknown_field) == 2
    assert HloModule.from_bytes(out, "again").to_bytes() == out


def test_serialization_is_deterministic(captured):
    raw = captured["jax_pmap_step"][0]
    first = HloModule.from_bytes(raw, "a")
    second = HloModule.from_bytes(raw, "b")
    assert first.to_bytes() == second.to_bytes()
    assert first.fingerprint == second.fingerprint
