"""What `disco_xla.jit` adds to every call to find its argument signature
(`OptimizedFunction._signature`), on the Flax NNX client's step: the client runs
unmodified under the environment hook, in this process, and then the signature
of its last call is computed again `--repeats` times, alone, and timed.

    DISCO_XLA_FLAGS="--disco_enable --disco_cluster=cpu-local-inprocess" \\
        .venv/bin/python benchmarks/signature_cost.py [--steps 300] [--repeats 2000] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import runpy
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
CLIENT = os.path.join(REPO_ROOT, "benchmarks", "clients", "flax_nnx.py")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if "--disco_enable" not in os.environ.get("DISCO_XLA_FLAGS", ""):
        print("signature_cost.py: set DISCO_XLA_FLAGS='--disco_enable ...'", file=sys.stderr)
        return 2
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    import disco_xla.frontends.jax_api as jax_api

    last: dict = {}
    call = jax_api.OptimizedFunction.__call__

    def remembering(self, *call_args, **call_kwargs):
        last[self.__name__] = (self, call_args, call_kwargs)
        return call(self, *call_args, **call_kwargs)

    jax_api.OptimizedFunction.__call__ = remembering
    sys.argv = [CLIENT, "--steps", str(args.steps)]
    with contextlib.redirect_stdout(io.StringIO()):
        runpy.run_path(CLIENT, run_name="__main__")
    function, call_args, call_kwargs = last["train_step"]
    leaves, _ = function._signature(call_args, call_kwargs)
    started = time.perf_counter()
    for _ in range(args.repeats):
        function._signature(call_args, call_kwargs)
    per_call_us = (time.perf_counter() - started) / args.repeats * 1e6
    report = {"client": "flax_nnx", "leaves": len(leaves), "signature_us_per_call": per_call_us}
    print(json.dumps(report) if args.json else json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
