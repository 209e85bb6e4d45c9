"""Compile an HLO module with XLA through JAX's client and run it on N devices.

A replicated module (one program per device, collectives across replicas, as the
insert-gradient-all-reduces pass makes) is compiled with `num_replicas=N`. Each
device gets its own arguments, and we get each device's outputs back.

Every entry point takes a `platform` ('cpu' by default, or 'gpu'): the devices
are `jax.devices(platform)` and the compiler is that platform's backend. A
platform with too few devices is bad input (`DevicesUnavailable`, one line).
"""

from __future__ import annotations

import glob
import os
import tempfile
from collections.abc import Callable, Sequence

import jax
import ml_dtypes
import numpy as np
from jax._src import xla_bridge
from jax._src.lib import _jax, xla_client
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from disco_xla.errors import DiscoInputError
from disco_xla.hlo.graph import HloModule
from disco_xla.hlo.hlo_io import PARTITIONER_PASS
from disco_xla.hlo.hlo_schema import OpSharding
from disco_xla.hlo.shapes import Shape
from disco_xla.hlo_passes.partitions_as_replicas import PartitionsAsReplicas
from disco_xla.runtime import persistent_cache

_RECENT_COMPILES = 4
_recent_compiles: dict[tuple, HloModule] = {}


# XLA:CPU's pass that merges every all-reduce into one after the last gradient.
# Rewritten modules compile with it off (NO_COMBINER), or it
# would merge their buckets again.
ALL_REDUCE_COMBINER = "cpu-all-reduce-combiner"
NO_COMBINER = (ALL_REDUCE_COMBINER,)
# The same pass per platform (`no_combiner`). XLA:GPU runs GpuAllReduceCombiner,
# whose name() is "gpu-all-reduce-combiner" (openxla/xla, 2024 on:
# xla/service/gpu/transforms/collectives/all_reduce_combiner.h, added to the
# pipeline in xla/service/gpu/gpu_compiler.cc); before it, XLA:GPU ran the generic
# AllReduceCombiner, whose name() is "all-reduce-combiner"
# (xla/service/all_reduce_combiner.h). Both are listed: XLA skips a disabled
# name that no pass has (checked here on XLA:CPU with both names).
NO_COMBINER_BY_PLATFORM = {
    "cpu": NO_COMBINER,
    "gpu": ("gpu-all-reduce-combiner", "all-reduce-combiner"),
}


class DevicesUnavailable(DiscoInputError, RuntimeError):
    """The platform has fewer devices than the module needs (bad input: one line)."""


def compile_module(
    module: HloModule, disabled_passes: Sequence[str] = (), platform: str = "cpu"
) -> HloModule:
    """The module as XLA compiles it for `platform` and its own device counts
    (partitions from pmap or shard_map, or replicas), with `disabled_passes`
    off. The last few are remembered by fingerprint: a first call compiles the
    unchanged step for the search's baselines and again for the rewrite's
    all-reduce check."""
    key = (module.fingerprint, tuple(disabled_passes), platform)
    if key not in _recent_compiles:
        if len(_recent_compiles) >= _RECENT_COMPILES:
            del _recent_compiles[next(iter(_recent_compiles))]
        program = program_for(module, disabled_passes=disabled_passes, platform=platform)
        _recent_compiles[key] = program.compiled_module()
    return _recent_compiles[key]


def no_combiner(platform: str = "cpu") -> tuple[str, ...]:
    """The passes to disable so that XLA on `platform` keeps every all-reduce
    as written (NO_COMBINER on the CPU)."""
    return NO_COMBINER_BY_PLATFORM.get(platform, NO_COMBINER_BY_PLATFORM["gpu"])


def compile_separately(module: HloModule) -> HloModule:
    """XLA's compile of `module` with its all-reduce combiner off (NO_COMBINER):
    XLA's own fusion, every all-reduce apart. What the baselines and the
    search's bounds are built from (`search.pipeline.plan_module`)."""
    return compile_module(module, NO_COMBINER)


def as_replicas(module: HloModule) -> HloModule:
    """A copy of an already-partitioned module, as N replicas."""
    copy = HloModule.from_bytes(module.to_bytes(), module.source, module.file_format)
    PartitionsAsReplicas().run(copy)
    return copy


