"""`disco-xla calibrate --engine horovod`: time Horovod's all-reduces on N ranks of
this machine (`profiling.horovod_probe`, under `horovodrun --gloo`) and write a
profile of them for the Horovod runtime (`runtime.horovod`).

From the probe's figures (each a `tf.function` call that issues all-reduces and
returns their results, median of the timed calls):
- what each further response adds to a step: (T(CALLS responses of SMALL_BYTES)
  - T(one)) / (CALLS - 1). Horovod sends the responses one after another from
  its background thread;
- what a step pays once for its all-reduces, whatever their number (the
  negotiation that starts them, the wait for Horovod's cycle):
  `step_overhead_s` = T(one response of SMALL_BYTES) - that per-response cost;
- each size's all-reduce, as a further response adds it: T(one of S) less the
  once-per-step part. These are the profile's `calibration.points`, which the
  communication model reads (`comm.all_reduce_s`), and the ring model's alpha and
  B are fitted to them for the links;
- each tensor after the first of one response (a bucket of several gradients,
  which Horovod copies into and out of its fusion buffer):
  `tuple_all_reduce_element_s` = (T(GROUP_TENSORS tensors) - T(one tensor of the
  same bytes)) / (GROUP_TENSORS - 1).

The profile says how this runtime runs a step: `overlap: false` and
`collectives_after_compute: true`, because Horovod's ops run outside the
XLA-compiled step, after it (see `runtime.horovod`). Compute figures come from
the same probes as the JAX calibration (`calibrate.measure_device`): the compute
part is XLA's on the same cores.
"""

from __future__ import annotations

import json
import os
import tempfile

from disco_xla.errors import DiscoInputError
from disco_xla.profiling.cpu_profile import Fit, fit_ring_model, host_machine
from disco_xla.runtime.horovod import FUSION_SETTINGS
from disco_xla.runtime.launch import launch_horovod

PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "horovod_probe.py")
SMALL_BYTES = 4096  # as horovod_probe.SMALL_BYTES, whose module needs TensorFlow


def measure_horovod(
    processes: int, sizes: list[int], repeats: int, timeout_s: float = 1800.0
) -> dict:
    """The probe's figures from `processes` Horovod ranks on this machine, under
    Horovod's default fusion (128 MB, 1 ms cycle)."""
    sizes = sorted({SMALL_BYTES, *sizes})
    saved = {key: os.environ.get(key) for key in FUSION_SETTINGS["default"].environment()}
    os.environ.update(FUSION_SETTINGS["default"].environment())
    try:
        with tempfile.TemporaryDirectory() as directory:
            output = os.path.join(directory, "probe.json")
            arguments = ["--output", output, "--sizes", ",".join(map(str, sizes))]
            code = launch_horovod(
                PROBE, [*arguments, "--repeats", str(repeats)], processes, timeout_s
            )
            if code != 0 or not os.path.isfile(output):
                raise DiscoInputError(
                    "calibrate", f"the Horovod probe on {processes} ranks failed (exit {code})"
                )
            with open(output) as handle:
                return json.load(handle)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def response_costs(figures: dict) -> tuple[float, float, float]:
    """(once per step, each further response, each further tensor of a response),
    seconds, from the probe's figures."""
    single = dict((int(size), seconds) for size, seconds in figures["single_s"])
    small = single[figures["small_bytes"]]
    per_response = max((figures["calls_s"] - small) / (figures["calls"] - 1), 0.0)
    once = max(small - per_response, 0.0)
    per_tensor = (figures["group_s"] - figures["one_tensor_of_group_bytes_s"]) / (
        figures["group_tensors"] - 1
    )
    return once, per_response, max(per_tensor, 0.0)


def response_fit(figures: dict) -> Fit:
    """The ring model fitted to what each size's all-reduce adds as a further
    response (its points are the profile's `calibration.points`)."""
    once, _, _ = response_costs(figures)
    points = [
        (int(size), max(seconds - once, 1e-7)) for size, seconds in sorted(figures["single_s"])
    ]
    return fit_ring_model(points, int(figures["workers"]))


def horovod_profile(figures: dict, flops: float, bandwidth: float) -> dict:
    """The profile of this machine under Horovod, as a plain mapping for YAML."""
    once, per_response, per_tensor = response_costs(figures)
    fit = response_fit(figures)
    workers = int(figures["workers"])
    fusion = FUSION_SETTINGS["default"]
    runtime = (
        f"Horovod (gloo on loopback, {workers} ranks, fusion "
        f"{fusion.threshold_bytes // 2**20} MB / {fusion.cycle_time_ms:g} ms cycle)"
    )
    return {
        "name": "horovod-local",
        "description": f"this machine under {runtime}, calibrated by "
        "`disco-xla calibrate --engine horovod`",
        "execution": "cpu-threads",
        "compute_threads": 1,
        "overlap": False,
        "collectives_after_compute": True,
        **host_machine(fit, workers, flops, bandwidth),
        "tuple_all_reduce_element_s": float(per_tensor),
        "step_overhead_s": float(once),
        "calibration": {
            "runtime": runtime,
            "engine": "horovod",
            "response_s": float(per_response),
            "probe": figures,
            "max_relative_residual": fit.max_relative_residual,
            "points": fit.points,
        },
    }
