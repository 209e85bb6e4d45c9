"""Run a TensorFlow/Keras training step under Horovod, with Horovod's own tensor
fusion or with a disco-xla plan's all-reduce buckets, and keep whichever runs
fastest (`horovod_trial.MeasuredHorovodStep`).

A step has three parts, run as one `tf.function`:
1. compute, compiled by XLA (`jit_compile=True`): the loss and the gradients;
2. communication through Horovod, averaging over the ranks, one of three ways:
   - Horovod's own fusion (`buckets=None`): one `hvd.allreduce` per gradient, as
     `hvd.DistributedGradientTape` does. Horovod's tensor fusion (the job's
     threshold and cycle time, FUSION_SETTINGS) decides what goes together;
   - grouped buckets: one `hvd.grouped_allreduce` per bucket, of the bucket's
     gradients, created in bucket order. Horovod fuses a group's tensors in its
     fusion buffer, as it fuses its own, and never fuses two buckets together:
     each bucket has its own scale factors (`bucket_scale`), and Horovod fuses
     only responses whose factors are equal. So the plan's buckets are what is
     sent, one all-reduce each, with Horovod's fusion on at the job's setting
     (a bucket larger than the job's threshold is split by Horovod);
   - packed buckets: each bucket flattened and concatenated into one tensor
     inside the compute part (by XLA), and split back in the update.
3. the SGD update `v <- v - learning_rate * mean_gradient`, compiled by XLA.

What the plan's op-fusion groups decide is not applied: TensorFlow's XLA compiles
the compute part with its own fusion, since `tf.function` offers no way to hand it
fusion decisions. Horovod's ops cannot run inside an XLA cluster on the CPU, so
the gradients leave the compute part together, and communication does not
overlap the backward pass here: every gradient reaches Horovod in one cycle.

Horovod reads its fusion settings at `hvd.init()` and cannot change them in a
running job (`set_fusion_environment`). A job therefore runs Horovod's own fusion
at one setting; `fusion_buckets` gives the buckets Horovod's fusion makes at
another threshold from gradients that arrive together, to be sent grouped.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


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


def set_fusion_environment(setting: FusionSetting) -> None:
    """Set Horovod's fusion variables for this process's `hvd.init()`.

    Changing them needs a new job: with 0.28.1 here, `hvd.shutdown()` followed by
    `hvd.init()` in the same processes failed (stale gloo rendezvous addresses,
    and crashes inside `hvd.init()` when re-sending cached tensors)."""
    os.environ.update(setting.environment())


# Buckets whose scale factors differ: Horovod never fuses them together.
_DISTINCT_SCALES = 82


def bucket_scale(index: int) -> float:
    """The factor bucket `index` is multiplied by before its all-reduce (its
    factor after is the inverse): +1, -1, +2, -2, ... +2^40, -2^40, then again.

    Horovod fuses two responses only when their scale factors are equal
    (`Controller::FuseResponses`), so 82 consecutive buckets never fuse; a bucket
    82 places later could, if both fit the fusion buffer together. Scaling by a
    signed power of two and back is exact in binary floating point, so the
    average is bit for bit the unscaled one, for gradients below 2^88 in
    magnitude (3e26; beyond, the scaled value would overflow float32)."""
    step = index % _DISTINCT_SCALES
    return (-1.0 if step % 2 else 1.0) * 2.0 ** (step // 2)


def fusion_buckets(sizes_bytes: Sequence[int], threshold_bytes: int) -> list[list[int]]:
    """The buckets Horovod's tensor fusion makes of gradients that reach it in one
    cycle, in this order: consecutive gradients, as many as fit `threshold_bytes`
    (a gradient larger than it alone). Positions into `sizes_bytes`."""
    buckets: list[list[int]] = []
    filled = 0
    for position, size in enumerate(sizes_bytes):
        if not buckets or filled + size > threshold_bytes:
            buckets.append([])
            filled = 0
        buckets[-1].append(position)
        filled += size
    return buckets


@dataclass(frozen=True)
class Candidate:
    """One way to send the gradients: Horovod's own fusion (`buckets=None`) or
    buckets of variable positions, grouped or `packed`."""

    buckets: tuple[tuple[int, ...], ...] | None = None
    packed: bool = False


class HorovodStep:
    """One data-parallel SGD step under Horovod: `loss = step(inputs, labels)`.

    `loss_fn(inputs, labels)` computes this rank's loss from the model. With
    `buckets` (positions in `variables`, in plan order), one
    `hvd.grouped_allreduce` per bucket, its gradients packed into one tensor
    when `packed`; with `buckets=None`, one `hvd.allreduce` per gradient, left to
    Horovod's fusion. Call `hvd.init()` first; unless `broadcast=False`, the
    variables are broadcast from rank 0 on construction.

    Horovod keys each collective, and its cache of responses, by the op's name;
    the step's collectives are named under `name`, so that two steps with
    different buckets never share a key.
    """

    def __init__(
        self,
        loss_fn: Callable[[Any, Any], Any],
        variables: Sequence[Any],
        buckets: Sequence[Sequence[int]] | None,
        learning_rate: float = 0.01,
        packed: bool = False,
        broadcast: bool = True,
        name: str = "disco",
        gradients: Callable[[Any, Any], Any] | None = None,
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
        if broadcast:
            hvd.broadcast_variables(self.variables, root_rank=0)
        self.packed = packed and self.buckets is not None
        self._tf, self._hvd = tf, hvd
        self._sizes = [int(v.shape.num_elements()) for v in self.variables]
        self._loss_fn, self._learning_rate = loss_fn, learning_rate
        self._name = name
        jit = tf.function(jit_compile=True, autograph=False)
        self.gradients = gradients or jit(self._gradients)
        # Unpacked, the compute part is the gradients: one XLA program, compiled once.
        self._compute = jit(self._compute_fn) if self.packed else self.gradients
        self._pack = jit(self._pack_fn)
        self._unpack = jit(self._unpack_fn)
        self._update = jit(self._update_fn)
        self._apply = jit(self._apply_fn)
        self._communicate = tf.function(self._communicate_fn, autograph=False)
        self._step = tf.function(self._step_fn, autograph=False)

    def _gradients(self, inputs, labels):
        """(loss, gradients): this rank's, before any communication."""
        with self._tf.GradientTape() as tape:
            loss = self._loss_fn(inputs, labels)
        gradients = tape.gradient(loss, self.variables)
        return loss, [self._tf.convert_to_tensor(g) for g in gradients]

    def _pack_fn(self, gradients):
        if not self.packed:
            return list(gradients)
        tf = self._tf
        return [
            tf.concat([tf.reshape(gradients[i], [-1]) for i in bucket], axis=0)
            for bucket in self.buckets
        ]

    def _unpack_fn(self, reduced):
        if not self.packed:
            return list(reduced)
        tf = self._tf
        gradients = [None] * len(self.variables)
        for bucket, packed in zip(self.buckets, reduced, strict=True):
            parts = tf.split(packed, [self._sizes[i] for i in bucket])
            for i, part in zip(bucket, parts, strict=True):
                gradients[i] = tf.reshape(part, self.variables[i].shape)
        return gradients

    def _compute_fn(self, inputs, labels):
        loss, gradients = self._gradients(inputs, labels)
        return loss, self._pack_fn(gradients)

    def _communicate_fn(self, tensors):
        """Average `tensors` (the gradients, or the packed buckets) over the ranks."""
        with self._tf.name_scope(self._name):
            return self._communicate_named(tensors)

    def _communicate_named(self, tensors):
        hvd = self._hvd
        if self.buckets is None:
            return [hvd.allreduce(t, op=hvd.Average) for t in tensors]
        groups = [[k] for k in range(len(self.buckets))] if self.packed else self.buckets
        reduced = [None] * len(tensors)
        for index, group in enumerate(groups):  # bucket order
            scale = bucket_scale(index)
            outputs = hvd.grouped_allreduce(
                [tensors[i] for i in group],
                op=hvd.Average,
                prescale_factor=scale,
                postscale_factor=1.0 / scale,
            )
            for i, output in zip(group, outputs, strict=True):
                reduced[i] = output
        return reduced

    def _apply_fn(self, gradients):
        for variable, gradient in zip(self.variables, gradients, strict=True):
            variable.assign_sub(self._learning_rate * gradient)

    def _update_fn(self, reduced):
        self._apply_fn(self._unpack_fn(reduced))

    def _step_fn(self, inputs, labels):
        loss, tensors = self._compute(inputs, labels)
        self._update(self._communicate(tensors))
        return loss

    def reduce_gradients(self, gradients: Sequence[Any]) -> list[Any]:
        """`gradients` (in the variables' shapes) averaged over the ranks this
        step's way, without updating anything: to check it against another."""
        return list(self._unpack(self._communicate(self._pack(list(gradients)))))

    def apply(self, reduced: Sequence[Any]) -> None:
        """The update with gradients already averaged (`reduce_gradients`)."""
        self._apply(list(reduced))

    def __call__(self, inputs, labels):
        return self._step(inputs, labels)
