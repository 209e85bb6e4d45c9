"""Capture the HLO module of a JAX or TensorFlow function: before XLA optimises it,
or, for a JAX step that XLA's SPMD partitioner splits, right after partitioning."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from disco_xla.hlo.graph import HloModule

# JAX (and `runtime.xla_runner`, which imports it) and TensorFlow are imported inside
# the functions that use them: `import disco_xla` imports this module and loads neither.


def capture_jax(fn: Callable, *args: Any, **kwargs: Any) -> HloModule:
    """The HLO module of `fn` for these arguments, before XLA optimises it.

    `fn` may be wrapped by `jax.jit` or `jax.pmap` (anything with `.lower`,
    including jit of a shard_map); a plain function is wrapped in `jax.jit`.
    """
    import jax

    lowerable = fn if hasattr(fn, "lower") else jax.jit(fn)
    lowered = lowerable.lower(*args, **kwargs)
    name = getattr(fn, "__name__", None) or getattr(
        getattr(fn, "__wrapped__", None), "__name__", "fn"
    )
    return lowered_module(lowered, f"<jax:{name}>")


def lowered_module(lowered: Any, source: str) -> HloModule:
    """The module of a lowered JAX step: as lowered, or, for a step that XLA's
    SPMD partitioner splits over several devices (a `jax.jit` with sharded
    arguments, whose gradient all-reduces do not exist before partitioning),
    one partition's program after partitioning (`partitioned_module`)."""
    data = lowered.compiler_ir("hlo").as_serialized_hlo_module_proto()
    module = HloModule.from_bytes(data, source=source, file_format="memory")
    if module.needs_partitioning:
        return partitioned_module(lowered, source)
    return module


def partitioned_module(lowered: Any, source: str) -> HloModule:
    """One partition's program of a lowered step, as XLA's SPMD partitioner
    leaves it within JAX's own compile of the step (`xla_runner.after_partitioning`)."""
    from disco_xla.runtime.xla_runner import after_partitioning

    return after_partitioning(
        lambda dump_options: lowered.compile(compiler_options=dump_options), source
    )


def capture_tf(fn: Callable, *args: Any) -> HloModule:
    """The HLO module of a TensorFlow function compiled with XLA, before XLA
    optimises it. A plain function is wrapped in `tf.function(jit_compile=True)`."""
    import tensorflow as tf

    function = (
        fn if hasattr(fn, "experimental_get_compiler_ir") else tf.function(fn, jit_compile=True)
    )
    data = function.experimental_get_compiler_ir(*args)(stage="hlo_serialized")
    name = getattr(function, "__name__", None) or "fn"
    return HloModule.from_bytes(data, source=f"<tf:{name}>", file_format="memory")
