"""Loading and saving every supported format, dump directories and bad files."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import textwrap

import pytest

from disco_xla import DiscoInputError, load_module, save_module
from disco_xla.hlo.hlo_io import module_from_text, module_to_text
from disco_xla.hlo.summary import summarize

COMPARED = ["computations", "instructions", "all_reduces", "gradient_all_reduces", "flops"]


@pytest.mark.parametrize("suffix", [".pb", ".hlo.pb", ".txt", ".hlo", ".pb.gz", ".txt.gz"])
def test_every_format_loads_to_the_same_module(module_files, tmp_path, suffix):
    original = load_module(module_files["jax_pmap_step"])
    path = tmp_path / f"step{suffix}"
    save_module(original, path)
    loaded = load_module(path)
    assert loaded.file_format == ("txt" if ".txt" in suffix or ".hlo" == suffix else "pb") + (
        ".gz" if suffix.endswith(".gz") else ""
    )
    expected, got = summarize(original), summarize(loaded)
    assert {k: got[k] for k in COMPARED} == {k: expected[k] for k in COMPARED}


def test_text_keeps_the_backward_marks_that_find_gradients(module_files, tmp_path):
    module = load_module(module_files["jax_pmap_step"])
    text = module_to_text(module)
    assert "transpose(jvp" in text
    again = module_from_text(text)
    assert len(again.gradient_all_reduces) == 4

    # XLA renumbers its stack-frame tables when printing, so compare what they
    # describe: the same instructions with the same framework names.
    def names(m):
        return sorted((i.name, i.opcode, i.op_name) for i in m.instructions())

    assert names(again) == names(module)


def test_gzip_output_is_reproducible(module_files, tmp_path):
    module = load_module(module_files["jax_pmap_step"])
    save_module(module, tmp_path / "a.pb.gz")
    save_module(module, tmp_path / "b.pb.gz")
    assert (tmp_path / "a.pb.gz").read_bytes() == (tmp_path / "b.pb.gz").read_bytes()
    assert gzip.decompress((tmp_path / "a.pb.gz").read_bytes()) == module.to_bytes()


DUMP_SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp
    jax.config.update("jax_num_cpu_devices", 2)
    def step(w, x):
        g = jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)
        return w - 0.1 * jax.lax.pmean(g, "d")
    jax.pmap(step, axis_name="d")(jnp.ones((2, 8, 4)), jnp.ones((2, 3, 8)))
    jax.jit(lambda a: a + 1)(jnp.ones(3))
    """
)


@pytest.fixture(scope="module")
def dump_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("xla_dump")
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_dump_to={directory} --xla_dump_hlo_as_proto --xla_dump_hlo_as_text"
    subprocess.run([sys.executable, "-c", DUMP_SCRIPT], env=env, check=True, timeout=300)
    return directory


def test_dump_directory_gives_the_largest_before_optimizations_module(dump_dir):
    module = load_module(dump_dir)
    assert "before_optimizations" in module.source
    assert module.source.endswith(".pb")  # the binary proto is preferred over the text
    assert len(module.gradient_all_reduces) == 1


def test_dump_directory_module_can_be_named(dump_dir):
    named = [n for n in os.listdir(dump_dir) if "jit__lambda" in n and "before_opt" in n]
    assert named, sorted(os.listdir(dump_dir))
    module = load_module(dump_dir, module_name="jit__lambda")
    assert "jit__lambda" in module.source
    assert module.all_reduces == []
    with pytest.raises(DiscoInputError, match="no module file whose name contains 'nonexistent'"):
        load_module(dump_dir, module_name="nonexistent")


def test_a_directory_without_modules_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(DiscoInputError, match="before_optimizations"):
        load_module(tmp_path)


@pytest.mark.parametrize(
    ("content", "name", "problem"),
    [
        (b"", "empty.pb", "empty"),
        (b"\x1f\x8b\x08\x00garbage", "broken.pb.gz", "corrupt gzip"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00", "picture.pb", "HloModuleProto"),
        (b'{"not": "hlo"}', "data.json", "not an HLO module"),
        (
            b"HloModule broken\n\nENTRY main {\n  ROOT x = f32[] add(",
            "broken.txt",
            "does not parse",
        ),
        (b"just some words\n", "notes.txt", "does not begin with 'HloModule'"),
    ],
)
def test_bad_files_raise_one_line_errors_naming_the_file(tmp_path, content, name, problem):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DiscoInputError) as raised:
        load_module(path)
    assert str(path) in str(raised.value)
    assert problem in str(raised.value)
    assert "\n" not in str(raised.value)


def test_truncated_proto_is_refused(module_files, tmp_path):
    data = open(module_files["jax_pmap_step"], "rb").read()
    path = tmp_path / "truncated.pb"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DiscoInputError, match="truncated.pb"):
        load_module(path)


def test_text_that_aborts_xla_parser_is_an_error_not_a_crash(tmp_path):
    # XLA's parser CHECK-fails (aborts the process) on a reshape that changes the
    # element count; the isolated worker turns that into an input error.
    path = tmp_path / "bad_reshape.txt"
    path.write_text(
        "HloModule m\n\nENTRY main {\n  p = f32[5,4] parameter(0)\n"
        "  ROOT r = f32[3,4] reshape(p)\n}\n"
    )
    with pytest.raises(DiscoInputError, match="bad_reshape.txt"):
        load_module(path)
    # And the next parse works again.
    ok = tmp_path / "ok.txt"
    ok.write_text("HloModule m\n\nENTRY main {\n  ROOT p = f32[5,4] parameter(0)\n}\n")
    assert load_module(ok).instruction_count == 1


def test_missing_file_and_unknown_output_extension_are_refused(module_files, tmp_path):
    with pytest.raises(DiscoInputError, match="no such file"):
        load_module(tmp_path / "absent.pb")
    module = load_module(module_files["tf_train_step"])
    with pytest.raises(DiscoInputError, match="unknown output format"):
        save_module(module, tmp_path / "out.json")


def test_after_optimizations_dump_with_buffer_assignment_loads(dump_dir):
    # The largest compiled module is the pmap'd step; its HloProto wrapper also
    # carries the buffer assignment.
    name = max(
        (n for n in os.listdir(dump_dir) if n.endswith("cpu_after_optimizations.hlo.pb")),
        key=lambda n: os.path.getsize(dump_dir / n),
    )
    module = load_module(dump_dir / name)
    assert any(i.opcode == "fusion" for i in module.instructions())
    assert module.total_flops > 0
