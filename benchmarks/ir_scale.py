"""Parse + graph-build time and memory of a 100,000-instruction HLO module.

Target (issue 2): under 3 s and under 1.5 GB. The module is generated: blocks of
dot -> add -> tanh -> all-reduce -> multiply over f32[128,128], the shape of a
layer's forward and gradient reduction, each instruction with metadata as JAX
writes it. Load is measured in a fresh process so the memory figure is its own.

    .venv/bin/python benchmarks/ir_scale.py [--instructions N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

F32 = 11
BLOCK = ("dot", "add", "tanh", "all-reduce", "multiply")


def generate_module(instructions: int) -> bytes:
    """A valid HloModuleProto with about `instructions` instructions."""
    from disco_xla.hlo.edit import add_scalar_reducer
    from disco_xla.hlo.hlo_schema import HloModuleProto
    from disco_xla.hlo.shapes import TUPLE_TYPE

    module = HloModuleProto(name="scale_test", id=1)
    reducer_id = add_scalar_reducer(module, F32)
    entry = module.computations.add(name="main", id=2)
    local = 0

    def new(opcode: str, operands: list[int], op_name: str):
        nonlocal local
        instr = entry.instructions.add(
            name=f"{opcode}.{local}", opcode=opcode, id=(2 << 32) | local
        )
        local += 1
        instr.shape.element_type = F32
        instr.shape.dimensions.extend([128, 128])
        instr.shape.layout.minor_to_major.extend([1, 0])
        instr.operand_ids.extend(operands)
        instr.metadata.op_name = op_name
        instr.metadata.source_file = "/models/layer.py"
        instr.metadata.source_line = 10 + local % 90
        return instr

    inputs = new("parameter", [], "x")
    inputs.parameter_number = 0
    weight = new("parameter", [], "w")
    weight.parameter_number = 1
    previous = inputs.id
    for block in range(max(1, (instructions - 3) // len(BLOCK))):
        prefix = f"jit(step)/transpose(jvp(layer_{block}))"
        dot = new("dot", [previous, weight.id], f"{prefix}/dot_general")
        dot.dot_dimension_numbers.lhs_contracting_dimensions.append(1)
        dot.dot_dimension_numbers.rhs_contracting_dimensions.append(0)
        summed = new("add", [dot.id, previous], f"{prefix}/add")
        activated = new("tanh", [summed.id], f"{prefix}/tanh")
        reduced = new("all-reduce", [activated.id], f"jit(step)/psum_{block}")
        reduced.called_computation_ids.append(reducer_id)
        reduced.collective_device_list.replica_groups.add().replica_ids.extend([0, 1])
        previous = new("multiply", [reduced.id, activated.id], f"{prefix}/mul").id
    root = entry.instructions.add(name="result", opcode="tuple", id=(2 << 32) | local)
    root.operand_ids.append(previous)
    root.shape.element_type = TUPLE_TYPE
    leaf = root.shape.tuple_shapes.add(element_type=F32, dimensions=[128, 128])
    leaf.layout.minor_to_major.extend([1, 0])
    entry.root_id = root.id
    for _ in range(2):
        parameter = entry.program_shape.parameters.add(element_type=F32, dimensions=[128, 128])
        parameter.layout.minor_to_major.extend([1, 0])
    entry.program_shape.parameter_names.extend(["x", "w"])
    entry.program_shape.result.CopyFrom(root.shape)
    module.host_program_shape.CopyFrom(entry.program_shape)
    module.entry_computation_name = entry.name
    module.entry_computation_id = entry.id
    return module.SerializeToString()


def measure_load(path: str) -> dict:
    """Run in a fresh process: time parse and graph build, and the memory added."""
    from disco_xla.hlo.graph import HloModule
    from disco_xla.hlo.hlo_schema import HloModuleProto

    baseline_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with open(path, "rb") as file:
        data = file.read()
    start = time.perf_counter()
    proto = HloModuleProto.FromString(data)
    parsed = time.perf_counter()
    module = HloModule(proto, path, "pb")
    built = time.perf_counter()
    gradients = len(module.gradient_all_reduces)
    analysed = time.perf_counter()
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "instructions": module.instruction_count,
        "file_bytes": len(data),
        "parse_s": parsed - start,
        "graph_build_s": built - parsed,
        "parse_and_build_s": built - start,
        "gradient_analysis_s": analysed - built,
        "gradient_all_reduces": gradients,
        "added_memory_bytes": (peak_kb - baseline_kb) * 1024,
        "peak_memory_bytes": peak_kb * 1024,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instructions", type=int, default=100_000)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # the fresh child process
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure_load(args.measure)))
        return 0
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "scale.hlo.pb")
        with open(path, "wb") as file:
            file.write(generate_module(args.instructions))
        child = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--measure", path],
            capture_output=True,
            text=True,
            check=True,
        )
    figures = json.loads(child.stdout)
    figures["targets_met"] = (
        figures["parse_and_build_s"] < 3.0 and figures["peak_memory_bytes"] < 1.5e9
    )
    if args.json:
        print(json.dumps(figures))
    else:
        print(f"instructions          {figures['instructions']}")
        print(f"file size             {figures['file_bytes'] / 1e6:.1f} MB")
        print(f"parse                 {figures['parse_s']:.2f} s")
        print(f"graph build           {figures['graph_build_s']:.2f} s")
        print(f"parse + build         {figures['parse_and_build_s']:.2f} s   (target < 3 s)")
        print(f"gradient analysis     {figures['gradient_analysis_s']:.2f} s")
        print(
            f"peak memory (process) {figures['peak_memory_bytes'] / 1e6:.0f} MB  (target < 1500 MB)"
        )
        print(f"memory added by load  {figures['added_memory_bytes'] / 1e6:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