def after_partitioning(compile_with: Callable[[dict], object], source: str) -> HloModule:
    """The module right after XLA's `spmd-partitioning` pass, from one compile
    that `compile_with(options)` runs with these XLA debug options added for that
    compile alone (XLA_FLAGS are untouched): XLA dumps the module after that
    pass as a proto into a temporary directory. It has the collectives the
    partitioner inserted, with channels and global device ids, and runs as
    replicas (`hlo_passes.partitions_as_replicas`). A compile that fails after
    the partitioner ran (a GPU library call, such as cuDNN's attention, that
    XLA:CPU has no kernel for: a step lowered for pricing only) still gives
    the module the partitioner left. The compile skips JAX's persistent
    cache, whose hit would dump nothing."""
    with tempfile.TemporaryDirectory(prefix="disco_xla_partitioned_") as directory:
        options = {
            "xla_dump_to": directory,
            "xla_dump_hlo_pass_re": PARTITIONER_PASS,
            "xla_dump_hlo_as_proto": True,
            "xla_dump_hlo_as_text": False,
        }
        pattern = os.path.join(directory, f"*.after_{PARTITIONER_PASS}.*.hlo.pb")
        try:
            with persistent_cache.cache_off():
                compile_with(options)
        except Exception:
            if not glob.glob(pattern):
                raise
        dumps = sorted(glob.glob(pattern))
        if not dumps:
            raise RuntimeError(f"XLA wrote no module after {PARTITIONER_PASS} for {source}")
        with open(dumps[-1], "rb") as file:
            return HloModule.from_bytes(file.read(), source=source, file_format="memory")


def partition_module(module: HloModule, platform: str = "cpu") -> HloModule:
    """One partition's program of a module that XLA's SPMD partitioner splits
    (`module.needs_partitioning`), as XLA partitions it when it compiles it for
    `platform`."""
    devices = platform_devices(platform, devices_needed(module))

    def compile_with(dump_options: dict) -> None:
        options = _spmd_options(len(devices))
        for name, value in dump_options.items():
            setattr(options.executable_build_options.debug_options, name, value)
        _compile(module, devices, options, ())

    partitioned = after_partitioning(compile_with, module.source)
    partitioned.file_format = module.file_format
    return partitioned


def devices_needed(module: HloModule) -> int:
    counts = module.device_counts()
    return max(counts["num_partitions"], counts["num_replicas"])


def program_for(
    module: HloModule,
    devices: int | None = None,
    disabled_passes: Sequence[str] = (),
    platform: str = "cpu",
):
    """A PartitionedProgram for a pmap or shard_map module, else a
    ReplicatedProgram, on `devices` devices of `platform` (by default, as many
    as it needs). A module already SPMD-partitioned runs as replicas, so that it
    is not partitioned again (`hlo_passes.partitions_as_replicas`). A pmap or
    shard_map module over one device is partitioned too: XLA's partitioner must
    still remove its Shardy custom-calls (compiled as one replica, its
    per-device shapes fail XLA's layout check)."""
    devices = devices or devices_needed(module)
    if module.already_partitioned:
        return ReplicatedProgram(as_replicas(module), devices, disabled_passes, platform)
    if module.device_counts()["num_partitions"] > 1 or _has_shardy_markers(module):
        return PartitionedProgram(module, devices, disabled_passes, platform)
    return ReplicatedProgram(module, devices, disabled_passes, platform)


def _has_shardy_markers(module: HloModule) -> bool:
    return any(
        instr.opcode == "custom-call" and instr.proto.custom_call_target.startswith("xla.sdy.")
        for instr in module.instructions()
    )


def available_devices(platform: str) -> list:
    """JAX's devices of `platform` ('cpu', 'gpu', ...); none where JAX has no
    backend for it (no GPU, or a jaxlib without its plugin)."""
    try:
        return list(jax.devices(platform))
    except RuntimeError:
        return []


def platform_devices(platform: str, count: int) -> list:
    """The first `count` devices of `platform`; DevicesUnavailable (one line
    naming the platform and the device counts) where JAX has fewer."""
    available = available_devices(platform)
    if len(available) >= count:
        return available[:count]
    name = platform.upper()
    if not available:
        problem = f"no {name} devices are available (JAX has 0; the module needs {count})"
    else:
        problem = f"the module needs {count} {name} devices, JAX has {len(available)}"
    if platform == "cpu":
        problem += "; set jax_num_cpu_devices before JAX starts"
    raise DevicesUnavailable(platform, problem)


