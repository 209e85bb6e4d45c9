"""1,000 mutated protos and texts through `disco-xla inspect`: no crash, no hang,
no traceback; each result is either a summary or one line naming the file."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

from disco_xla import load_module
from disco_xla.hlo.hlo_io import module_to_text
from tests.fuzz_inputs import mutate_bytes, mutate_structure, mutate_text

CASES_PER_KIND = 500


def test_mutated_protos_and_texts_never_crash_or_hang_inspect(module_files, tmp_path):
    rng = random.Random(20221209)
    sources = [module_files[name] for name in ("jax_pmap_step", "tf_train_step")]
    protos = [open(path, "rb").read() for path in sources]
    texts = [module_to_text(load_module(path)) for path in sources]
    paths = []
    for index in range(CASES_PER_KIND):
        path = tmp_path / f"proto_{index}.pb"
        mutate = mutate_structure if index % 2 else mutate_bytes
        path.write_bytes(mutate(protos[index % len(protos)], rng))
        paths.append(str(path))
        path = tmp_path / f"text_{index}.txt"
        path.write_text(mutate_text(texts[index % len(texts)], rng))
        paths.append(str(path))
    listing = tmp_path / "cases.list"
    listing.write_text("\n".join(paths))

    # A separate process under a deadline: a crash or a hang fails the test.
    completed = subprocess.run(
        [sys.executable, "-m", "tests.fuzz_inputs", str(listing)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    results = json.loads(completed.stdout)
    assert len(results) == 2 * CASES_PER_KIND
    for result in results:
        assert result["code"] in (0, 2), result
        if result["code"] == 2:
            lines = result["stderr"].splitlines()
            assert len(lines) == 1 and result["path"] in lines[0], result
            assert lines[0].startswith("disco-xla: error: ")
        else:
            assert result["stderr"] == "", result
    refused = sum(r["code"] == 2 for r in results)
    assert 0 < refused < len(results)  # the mutations do break modules, not all of them
