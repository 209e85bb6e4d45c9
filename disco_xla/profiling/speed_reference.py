"""The machine's speed when a profile is taken, so that collections line up.

This machine's speed drifts by model and by minute. Between two collections of
the same kernels, a model's median kernel ran 0.62-0.97x as long, and the
ratio differed from model to model (benchmarks/BENCHMARKS.md). A cost model
trained on such data learns each model's speed at the moment it was profiled,
as if it were a property of its kernels.

So the profiler times a fixed workload just before and just after each plan's
traced runs. This is the speed reference: a few matrix products (compute), one
fused elementwise loop over 4 MB (memory) and a reduction, on the platform's
first device. Each sample keeps that time as `reference_s`.
`speed_normalised` rescales every sample to one nominal speed:
time x nominal / reference_s.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np

from disco_xla.costmodel.dataset import KernelDataset
from disco_xla.errors import DiscoInputError
from disco_xla.timing import median_seconds

REFERENCE_RUNS = 15  # timed runs of the workload; their median is one reference


@functools.cache
def _reference_workload(platform: str) -> Callable[[], object]:
    """The workload, compiled once per platform, its inputs already on the device."""
    device = jax.devices(platform)[0]

    def work(matrix, vector):
        for _ in range(4):
            matrix = jnp.tanh(matrix @ matrix)
        for _ in range(6):
            vector = jnp.sin(vector) * 0.999 + 0.25
        return matrix, vector, jnp.sum(vector)

    matrix = jax.device_put(np.full((256, 256), 1.0 / 256, np.float32), device)
    vector = jax.device_put(np.linspace(0.0, 1.0, 1 << 20, dtype=np.float32), device)
    step = jax.jit(work)
    return lambda: jax.block_until_ready(step(matrix, vector))


def reference_seconds(platform: str = "cpu", runs: int = REFERENCE_RUNS) -> float:
    """The median wall time of one run of the reference workload on `platform`."""
    return median_seconds(_reference_workload(platform), runs, warmup=1)


def speed_normalised(
    dataset: KernelDataset, nominal_s: float | None = None, source: str = "data set"
) -> KernelDataset:
    """`dataset` with each sample's time rescaled to a machine whose reference
    takes `nominal_s` (default: the median over the data set's samples).
    DiscoInputError where a sample has no reference: it was collected before
    the profiler took one."""
    references = np.asarray(dataset.reference_s, np.float64)
    if not len(references):
        return dataset
    present = np.isfinite(references) & (references > 0)
    if not np.all(present):
        missing = int(np.sum(~present))
        raise DiscoInputError(
            source,
            f"{missing} of {len(references)} samples have no speed reference "
            "(collected before `disco-xla profile` took one); profile them again",
        )
    nominal = float(np.median(references)) if nominal_s is None else float(nominal_s)
    return replace(dataset, time_s=dataset.time_s * (nominal / references))
