"""Run a rewritten module in place of a jitted or pmapped JAX step.

The rewritten module is compiled for the same devices, in the same order, as the
original step, and must take and give its arrays with the same shardings as the
original's compiled executable (checked when it is built). A call then places
the arguments as the original would, runs the executable, and assembles its
per-device results into global `jax.Array`s.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import jax
from jax._src import core
from jax._src.interpreters import pxla
from jax._src.lib import xla_client

from disco_xla.hlo.graph import HloModule
from disco_xla.runtime.xla_runner import _compile, as_replicas


class ShardingMismatch(RuntimeError):
    """The rewritten executable lays out an argument or result differently."""


class MemoryMismatch(RuntimeError):
    """The rewritten executable needs more device memory than the original."""


class RewrittenStep:
    """`module` compiled to stand in for an original step whose (kept) arguments
    have `in_shardings`/`in_avals` and whose results have `out_shardings`/`out_avals`."""

    def __init__(
        self,
        module: HloModule,
        in_shardings: Sequence[jax.sharding.Sharding],
        in_avals: Sequence,
        out_shardings: Sequence[jax.sharding.Sharding],
        out_avals: Sequence,
        disabled_passes: Sequence[str] = (),
    ):
        counts = module.device_counts()
        if counts["num_replicas"] > 1:
            raise ShardingMismatch("a module with several replicas is not a jit or pmap step")
        devices = list(in_shardings[0]._device_assignment) if in_shardings else []
        if len(devices) != counts["num_partitions"]:
            raise ShardingMismatch(
                f"the step runs on {len(devices)} devices, the module has "
                f"{counts['num_partitions']} partitions"
            )
        # One partition's program (a sharded jit captured after partitioning)
        # runs as replicas, partition i's as replica i on the same device.
        per_device = module.already_partitioned
        options = xla_client.CompileOptions()
        options.num_replicas = len(devices) if per_device else 1
        options.num_partitions = 1 if per_device else len(devices)
        build = options.executable_build_options
        build.use_spmd_partitioning = not per_device
        build.use_shardy_partitioner = True
        if per_device:
            parameters = _parameter_shapes(module)
            module = as_replicas(module)
        self._executable = _compile(module, devices, options, disabled_passes)
        self._in_shardings = list(in_shardings)
        self._out_shardings = list(out_shardings)
        # JAX's own dispatch path, as its compiled functions use it: arguments
        # already placed as the step wants them pass through untouched, and the
        # per-device results become global arrays in one call (a loop over
        # results in Python cost about a millisecond per step on the zoo models).
        self._copy_semantics = [xla_client.ArrayCopySemantics.REUSE_INPUT] * len(in_shardings)
        self._results = pxla.global_avals_to_results_handler(
            # Weak types kept: a weakly typed result (a step counter, say) that
            # came back strong would be a new signature on the next call.
            [
                core.ShapedArray(tuple(a.shape), a.dtype, weak_type=getattr(a, "weak_type", False))
                for a in out_avals
            ],
            self._out_shardings,
            committed=True,
        ).handlers
        if per_device:
            _check_shard_shapes("argument", parameters, in_shardings, in_avals)
            _check_shard_shapes("result", _result_shapes(module), out_shardings, out_avals)
            return
        _check_layouts(
            "argument", self._executable.get_parameter_shardings(), in_shardings, in_avals
        )
        _check_layouts("result", self._executable.get_output_shardings(), out_shardings, out_avals)

    def compiled_module(self) -> HloModule:
        """XLA's optimised module, as our IR."""
        data = self._executable.hlo_modules()[0].as_serialized_hlo_module_proto()
        return HloModule.from_bytes(data, "<compiled>")

    def memory_stats(self):
        """XLA's memory figures of the compiled program, per device (the same
        type as `jax.stages.Compiled.memory_analysis()`)."""
        return self._executable.get_compiled_memory_stats()

    def behind_jax_dispatch(self, compiled):
        """This program as a copy of the original step's `compiled`
        (`jax.stages.Compiled`) that runs it in place of XLA's: called as
        `compiled` is, through JAX's own dispatch in C++, which checks each
        call's argument types and layouts against the step's and refuses others
        with an exception, before anything runs. None where `compiled` is not of
        the kind that has that dispatch (a jit's `MeshExecutable`)."""
        original = getattr(compiled, "_executable", None)
        if type(original) is not pxla.MeshExecutable:
            return None
        calls = original.unsafe_call
        if type(calls) is not pxla.ExecuteReplicated:
            return None
        ours_calls = copy.copy(calls)
        ours_calls.xla_executable = self._executable
        ours = copy.copy(original)
        ours.xla_executable = self._executable
        ours._unsafe_call = ours_calls
        behind = copy.copy(compiled)
        behind._executable = ours
        behind._params = compiled._params._replace(executable=ours)
        behind._call = None
        return behind

    def __call__(self, arguments: Sequence) -> list[jax.Array]:
        if len(arguments) != len(self._in_shardings):
            raise TypeError(
                f"the step takes {len(self._in_shardings)} arrays, {len(arguments)} given"
            )
        placed = pxla.shard_args(
            self._in_shardings, [None] * len(arguments), self._copy_semantics, arguments
        )
        return self._executable.execute_sharded(placed).consume_with_handlers(self._results)


