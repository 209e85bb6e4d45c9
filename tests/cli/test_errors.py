"""Bad input to the `disco-xla` commands: one line naming the file and the
problem, exit code 2, and the traceback only with --verbose."""

from __future__ import annotations

import pytest

from tests.conftest import run_cli

BAD_INPUTS = {
    "truncated.pb": None,  # filled from a real module below
    "empty.pb": b"",
    "wrong_type.pb": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10",
    "notes.md": b"# a markdown file\n\nnot a module\n",
    "bad.txt": b"HloModule m\n\nENTRY main {\n  ROOT p = f32[2] parameter(0\n}\n",
    "aborts_xla.hlo": b"HloModule m\n\nENTRY main {\n  p = f32[5,4] parameter(0)\n"
    b"  ROOT r = f32[3,4] reshape(p)\n}\n",
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS) + ["missing.pb"])
def test_bad_input_gives_one_line_naming_the_file_and_exit_2(module_files, tmp_path, name):
    path = tmp_path / name
    if name == "truncated.pb":
        data = open(module_files["jax_pmap_step"], "rb").read()
        path.write_bytes(data[: len(data) * 2 // 3])
    elif name != "missing.pb":
        path.write_bytes(BAD_INPUTS[name])
    result = run_cli("inspect", str(path))
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("disco-xla: error: ") and str(path) in lines[0]
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_verbose_shows_the_traceback(tmp_path):
    path = tmp_path / "empty.pb"
    path.write_bytes(b"")
    result = run_cli("inspect", str(path), "--verbose")
    assert result.returncode == 2
    assert "Traceback" in result.stderr and "the file is empty" in result.stderr


@pytest.mark.parametrize(
    "cluster, problem",
    [("auto", "read from the devices"), ("cpu-local@2x4", "measured at 2 workers")],
)
def test_a_cluster_the_command_cannot_price_with_gives_one_line_and_exit_2(
    tmp_path, cluster, problem
):
    # An HLO file names no devices: `auto` is for the entry points that run a step.
    path = tmp_path / "negate.hlo"
    path.write_text(
        "HloModule m\n\nENTRY main {\n  p = f32[4] parameter(0)\n  ROOT n = f32[4] negate(p)\n}\n"
    )
    result = run_cli("optimize", str(path), "--cluster", cluster, "-o", str(tmp_path / "p.json"))
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"disco-xla: error: {cluster}: ") and problem in line
    assert "Traceback" not in result.stderr
