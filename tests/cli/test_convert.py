"""`disco-xla convert` as a user runs it: between formats, and to a format it does not know."""

from __future__ import annotations

import json

from tests.conftest import run_cli


def test_convert_between_formats_keeps_the_module(module_files, tmp_path):
    text = tmp_path / "step.txt"
    packed = tmp_path / "step.pb.gz"
    assert run_cli("convert", module_files["jax_pmap_step"], str(text)).returncode == 0
    assert text.read_text().startswith("HloModule")
    assert run_cli("convert", str(text), str(packed)).returncode == 0
    summaries = [
        json.loads(run_cli("inspect", str(path), "--json").stdout)
        for path in (module_files["jax_pmap_step"], text, packed)
    ]
    assert [s["format"] for s in summaries] == ["pb", "txt", "pb.gz"]
    for key in ("instructions", "computations", "all_reduces", "gradient_all_reduces", "flops"):
        assert len({s[key] for s in summaries}) == 1, key


def test_convert_to_an_unknown_format_exits_2(module_files, tmp_path):
    result = run_cli("convert", module_files["tf_train_step"], str(tmp_path / "out.json"))
    assert result.returncode == 2
    assert "unknown output format" in result.stderr and len(result.stderr.splitlines()) == 1
