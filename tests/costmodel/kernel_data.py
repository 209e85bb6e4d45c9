"""The measured kernels the cost-model tests learn from, shared with the tests of
the `train-cost-model` and `eval-cost-model` commands."""

from __future__ import annotations

from disco_xla.costmodel.dataset import KernelSample, from_samples, save_dataset
from disco_xla.hlo.graph import HloModule
from disco_xla.profiling.sample_plans import measure_plan, measure_xla_compiled, sample_plans


def demo_step(captured) -> HloModule:
    """The demo's pmap training step, as captured."""
    return HloModule.from_bytes(captured["jax_pmap_step"][0])


def measured_samples(step_module: HloModule) -> list[KernelSample]:
    """`step_module`'s kernels under XLA's compile and three sampled plans,
    measured twice each."""
    samples = measure_xla_compiled(step_module, "demo.tiny", "demo", repeats=2)
    for kind, plan in sample_plans(step_module, 3, seed=0):
        samples += measure_plan(step_module, plan, kind, "demo.tiny", "demo", repeats=2)
    return samples


def write_demo_dataset(captured, path: str) -> str:
    """The demo step's `measured_samples` as a data set file at `path`."""
    save_dataset(from_samples(measured_samples(demo_step(captured))), path)
    return path
