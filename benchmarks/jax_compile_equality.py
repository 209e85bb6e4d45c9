"""Why our compile of an unchanged JAX step can round differently from JAX's own.

For a zoo model (pmap over 4 CPU devices, tiny), it runs the step compiled four
ways on the same arguments and compares each with JAX's own executable:

- `stablehlo`: the StableHLO JAX lowers to, compiled by us with our options;
- `compiler_ir-hlo`: `lowered.compiler_ir('hlo')` (what we capture), through
  `hlo_to_stablehlo`, compiled the same way (the path of every rewritten step);
- `dumped-hlo`: the HLO XLA's own compile starts from (dumped before
  optimisations), through `hlo_to_stablehlo` likewise.

It prints each one's largest relative output difference, and the opcode counts
in which XLA's optimised programs of `stablehlo` and `compiler_ir-hlo` differ.

    .venv/bin/python benchmarks/jax_compile_equality.py [--model gpt2_small]
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
from collections import Counter

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
DEVICES = 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2_small")
    args = parser.parse_args()
    import jax

    jax.config.update("jax_num_cpu_devices", DEVICES)
    import numpy as np
    from jax._src import xla_bridge
    from jax._src.interpreters import mlir, pxla
    from jax._src.lib import _jax, xla_client

    from disco_xla.hlo.graph import HloModule
    from disco_xla.hlo.hlo_io import load_module
    from disco_xla.runtime.jax_program import kept_arguments
    from disco_xla.runtime.output_comparison import compare_outputs
    from disco_xla.zoo.jax_steps import build_jax_step

    step = build_jax_step(args.model, "tiny", replicas=DEVICES, global_batch=2 * DEVICES)
    lowered = step.fn.lower(*step.args)
    executable = lowered.compile()

    def shards(arrays) -> list:
        return [np.asarray(s.data) for a in arrays for s in a.addressable_shards]

    reference = shards(jax.tree_util.tree_leaves(executable(*step.args)))
    in_shardings = jax.tree_util.tree_leaves(executable.input_shardings)
    devices = list(in_shardings[0]._device_assignment)
    leaves = jax.tree_util.tree_leaves(step.args)
    kept = [leaves[i] for i in kept_arguments(lowered)]

    def compile_and_run(code: bytes):
        options = xla_client.CompileOptions()
        options.num_replicas, options.num_partitions = 1, len(devices)
        build = options.executable_build_options
        build.use_spmd_partitioning = build.use_shardy_partitioner = True
        options.device_assignment = xla_client.DeviceAssignment.create(
            np.array([d.id for d in devices]).reshape(1, -1)
        )
        compiled = xla_bridge.get_backend("cpu").compile_and_load(
            code, xla_client.DeviceList(tuple(devices)), options
        )
        semantics = [xla_client.ArrayCopySemantics.REUSE_INPUT] * len(kept)
        placed = pxla.shard_args(in_shardings, [None] * len(kept), semantics, kept)
        outputs = compiled.execute_sharded(placed).disassemble_into_single_device_arrays()
        return [np.asarray(x) for per_output in outputs for x in per_output], compiled

    with tempfile.TemporaryDirectory() as directory:
        lowered.compile(compiler_options={"xla_dump_to": directory, "xla_dump_hlo_as_proto": True})
        (dumped,) = glob.glob(os.path.join(directory, "*before_optimizations.hlo.pb"))
        dumped_hlo = load_module(dumped).to_bytes()  # the dump wraps it in an HloProto
    captured = lowered.compiler_ir("hlo").as_serialized_hlo_module_proto()
    paths = {
        "stablehlo": mlir.module_to_bytecode(lowered.compiler_ir("stablehlo")),
        "compiler_ir-hlo": _jax.mlir.hlo_to_stablehlo(captured),
        "dumped-hlo": _jax.mlir.hlo_to_stablehlo(dumped_hlo),
    }
    opcodes = {}
    for label, code in paths.items():
        outputs, compiled = compile_and_run(code)
        verdict = compare_outputs(reference, outputs)
        print(
            f"{label:16s} bit-equal {verdict.bit_equal!s:5s} "
            f"max relative difference {verdict.max_rel_diff:.3g}"
        )
        data = compiled.hlo_modules()[0].as_serialized_hlo_module_proto()
        opcodes[label] = Counter(i.opcode for i in HloModule.from_bytes(data, label).instructions())
    first, second = opcodes["stablehlo"], opcodes["compiler_ir-hlo"]
    differing = {op: (first[op], second[op]) for op in first | second if first[op] != second[op]}
    print(f"opcodes (stablehlo, compiler_ir-hlo) that differ after optimisation: {differing}")


if __name__ == "__main__":
    main()
