"""Settings are declared once (`settings.OptimizeSettings`, each field's
`Setting`): the env hook's flags and `disco-xla optimize`'s options are made
from the declarations, and the keyword arguments of `disco_xla.jit`,
`disco_xla.tf_function` and `disco_xla.optimize` match them, name and default."""

from __future__ import annotations

import inspect

import pytest

import disco_xla
from disco_xla.frontends.env_hook import parse_flags
from disco_xla.settings import DEFAULTS, WRAPPED_STEP_DEFAULTS, settings_declared
from tests.conftest import run_cli


def _keywords(function) -> dict[str, object]:
    parameters = inspect.signature(function).parameters.values()
    return {p.name: p.default for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}


# tf_function measures its candidates in the first call: it has no background.
@pytest.mark.parametrize(
    ("name", "left_out"), [("jit", ()), ("tf_function", ("background", "start_after"))]
)
def test_the_wrappers_take_every_setting_with_the_wrapped_steps_default(name, left_out):
    expected = {
        n: getattr(WRAPPED_STEP_DEFAULTS, n) for n in settings_declared() if n not in left_out
    }
    assert _keywords(getattr(disco_xla, name)) == expected


def test_optimize_takes_the_settings_that_decide_the_plan():
    parameters = inspect.signature(disco_xla.optimize).parameters
    deciding = {n for n, s in settings_declared().items() if s.decides_plan}
    assert deciding | {"cluster"} <= set(parameters)
    for name in deciding:
        assert parameters[name].default == getattr(DEFAULTS, name)


def test_the_hook_has_a_flag_for_every_setting_and_reads_each_one():
    declared = settings_declared()
    assert all(setting.hook_flag for setting in declared.values())
    assert parse_flags("").settings() == WRAPPED_STEP_DEFAULTS
    flags = parse_flags("--disco_budget_s=7 --disco_alpha=1.2 --nodisco_background --disco_seed=3")
    assert (flags.budget_s, flags.alpha, flags.background, flags.seed) == (7.0, 1.2, False, 3)
    for setting in declared.values():
        if setting.positive:
            with pytest.raises(ValueError, match=f"--{setting.hook_flag} must be positive"):
                parse_flags(f"--{setting.hook_flag}=0")


def test_optimize_offers_the_declared_options_with_their_defaults():
    result = run_cli("optimize", "--help")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    for name, setting in settings_declared().items():
        if setting.cli_option:
            assert setting.cli_option in text
            assert f"(default {getattr(DEFAULTS, name):g})" in text
    refused = run_cli(
        "optimize", "x.hlo.pb", "--cluster", "cpu-local", "-o", "p.json", "--budget-s", "0"
    )
    assert refused.returncode == 2
    assert "--budget-s must be positive" in refused.stderr
