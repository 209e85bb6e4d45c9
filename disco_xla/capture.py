"""Capture the pre-optimisation HLO module of a JAX or TensorFlow function."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from disco_xla.hlo_passes.graph import HloModule


def capture_jax(fn: Callable, *args: Any, **kwargs: Any) -> HloModule:
    """The HLO module of `fn` for these arguments, before XLA optimises it.

    `fn` may be wrapped by `jax.jit` or `jax.pmap` (anything with `.lower`,
    including jit of a shard_map); a plain function is wrapped in `jax.jit`.
    """
    import jax

    lowerable = fn if hasattr(fn, "lower") else jax.jit(fn)
    lowered = lowerable.lower(*args, **kwargs)
    data = lowered.compiler_ir("hlo").as_serialized_hlo_module_proto()
    name = getattr(fn, "__name__", None) or getattr(
        getattr(fn, "__wrapped__", None), "__name__", "fn"
    )
    return HloModule.from_bytes(data, source=f"<jax:{name}>", file_format="memory")


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
