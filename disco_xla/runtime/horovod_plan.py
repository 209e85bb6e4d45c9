"""Which model variables a disco-xla plan's all-reduce buckets hold, for a
Horovod job (`runtime.horovod`): pure Python, no TensorFlow.

Which variable each plan bucket holds: the plan names gradient all-reduces of the
captured module; each carries `GRADIENT_MARK/<variable name>` (recorded at
capture time by `insert_gradient_all_reduces`) and feeds output `1 + k` of the
step, `k` being the variable's position in the model's trainable variables. The
mapping to a model's variables is by that position, checked by shape, dtype and
the variable's own name (the last part of its path, e.g. `kernel`): Keras 2 (TF
2.12, where Horovod builds) and Keras 3 (TF 2.21, where modules are captured) give
the same model the same variable order but not always the same scope names.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from disco_xla.errors import DiscoInputError
from disco_xla.hlo.gradients import GRADIENT_MARK
from disco_xla.hlo.graph import HloModule, Instruction
from disco_xla.hlo.hlo_io import load_module
from disco_xla.plan import Plan, verify_plan

_VIEWS = frozenset({"reshape", "bitcast", "copy", "transpose", "convert"})
_MEAN_SUFFIX = "/mean"
# XLA element type -> TensorFlow dtype name, for the types gradients come in.
_TF_DTYPES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64"}


@dataclass(frozen=True)
class PlanGradient:
    """One gradient of the captured step, as a plan bucket holds it."""

    index: int  # position among the step's gradients = the model's trainable variables
    name: str  # the variable's name recorded at capture time
    shape: tuple[int, ...]  # as all-reduced: the variable's, or a reshape of it
    dtype: str  # XLA element type, e.g. 'f32'
    all_reduce: str  # the plan's name for its all-reduce

    @property
    def elements(self) -> int:
        return math.prod(self.shape)


def plan_gradient_buckets(
    plan: Plan, module: HloModule, source: str = "<plan>"
) -> list[list[PlanGradient]]:
    """The plan's buckets, in plan order, as the gradients (variables) they hold.

    `module` is the captured step the plan was made for (checked by
    `verify_plan`). Gradient `k` is the one output `1 + k` of the step reads, after
    views, through the all-reduce's mean; the order of outputs is the order of the
    model's trainable variables.
    """
    verify_plan(plan, module, source=source)
    by_all_reduce = _gradients_by_all_reduce(module, source)
    buckets = []
    for bucket in plan.all_reduce_buckets:
        gradients = [g for name in bucket for g in by_all_reduce.get(name, ())]
        missing = [name for name in bucket if name not in by_all_reduce]
        if missing:
            raise DiscoInputError(
                source,
                f"all-reduce {missing[0]!r} feeds no output of the step: no variable to map it to",
            )
        buckets.append(sorted(gradients, key=lambda g: g.index))
    return buckets


def _gradients_by_all_reduce(module: HloModule, source: str) -> dict[str, list[PlanGradient]]:
    """All-reduce name -> the gradients (outputs) it produces, by output position."""
    root = module.entry.root
    if root is None or root.opcode != "tuple":
        raise DiscoInputError(source, "the captured step does not return a tuple")
    found: list[tuple[int, Instruction, str]] = []
    for position, output in enumerate(root.operands):
        value = output
        while value.opcode in _VIEWS and len(value.operands) == 1:
            value = value.operands[0]
        mark = value.op_name
        if not (mark.startswith(GRADIENT_MARK + "/") and mark.endswith(_MEAN_SUFFIX)):
            continue
        all_reduce = value.operands[0]
        name = mark[len(GRADIENT_MARK) + 1 : -len(_MEAN_SUFFIX)]
        found.append((position, all_reduce, name))
    if not found:
        raise DiscoInputError(
            source, "no gradient output of the step carries a disco-xla all-reduce mark"
        )
    by_all_reduce: dict[str, list[PlanGradient]] = {}
    for index, (_, all_reduce, name) in enumerate(sorted(found, key=lambda f: f[0])):
        leaf = all_reduce.shape.leaves()[0]
        by_all_reduce.setdefault(all_reduce.name, []).append(
            PlanGradient(index, name, tuple(leaf.dims), leaf.element_type, all_reduce.name)
        )
    return by_all_reduce


def load_plan_buckets(plan_path: str, module_path: str) -> list[list[PlanGradient]]:
    """`plan_gradient_buckets` for a plan JSON file and the captured module's file."""
    try:
        with open(plan_path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as error:
        raise DiscoInputError(plan_path, f"cannot read the plan ({error.strerror})") from None
    return plan_gradient_buckets(
        Plan.from_json(text, plan_path), load_module(module_path), plan_path
    )


def _variable_name(variable: Any) -> str:
    """Keras 3 variables have a `path` ('dense/kernel'); TF ones a `name` ('dense/kernel:0')."""
    return getattr(variable, "path", None) or variable.name


def _own_name(variable_name: str) -> str:
    """'dense_4/kernel:0' -> 'kernel', 'variable_1' -> 'variable': a variable's name
    without scopes, index or the number Keras appends to make a name unique."""
    own = variable_name.split(":")[0].rsplit("/", 1)[-1].lower()
    stem, _, number = own.rpartition("_")
    return stem if stem and number.isdigit() else own


def match_variables(
    buckets: Sequence[Sequence[PlanGradient]],
    variables: Sequence[Any],
    source: str = "<plan>",
) -> list[list[int]]:
    """Each bucket as positions in `variables` (the model's trainable variables).

    Refuses, with the names that differ, a plan whose gradients are not the
    model's variables one for one: gradient `k` must have as many elements as
    `variables[k]` (the capture may all-reduce a gradient before a reshape, e.g.
    an attention kernel as [32, 32] for a [32, 2, 16] variable), the same dtype,
    and the same own name (the last part of the path, without a Keras
    uniquifying suffix such as `_1`).
    """
    gradients = sorted((g for bucket in buckets for g in bucket), key=lambda g: g.index)
    differ = []
    for position in range(max(len(gradients), len(variables))):
        gradient = gradients[position] if position < len(gradients) else None
        variable = variables[position] if position < len(variables) else None
        if gradient is not None and variable is not None:
            elements = math.prod(int(d) for d in variable.shape)
            dtype = _TF_DTYPES.get(gradient.dtype, gradient.dtype)
            if (
                gradient.index == position
                and gradient.elements == elements
                and dtype == getattr(variable.dtype, "name", str(variable.dtype))
                and _own_name(gradient.name) == _own_name(_variable_name(variable))
            ):
                continue
        plan_side = "none" if gradient is None else f"{gradient.name} {list(gradient.shape)}"
        model_side = (
            "none"
            if variable is None
            else f"{_variable_name(variable)} {[int(d) for d in variable.shape]}"
        )
        differ.append(f"#{position} plan {plan_side} / model {model_side}")
    if differ:
        shown = "; ".join(differ[:4]) + (f"; and {len(differ) - 4} more" if len(differ) > 4 else "")
        raise DiscoInputError(
            source,
            f"the plan's {len(gradients)} gradients do not match the model's "
            f"{len(variables)} variables: {shown}",
        )
    return [[g.index for g in bucket] for bucket in buckets]
