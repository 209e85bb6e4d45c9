"""Compile an HLO module with XLA through JAX's client and run it on N devices.

A replicated module (one program per device, collectives across replicas, as the
insert-gradient-all-reduces pass makes) is compiled with `num_replicas=N`. Each
device gets its own arguments, and we get each device's outputs back.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax._src import xla_bridge
from jax._src.lib import _jax, xla_client
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from disco_xla.hlo_passes.graph import HloModule
from disco_xla.hlo_passes.shapes import Shape


class ReplicatedProgram:
    """A module compiled for `replicas` CPU devices, one replica per device."""

    def __init__(self, module: HloModule, replicas: int):
        devices = jax.devices("cpu")
        if len(devices) < replicas:
            raise RuntimeError(
                f"{replicas} replicas need {replicas} CPU devices, JAX has {len(devices)}; "
                "set jax_num_cpu_devices before JAX starts"
            )
        self.devices = devices[:replicas]
        self.parameters = [p.shape for p in _entry_parameters(module)]
        options = xla_client.CompileOptions()
        options.num_replicas = replicas
        options.num_partitions = 1
        options.device_assignment = xla_client.DeviceAssignment.create(
            np.arange(replicas).reshape(replicas, 1)
        )
        stablehlo = _jax.mlir.hlo_to_stablehlo(module.to_bytes())
        self._executable = xla_bridge.get_backend("cpu").compile_and_load(
            stablehlo, xla_client.DeviceList(tuple(self.devices)), options
        )
        self._mesh = Mesh(np.array(self.devices), ("replica",))

    def run(self, arguments_per_device: Sequence[Sequence[np.ndarray]]) -> list[list[np.ndarray]]:
        """Run once; `arguments_per_device[d][i]` is parameter i on device d.
        Returns `outputs[d][j]`, the j-th output leaf of device d."""
        if len(arguments_per_device) != len(self.devices):
            raise ValueError(f"need arguments for {len(self.devices)} devices")
        global_arguments = []
        for index, shape in enumerate(self.parameters):
            shards = [
                jax.device_put(np.asarray(arguments[index]), device)
                for arguments, device in zip(arguments_per_device, self.devices, strict=True)
            ]
            global_arguments.append(
                jax.make_array_from_single_device_arrays(
                    tuple(shape.dims), NamedSharding(self._mesh, P()), shards
                )
            )
        results = self._executable.execute_sharded(global_arguments)
        per_output = results.disassemble_into_single_device_arrays()
        return [[np.asarray(output[d]) for output in per_output] for d in range(len(self.devices))]


def _entry_parameters(module: HloModule):
    parameters = [i for i in module.entry.instructions if i.opcode == "parameter"]
    return sorted(parameters, key=lambda i: i.proto.parameter_number)


def random_arguments(shapes: Sequence[Shape], seed: int) -> list[np.ndarray]:
    """Small random values of the right shapes and dtypes (integers in [0, 2))."""
    rng = np.random.default_rng(seed)
    arguments = []
    for shape in shapes:
        dtype = np.dtype(_NUMPY_TYPES.get(shape.element_type, "float32"))
        if dtype.kind == "f":
            arguments.append((rng.standard_normal(shape.dims) * 0.1).astype(dtype))
        elif dtype.kind == "b":
            arguments.append(rng.integers(0, 2, shape.dims).astype(bool))
        else:
            arguments.append(rng.integers(0, 2, shape.dims).astype(dtype))
    return arguments


_NUMPY_TYPES = {
    "pred": "bool",
    "s8": "int8",
    "s16": "int16",
    "s32": "int32",
    "s64": "int64",
    "u8": "uint8",
    "u16": "uint16",
    "u32": "uint32",
    "u64": "uint64",
    "f16": "float16",
    "f32": "float32",
    "f64": "float64",
}
