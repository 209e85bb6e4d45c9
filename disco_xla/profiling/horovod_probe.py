"""The probe `disco-xla calibrate --engine horovod` runs on every Horovod rank
(`.venv-horovod`, started by `runtime.launch.launch_horovod`): it times Horovod's
all-reduces under its own background thread, as `runtime.horovod.HorovodStep`
issues them, and rank 0 writes the times as JSON.

    python -m disco_xla.profiling.horovod_probe --output OUT.json
        [--sizes 4096,16384,...] [--repeats 5]

Each figure is the median wall time of a `tf.function` call that issues the
all-reduces and returns their results, after two untimed calls (SMALL_REPEATS
times as many timed calls for messages up to GROUP_BYTES):
- `single_s`: one float32 tensor of each size, as one `hvd.grouped_allreduce`;
- `calls_s`: CALLS tensors of SMALL_BYTES, each its own `grouped_allreduce`
  with its own scale factors (`runtime.horovod.bucket_scale`), so that Horovod
  sends CALLS responses, against one (`single_s` at SMALL_BYTES);
- `group_s`: GROUP_TENSORS tensors of GROUP_BYTES in all, as one
  `grouped_allreduce` (one response; Horovod copies them into its fusion buffer),
  against one tensor of GROUP_BYTES.
The job's fusion setting is Horovod's default (128 MB, 1 ms), set by the caller.
Imports only what `.venv-horovod` has: TensorFlow, Horovod, numpy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

SMALL_BYTES = 4096
CALLS = 16
GROUP_TENSORS, GROUP_BYTES = 64, 1 << 20
SMALL_REPEATS = 4


def _timed_s(function, tensors, repeats: int) -> float:
    for _ in range(2):
        function(tensors)[0].numpy()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function(tensors)[0].numpy()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(sizes: list[int], repeats: int) -> dict:
    """The probe's figures on this rank (see the module's docstring)."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from disco_xla.runtime.horovod import bucket_scale

    def grouped(groups):
        @tf.function(autograph=False)
        def send(tensors):
            outputs = []
            for index, group in enumerate(groups):
                scale = bucket_scale(index)
                outputs += hvd.grouped_allreduce(
                    [tensors[i] for i in group],
                    op=hvd.Average,
                    prescale_factor=scale,
                    postscale_factor=1.0 / scale,
                )
            return outputs

        return send

    def floats(count: int, size_bytes: int):
        return [tf.ones([max(1, size_bytes // 4)], tf.float32) for _ in range(count)]

    one = grouped([[0]])
    # The small probes decide the per-response and per-tensor costs, and take
    # milliseconds: SMALL_REPEATS times the repeats (their medians moved by 2x
    # between runs with 5).
    many = SMALL_REPEATS * repeats
    single = {
        size: _timed_s(one, floats(1, size), many if size <= GROUP_BYTES else repeats)
        for size in sizes
    }
    calls = _timed_s(grouped([[k] for k in range(CALLS)]), floats(CALLS, SMALL_BYTES), many)
    group = _timed_s(
        grouped([list(range(GROUP_TENSORS))]),
        floats(GROUP_TENSORS, GROUP_BYTES // GROUP_TENSORS),
        many,
    )
    return {
        "workers": hvd.size(),
        "horovod_version": hvd.__version__ if hasattr(hvd, "__version__") else "",
        "fusion_threshold_bytes": int(os.environ.get("HOROVOD_FUSION_THRESHOLD", 0) or 0),
        "cycle_time_ms": float(os.environ.get("HOROVOD_CYCLE_TIME", 0) or 0),
        "single_s": [[size, seconds] for size, seconds in single.items()],
        "small_bytes": SMALL_BYTES,
        "calls": CALLS,
        "calls_s": calls,
        "group_tensors": GROUP_TENSORS,
        "group_bytes": GROUP_BYTES,
        "group_s": group,
        "one_tensor_of_group_bytes_s": _timed_s(one, floats(1, GROUP_BYTES), many),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="horovod_probe")
    parser.add_argument("--output", required=True, help="rank 0 writes the figures here")
    parser.add_argument("--sizes", required=True, help="comma-separated message sizes, bytes")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import horovod.tensorflow as hvd

    hvd.init()
    figures = measure([int(s) for s in args.sizes.split(",")], args.repeats)
    if hvd.rank() == 0:
        with open(args.output, "w") as handle:
            json.dump(figures, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