def _compile(
    module: HloModule,
    devices: list,
    options,
    disabled_passes: Sequence[str],
    drop_aliases: bool = False,
):
    """Compile for `devices` (all of one platform, whose backend compiles) with
    `options`; `disabled_passes` are off for this compile only (global
    XLA_FLAGS are left alone). `drop_aliases` compiles it without
    input/output aliases (TF's assigned variables, JAX's donated
    arguments): an aliased argument is donated to the step, and the runners run
    a step many times on the same arguments (a second run read a deleted buffer,
    and XLA then crashed). Aliases only let XLA reuse memory; the results are the
    same. It does not go through JAX's persistent compilation cache
    (`persistent_cache`)."""
    options.device_assignment = xla_client.DeviceAssignment.create(
        np.array([device.id for device in devices]).reshape(
            (len(devices), 1) if options.num_replicas > 1 else (1, len(devices))
        )
    )
    if disabled_passes:
        options.executable_build_options.debug_options.xla_disable_hlo_passes = ",".join(
            disabled_passes
        )
    proto = module.proto
    if drop_aliases and proto.input_output_alias:
        proto = type(proto).FromString(module.to_bytes())
        proto.ClearField("input_output_alias")
    stablehlo = _jax.mlir.hlo_to_stablehlo(proto.SerializeToString())
    return xla_bridge.get_backend(devices[0].platform).compile_and_load(
        stablehlo, xla_client.DeviceList(tuple(devices)), options
    )


class ReplicatedProgram:
    """A module compiled for `replicas` devices of `platform`, one replica per device."""

    def __init__(
        self,
        module: HloModule,
        replicas: int,
        disabled_passes: Sequence[str] = (),
        platform: str = "cpu",
    ):
        self.platform = platform
        self.devices = platform_devices(platform, replicas)
        self.parameters = [p.shape for p in _entry_parameters(module)]
        options = xla_client.CompileOptions()
        options.num_replicas = replicas
        options.num_partitions = 1
        self._executable = _compile(
            module, self.devices, options, disabled_passes, drop_aliases=True
        )
        self._mesh = Mesh(np.array(self.devices), ("replica",))

    def compiled_module(self) -> HloModule:
        """XLA's optimised module, as our IR."""
        data = self._executable.hlo_modules()[0].as_serialized_hlo_module_proto()
        return HloModule.from_bytes(data, "<compiled>")

    def _place(self, arguments_per_device: Sequence[Sequence[np.ndarray]]) -> list:
        if len(arguments_per_device) != len(self.devices):
            raise ValueError(f"need arguments for {len(self.devices)} devices")
        global_arguments = []
        for index, shape in enumerate(self.parameters):
            # Over several processes each places only its own devices' shards.
            shards = [
                jax.device_put(np.asarray(arguments[index]), device)
                for arguments, device in zip(arguments_per_device, self.devices, strict=True)
                if device.process_index == jax.process_index()
            ]
            global_arguments.append(
                jax.make_array_from_single_device_arrays(
                    tuple(shape.dims), NamedSharding(self._mesh, P()), shards
                )
            )
        return global_arguments

    def device_runner(self, arguments_per_device) -> Callable[[], None]:
        """A function that runs one step on arguments already on the devices and
        waits for it, with no host copies: what step times should measure."""
        return _device_runner(self._executable, self._place(arguments_per_device))

    def run(self, arguments_per_device: Sequence[Sequence[np.ndarray]]) -> list[list[np.ndarray]]:
        """Run once; `arguments_per_device[d][i]` is parameter i on device d.
        Returns `outputs[d][j]`, the j-th output leaf of device d, for this
        process's devices (all of them in one process)."""
        results = self._executable.execute_sharded(self._place(arguments_per_device))
        return _local_outputs(results)


def _local_outputs(results) -> list[list[np.ndarray]]:
    """`outputs[d][j]`: output j's shard on this process's d-th device."""
    per_output = results.disassemble_into_single_device_arrays()
    local_devices = len(per_output[0]) if per_output else 0
    return [[np.asarray(output[d]) for output in per_output] for d in range(local_devices)]


def _device_runner(executable, placed: list) -> Callable[[], None]:
    def run() -> None:
        results = executable.execute_sharded(placed)
        for output in results.disassemble_into_single_device_arrays():
            for shard in output:
                shard.block_until_ready()

    return run


def _entry_parameters(module: HloModule):
    parameters = [i for i in module.entry.instructions if i.opcode == "parameter"]
    return sorted(parameters, key=lambda i: i.proto.parameter_number)


