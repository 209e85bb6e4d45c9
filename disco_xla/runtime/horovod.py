"""Run a TensorFlow/Keras training step under Horovod with a disco-xla plan's
all-reduce buckets, and with Horovod's own tensor fusion off.

The step has three parts, run as one `tf.function` per step:
1. compute, compiled by XLA (`jit_compile=True`): loss and gradients, and for a
   plan, each bucket's gradients flattened and concatenated, in bucket order,
   into one contiguous tensor (XLA fuses the packing into the backward pass);
2. communication: one `hvd.grouped_allreduce` call per bucket, created in plan
   order, averaging over the ranks. Each call carries exactly one tensor (the
   packed bucket), so with `HOROVOD_FUSION_THRESHOLD=0` Horovod neither fuses
   buckets together nor splits one: one all-reduce per bucket per step;
3. the SGD update `v <- v - learning_rate * mean_gradient`, compiled by XLA, which
   unpacks each reduced bucket back into the variables' shapes.

Without a plan (`buckets=None`), each gradient is all-reduced by its own
`hvd.allreduce`, as `hvd.DistributedGradientTape` does, and Horovod's tensor fusion
(threshold and cycle time from the environment, see FUSION_SETTINGS) decides what
goes together: that is the baseline a plan is compared with.

What the plan's op-fusion groups decide is not applied: TensorFlow's XLA compiles
the compute part with its own fusion, since `tf.function` offers no way to hand it
fusion decisions. Because Horovod ops cannot run inside an XLA cluster on the CPU,
the gradients leave the compute part together, so communication does not overlap
the backward pass here.

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
import os
from collections.abc import Callable, Sequence
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
class FusionSetting:
    """Horovod's tensor fusion: a buffer of `threshold_bytes` (0 = off), filled for
    `cycle_time_ms` before each round of all-reduces."""

    threshold_bytes: int
    cycle_time_ms: float

    def environment(self) -> dict[str, str]:
        return {
            "HOROVOD_FUSION_THRESHOLD": str(self.threshold_bytes),
            "HOROVOD_CYCLE_TIME": f"{self.cycle_time_ms:g}",
        }


FUSION_SETTINGS = {
    "default": FusionSetting(128 * 1024 * 1024, 1.0),  # Horovod >= 0.21
    "legacy": FusionSetting(64 * 1024 * 1024, 5.0),  # Horovod < 0.21
    "none": FusionSetting(0, 1.0),
}
# A plan's buckets are sent as they are: Horovod's fusion is off.
PLAN_FUSION = FUSION_SETTINGS["none"]


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


def set_fusion_environment(setting: FusionSetting) -> None:
    """Set Horovod's fusion variables for this process's `hvd.init()`.

    Changing them needs a new job: with 0.28.1 here, `hvd.shutdown()` followed by
    `hvd.init()` in the same processes failed (stale gloo rendezvous addresses,
    and crashes inside `hvd.init()` when re-sending cached tensors)."""
    os.environ.update(setting.environment())


class HorovodStep:
    """One data-parallel SGD step under Horovod: `loss = step(inputs, labels)`.

    `loss_fn(inputs, labels)` computes this rank's loss from the model. With
    `buckets` (positions in `variables`, in plan order), the gradients are packed
    and sent one `hvd.grouped_allreduce` per bucket; with `buckets=None`, one
    `hvd.allreduce` per gradient, left to Horovod's fusion. Call `hvd.init()`
    first; the variables are broadcast from rank 0 on construction.
    """

    def __init__(
        self,
        loss_fn: Callable[[Any, Any], Any],
        variables: Sequence[Any],
        buckets: Sequence[Sequence[int]] | None,
        learning_rate: float = 0.01,
    ):
        # Optional dependencies, imported where used: Horovod and its TensorFlow.
        import horovod.tensorflow as hvd
        import tensorflow as tf

        self.variables = list(variables)
        self.buckets = None if buckets is None else [list(b) for b in buckets]
        if self.buckets is not None:
            placed = sorted(i for bucket in self.buckets for i in bucket)
            if placed != list(range(len(self.variables))):
                raise ValueError("the buckets must hold every variable exactly once")
        hvd.broadcast_variables(self.variables, root_rank=0)
        sizes = [int(v.shape.num_elements()) for v in self.variables]
        variables_ = self.variables
        buckets_ = self.buckets

        @tf.function(jit_compile=True, autograph=False)
        def compute(inputs, labels):
            with tf.GradientTape() as tape:
                loss = loss_fn(inputs, labels)
            gradients = [tf.convert_to_tensor(g) for g in tape.gradient(loss, variables_)]
            if buckets_ is None:
                return loss, gradients
            packed = [
                tf.concat([tf.reshape(gradients[i], [-1]) for i in bucket], axis=0)
                for bucket in buckets_
            ]
            return loss, packed

        @tf.function(jit_compile=True, autograph=False)
        def update(reduced):
            if buckets_ is None:
                gradients = list(reduced)
            else:
                gradients = [None] * len(variables_)
                for bucket, packed in zip(buckets_, reduced, strict=True):
                    parts = tf.split(packed, [sizes[i] for i in bucket])
                    for i, part in zip(bucket, parts, strict=True):
                        gradients[i] = tf.reshape(part, variables_[i].shape)
            for variable, gradient in zip(variables_, gradients, strict=True):
                variable.assign_sub(learning_rate * gradient)

        @tf.function(autograph=False)
        def step(inputs, labels):
            loss, tensors = compute(inputs, labels)
            if buckets_ is None:
                reduced = [hvd.allreduce(t, op=hvd.Average) for t in tensors]
            else:
                reduced = []
                for packed in tensors:  # plan order
                    reduced.extend(hvd.grouped_allreduce([packed], op=hvd.Average))
            update(reduced)
            return loss

        self._step = step

    def __call__(self, inputs, labels):
        return self._step(inputs, labels)
