"""The profile `disco-xla calibrate` writes: the ring model fitted to the
measured all-reduce times (`fit_ring_model`: T(S) = 2(p-1)·alpha + 2(p-1)/p ·
S/B is linear in (alpha, 1/B), so least squares gives both), and the
`cpu-threads` profile of this machine with its calibration recorded
(`cpu_profile`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from disco_xla.profiling.calibrate import StepCosts


@dataclass(frozen=True)
class Fit:
    alpha_s: float
    bandwidth_bytes_per_s: float
    points: list[dict]  # bytes, measured_s, fitted_s, relative_residual

    @property
    def max_relative_residual(self) -> float:
        return max(abs(p["relative_residual"]) for p in self.points)


def fit_ring_model(measured: list[tuple[int, float]], workers: int) -> Fit:
    """Least squares of T = 2(p-1)·alpha + 2(p-1)/p·S·(1/B), weighted so that each
    point counts by its relative error (small messages matter as much as large)."""
    steps = 2 * (workers - 1)
    sizes = np.array([s for s, _ in measured], float)
    times = np.array([t for _, t in measured], float)
    design = np.stack([np.full_like(sizes, steps), steps / workers * sizes], axis=1)
    weights = 1.0 / times
    (alpha, inverse_bandwidth), *_ = np.linalg.lstsq(
        design * weights[:, None], times * weights, rcond=None
    )
    alpha = max(float(alpha), 0.0)
    inverse_bandwidth = max(float(inverse_bandwidth), 1e-15)
    fitted = design @ np.array([alpha, inverse_bandwidth])
    points = [
        {
            "bytes": int(s),
            "measured_s": float(t),
            "fitted_s": float(f),
            "relative_residual": float((f - t) / t),
        }
        for s, t, f in zip(sizes, times, fitted, strict=True)
    ]
    return Fit(alpha, 1.0 / inverse_bandwidth, points)


def cpu_profile(
    fit: Fit,
    workers: int,
    runtime: str,
    flops: float,
    bandwidth: float,
    tuple_element_s: float = 0.0,
    step: StepCosts | None = None,
    psum_steps: list[tuple[int, float]] | None = None,
    collectives: dict[str, list[tuple[int, float]]] | None = None,
    collective_steps: dict[str, list[tuple[int, float]]] | None = None,
) -> dict:
    """The `cpu-threads` profile of this machine as a plain mapping for YAML.
    `psum_steps`: the measured times the fitted points were made from (recorded);
    `collectives`: the other collectives' in-step points, which the communication
    model reads, and `collective_steps` the step times they were made from."""
    return {
        "name": "cpu-local",
        "description": (
            f"this machine, calibrated by `disco-xla calibrate` ({runtime}, {workers} workers)"
        ),
        "execution": "cpu-threads",
        # The workers share this machine's cores: in one process all devices run
        # their kernels on one thread pool of a thread per core, and processes
        # compete for the same cores.
        "compute_threads": max(1, (os.cpu_count() or 1) // workers),
        **host_machine(fit, workers, flops, bandwidth),
        "tuple_all_reduce_element_s": float(tuple_element_s),
        **_step_cost_fields(step),
        "calibration": _calibration_section(
            fit, runtime, step, psum_steps, collectives, collective_steps
        ),
    }


def host_machine(fit: Fit, workers: int, flops: float, bandwidth: float) -> dict:
    """A one-node profile's device, topology, links (the ring fit's) and
    all-reduce algorithm, for `workers` workers on this machine's CPUs."""
    link = {"bandwidth_bytes_per_s": fit.bandwidth_bytes_per_s, "latency_s": fit.alpha_s}
    return {
        "device": {
            "name": "host CPU",
            "peak_flops": {"f32": float(flops)},
            "memory_bandwidth_bytes_per_s": float(bandwidth),
            "kernel_launch_s": 2.0e-6,
        },
        "topology": {"devices_per_node": workers, "nodes": 1},
        "links": {"intra_node": dict(link), "inter_node": dict(link)},
        "all_reduce": "ring",
    }


def _step_cost_fields(step: StepCosts | None) -> dict:
    """The profile's step costs (`StepCosts`); none where none were measured."""
    if step is None:
        return {}
    return {
        "step_overhead_s": float(step.step_overhead_s),
        "step_buffer_s": float(step.step_buffer_s),
        "kernel_time_scale": float(step.kernel_time_scale),
        "worker_lag": float(step.worker_lag),
    }


def _calibration_section(
    fit: Fit, runtime: str, step: StepCosts | None, psum_steps, collectives, collective_steps
) -> dict:
    """The profile's `calibration`: the runtime, what was measured and the fit
    (the arguments as `cpu_profile`'s), recorded with the profile."""
    section: dict = {"runtime": runtime}
    if step is not None:
        section["empty_step_s"] = float(step.empty_step_s)
        section["all_reduce_in_step_s"] = step.all_reduce_in_step_s
        section["collective_in_step_s"] = dict(step.collective_in_step_s)
    if psum_steps:
        section["psum_step_s"] = [[int(b), float(t)] for b, t in psum_steps]
    section["max_relative_residual"] = fit.max_relative_residual
    section["points"] = fit.points
    if collectives:
        section["collective_points"] = _pairs_by_kind(collectives)
    if collective_steps:
        section["collective_step_s"] = _pairs_by_kind(collective_steps)
    return section


def _pairs_by_kind(points: dict[str, list[tuple[int, float]]]) -> dict[str, list[list]]:
    """{kind: [[bytes, seconds], ...]} as plain YAML lists."""
    return {kind: [[int(b), float(t)] for b, t in pairs] for kind, pairs in points.items()}