def random_arguments(shapes: Sequence[Shape], seed: int) -> list[np.ndarray]:
    """Small random values of the right shapes and dtypes (integers in [0, 2))."""
    rng = np.random.default_rng(seed)
    arguments = []
    for shape in shapes:
        dtype = np.dtype(_NUMPY_TYPES.get(shape.element_type, "float32"))
        if dtype.kind == "f" or dtype in _NARROW_FLOATS:
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
    "bf16": ml_dtypes.bfloat16,
    "f8e4m3fn": ml_dtypes.float8_e4m3fn,
    "f8e5m2": ml_dtypes.float8_e5m2,
}
# Floating-point types numpy knows only through ml_dtypes (their dtype.kind is 'V').
_NARROW_FLOATS = {
    np.dtype(ml_dtypes.bfloat16),
    np.dtype(ml_dtypes.float8_e4m3fn),
    np.dtype(ml_dtypes.float8_e5m2),
}


def _spmd_options(devices: int):
    """Compile options for one program split by XLA's SPMD partitioner (Shardy)."""
    options = xla_client.CompileOptions()
    options.num_replicas = 1
    options.num_partitions = devices
    build = options.executable_build_options
    build.use_spmd_partitioning = True
    build.use_shardy_partitioner = True
    return options


class PartitionedProgram:
    """A module from `jax.pmap` or `jax.jit(shard_map)` (SPMD partitions, one per
    device) compiled for N devices of `platform`. `disabled_passes` turns XLA
    passes off for this compile only, e.g. 'cpu-all-reduce-combiner'; global
    XLA_FLAGS are left alone. Arguments and results are global arrays, laid out
    as the entry's shardings say (a pmap'd step: leading axis over the devices)."""

    def __init__(
        self,
        module: HloModule,
        devices: int,
        disabled_passes: Sequence[str] = (),
        platform: str = "cpu",
    ):
        self.platform = platform
        self.devices = platform_devices(platform, devices)
        self._mesh = Mesh(np.array(self.devices), ("d",))
        self.parameters = [p.shape for p in _entry_parameters(module)]
        options = _spmd_options(devices)
        self._executable = _compile(
            module, self.devices, options, disabled_passes, drop_aliases=True
        )
        # The layout XLA chose for each argument (a jit of shard_map leaves it to
        # sharding propagation, so the module itself may not say).
        # One device: XLA gives no shardings (everything is on that device).
        shardings = self._executable.get_parameter_shardings() or [None] * len(self.parameters)
        self._specs = [
            _partition_spec(
                OpSharding.FromString(sharding.SerializeToString()), len(shape.dims), devices
            )
            if sharding is not None
            else P()
            for sharding, shape in zip(shardings, self.parameters, strict=True)
        ]

    def compiled_module(self) -> HloModule:
        """XLA's optimised module, as our IR."""
        data = self._executable.hlo_modules()[0].as_serialized_hlo_module_proto()
        return HloModule.from_bytes(data, "<compiled>")

    def _place(self, arguments: Sequence[np.ndarray]) -> list:
        return [
            jax.device_put(np.asarray(value), NamedSharding(self._mesh, spec))
            for value, spec in zip(arguments, self._specs, strict=True)
        ]

    def device_runner(self, arguments: Sequence[np.ndarray]) -> Callable[[], None]:
        """A function that runs one step on arguments already on the devices and
        waits for it, with no host copies: what step times should measure."""
        return _device_runner(self._executable, self._place(arguments))

    def run(self, arguments: Sequence[np.ndarray]) -> list[list[np.ndarray]]:
        """Run once on global arguments; returns `outputs[d][j]`, the part of
        output j that device d holds, for this process's devices."""
        return _local_outputs(self._executable.execute_sharded(self._place(arguments)))


def _partition_spec(sharding, rank: int, devices: int) -> P:
    """The PartitionSpec of an OpSharding: tiled along one axis over all the
    devices, or replicated."""
    dims = list(sharding.tile_assignment_dimensions)
    if sharding.type == 3 and dims:  # OTHER: tiled
        axes = [index for index, count in enumerate(dims[:rank]) if count > 1]
        if len(axes) == 1 and dims[axes[0]] == devices:
            return P(*([None] * axes[0] + ["d"]))
        if axes:
            raise RuntimeError(f"unsupported argument sharding: tiles {dims}")
    return P()
