"""`benchmarks/hook_startup.py`: `python -c pass` timed with and without the hook's
.pth file in one venv, the file put back, and the modules it imports at start-up
named."""

from __future__ import annotations

from benchmarks.hook_startup import HOOK_NAME, REPO_ROOT, fresh_venv, site_packages, time_hook


def test_the_hook_is_timed_on_both_sides_and_left_in_place(tmp_path):
    python = fresh_venv(tmp_path / "venv", REPO_ROOT / HOOK_NAME)
    hook = site_packages(python) / HOOK_NAME
    result = time_hook(python, hook, pairs=4)
    assert hook.read_bytes() == (REPO_ROOT / HOOK_NAME).read_bytes()
    assert not hook.with_name(HOOK_NAME + ".off").exists()
    for side in ("with_hook", "without_hook"):
        spread = result[side]
        assert 0 < spread["p25_ms"] <= spread["median_ms"] <= spread["p75_ms"]
    # With DISCO_XLA_FLAGS unset, the hook's line imports nothing.
    assert result["extra_modules_with_hook"] == []


def test_a_hook_that_imports_at_start_up_is_named(tmp_path):
    costly = tmp_path / HOOK_NAME
    costly.write_text("import colorsys\n")
    python = fresh_venv(tmp_path / "venv", costly)
    result = time_hook(python, site_packages(python) / HOOK_NAME, pairs=2)
    assert result["extra_modules_with_hook"] == ["colorsys"]
