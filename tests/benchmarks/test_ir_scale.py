"""The scale benchmark measures a real module: XLA accepts what it generates."""

from __future__ import annotations

from benchmarks.ir_scale import generate_module, measure_load
from disco_xla.hlo.graph import HloModule
from disco_xla.hlo.hlo_io import module_from_text, module_to_text


def test_generated_module_is_valid_hlo_that_xla_prints_and_parses(tmp_path):
    module = HloModule.from_bytes(generate_module(2_000), "generated.pb")
    assert 1_990 <= module.instruction_count <= 2_010
    again = module_from_text(module_to_text(module), "generated.txt")
    assert again.instruction_count == module.instruction_count
    assert again.opcode_histogram() == module.opcode_histogram()


def test_measure_load_reports_what_it_loaded(tmp_path):
    path = tmp_path / "small.pb"
    path.write_bytes(generate_module(500))
    figures = measure_load(str(path))
    module = HloModule.from_bytes(path.read_bytes())
    assert figures["instructions"] == module.instruction_count
    # Every block's tanh carries a transpose(jvp(...)) mark, so each all-reduce
    # reduces a gradient.
    assert figures["gradient_all_reduces"] == module.opcode_histogram()["all-reduce"] > 90
    assert figures["parse_and_build_s"] > 0 and figures["peak_memory_bytes"] > 0