def kept_arguments(lowered) -> list[int]:
    """Positions, among a lowered step's flattened arguments, of those its module
    takes: JAX leaves out the arguments the step does not read."""
    return sorted(lowered._lowering.compile_args["kept_var_idx"])


def result_avals(lowered) -> list:
    """A lowered step's flattened results as JAX's own call returns them, weak
    types included (`Lowered.out_info` drops them: a weakly typed step counter
    would come back strong, a new signature on the next call)."""
    avals = lowered._lowering.compile_args.get("global_out_avals")
    return list(avals) if avals is not None else jax.tree_util.tree_leaves(lowered.out_info)


def with_aliases_of(module: HloModule, executable) -> HloModule:
    """`module` (a rewrite of a step's module) with the input/output aliases
    that XLA gave the step's own compile, `executable`: the same arguments'
    buffers reused for the same results. A multi-process step names only its
    donated parameters (`buffer_donor`), which XLA's compile resolves into
    aliases and the HLO-to-StableHLO import drops; the rewritten module has the
    step's parameters and results, so it takes the resolved aliases instead."""
    compiled = executable.runtime_executable().hlo_modules()[0].as_serialized_hlo_module_proto()
    aliases = type(module.proto).FromString(compiled).input_output_alias
    if aliases == module.proto.input_output_alias and not module.proto.buffer_donor:
        return module
    proto = type(module.proto).FromString(module.to_bytes())
    proto.input_output_alias = aliases
    proto.ClearField("buffer_donor")
    return HloModule(proto, module.source, module.file_format)


def standing_in_for(
    module: HloModule, lowered, executable, disabled_passes: Sequence[str] = ()
) -> RewrittenStep:
    """`module` compiled to stand in for the `lowered` step, whose own compile is
    `executable`; call it with the kept arguments (`kept_arguments`)."""
    avals = jax.tree_util.tree_leaves(lowered.in_avals)
    return RewrittenStep(
        module,
        jax.tree_util.tree_leaves(executable.input_shardings),
        [avals[i] for i in kept_arguments(lowered)],
        jax.tree_util.tree_leaves(executable.output_shardings),
        result_avals(lowered),
        disabled_passes,
    )


def peak_bytes(stats) -> int:
    """The most memory a program's buffers take on one device, as XLA accounts
    it: arguments, results and temporaries, less the results that reuse a
    donated argument's buffer."""
    return (
        stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        + stats.temp_size_in_bytes
        - stats.alias_size_in_bytes
    )


MEMORY_TOLERANCE = 0.02  # of the original's peak: what a rewrite of a donating step may add


def check_memory(original_stats, rewritten_stats) -> None:
    """Raise MemoryMismatch when the rewritten program of a step that donates
    its arguments (a loop that watches its memory) holds more than
    MEMORY_TOLERANCE more than the original's peak (`peak_bytes`): when it
    reuses fewer donated buffers, or its all-reduce buckets need more room.
    A step that donates nothing keeps two copies of its state anyway, and its
    rewrite is not held to this."""
    if not original_stats.alias_size_in_bytes:
        return
    original, rewritten = peak_bytes(original_stats), peak_bytes(rewritten_stats)
    if rewritten > (1 + MEMORY_TOLERANCE) * original:
        raise MemoryMismatch(
            f"the rewritten program needs {rewritten / original - 1:.1%} more device memory "
            f"than the original ({rewritten} bytes against {original}; it reuses "
            f"{rewritten_stats.alias_size_in_bytes} bytes of donated arguments, the original "
            f"{original_stats.alias_size_in_bytes})"
        )


def _parameter_shapes(module: HloModule) -> list[tuple[int, ...]]:
    parameters = sorted(
        (i for i in module.entry.instructions if i.opcode == "parameter"),
        key=lambda i: i.proto.parameter_number,
    )
    return [tuple(p.shape.dims) for p in parameters]


def _result_shapes(module: HloModule) -> list[tuple[int, ...]]:
    return [tuple(leaf.dims) for leaf in module.entry.root.shape.leaves()]


def _check_shard_shapes(what: str, shapes, shardings, avals) -> None:
    """One partition's program takes and gives each device's shard: its shapes
    must be those of the original's shards."""
    if len(shapes) != len(shardings):
        raise ShardingMismatch(
            f"the rewritten step has {len(shapes)} {what}s, the original {len(shardings)}"
        )
    for index, (shape, sharding, aval) in enumerate(zip(shapes, shardings, avals, strict=True)):
        expected = tuple(sharding.shard_shape(tuple(aval.shape)))
        if tuple(shape) != expected:
            raise ShardingMismatch(
                f"{what} {index} is {list(shape)} per device, the original's shard {list(expected)}"
            )


def _check_layouts(what: str, compiled, expected, avals) -> None:
    if len(compiled) != len(expected):
        raise ShardingMismatch(
            f"the rewritten step has {len(compiled)} {what}s, the original {len(expected)}"
        )
    for index, (proto, sharding, aval) in enumerate(zip(compiled, expected, avals, strict=True)):
        if xla_client.HloSharding.from_proto(proto) != sharding._to_xla_hlo_sharding(
            len(aval.shape)
        ):
            raise ShardingMismatch(f"{what} {index} is laid out differently")
