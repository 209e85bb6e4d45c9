"""Run an HLO module inside TensorFlow, through the XlaCallModule op.

The module is converted to StableHLO (`hlo_to_stablehlo`), serialised as a
portable artifact (StableHLO 1.0.0), and called with
`tf2xla.python.xla.call_module(..., version=10)`. The op takes the entry
parameters in parameter-number order and gives the leaves of the entry result
(one output for an array result, one per element for a flat tuple); its output
dtypes and shapes (`Tout`, `Sout`) come from the module's result shape. Running a
module captured from a `tf.function(jit_compile=True)` this way gives outputs
bit-equal to the function's.

StableHLO has no `copy` (an HLO layout change: the identity on values), and the
portable artifact rejects the `mhlo.copy` that `hlo_to_stablehlo` leaves for it;
TF modules that assign variables end in such copies. So the module is converted
with every `copy` written as a `reshape` to the same shape, which is also the
identity on values.

`resource_updates` reads which outputs of a module captured from TensorFlow are
new values of variables (TF's `input_output_alias`: output index -> parameter).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from jax._src.lib import _jax

from disco_xla.hlo.graph import HloModule
from disco_xla.hlo.shapes import Shape

# TensorFlow is optional (the `tf` extra): each function imports it where it uses it.

STABLEHLO_TARGET = "1.0.0"
CALL_MODULE_VERSION = 10

# XLA element type -> TensorFlow dtype name.
_TF_DTYPE_NAMES = {
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
    "bf16": "bfloat16",
    "f32": "float32",
    "f64": "float64",
    "c64": "complex64",
    "c128": "complex128",
}


class UnsupportedModule(ValueError):
    """The module cannot run through call_module (e.g. a tuple parameter)."""


def tf_dtype(shape: Shape):
    """The TensorFlow dtype of an array shape's elements."""
    import tensorflow as tf

    name = _TF_DTYPE_NAMES.get(shape.element_type)
    if name is None:
        raise UnsupportedModule(f"no TensorFlow dtype for XLA element type {shape.element_type}")
    return tf.as_dtype(name)


def entry_parameter_shapes(module: HloModule) -> list[Shape]:
    parameters = [i for i in module.entry.instructions if i.opcode == "parameter"]
    return [p.shape for p in sorted(parameters, key=lambda i: i.proto.parameter_number)]


def entry_result_shapes(module: HloModule) -> list[Shape]:
    """The leaves call_module returns: the root's shape, or its flat tuple's elements."""
    root = module.entry.root
    if root is None:
        raise UnsupportedModule("the entry computation has no root")
    if not root.shape.is_tuple:
        return [root.shape]
    if any(element.is_tuple for element in root.shape.tuple_shapes):
        raise UnsupportedModule("the entry returns a nested tuple")
    return list(root.shape.tuple_shapes)


@dataclass(frozen=True)
class ResourceUpdate:
    output_index: int  # position among the entry result's leaves
    parameter_number: int  # the entry parameter holding the variable's old value


def resource_updates(module: HloModule) -> list[ResourceUpdate]:
    """The module's `input_output_alias` entries, in output order. tf2xla writes
    one for every variable the function assigns: the output is the variable's
    new value, the parameter its old one. Read through TensorFlow's own schema
    (our IR keeps the field but does not declare it)."""
    from tensorflow.compiler.xla.service import hlo_pb2

    proto = hlo_pb2.HloModuleProto.FromString(module.to_bytes())
    updates = []
    for entry in proto.input_output_alias.entries:
        if len(entry.output_shape_index) != 1 or len(entry.parameter_shape_index) != 0:
            raise UnsupportedModule(
                "an alias inside a tuple: output "
                f"{list(entry.output_shape_index)}, parameter {list(entry.parameter_shape_index)}"
            )
        updates.append(
            ResourceUpdate(int(entry.output_shape_index[0]), int(entry.parameter_number))
        )
    return sorted(updates, key=lambda u: u.output_index)


def _copies_as_reshapes(module: HloModule) -> bytes:
    """The module's bytes with every `copy` instruction turned into a `reshape` to
    its own shape (the module itself is left alone; the copy edits the proto
    alone, without building a graph view of it)."""
    changed = type(module.proto)()
    changed.CopyFrom(module.proto)
    for computation in changed.computations:
        for instruction in computation.instructions:
            if instruction.opcode == "copy":
                instruction.opcode = "reshape"
    return changed.SerializeToString(deterministic=True)


class CallModuleProgram:
    """`module` as a TensorFlow computation: `call(inputs)` adds the call_module
    op (in eager mode or inside a trace), `__call__(*inputs)` runs it compiled
    (`tf.function(jit_compile=True)`). Inputs are the entry parameters' values
    in parameter-number order; outputs are the result's leaves."""

    def __init__(self, module: HloModule, platforms: Sequence[str] = ("CPU",)):
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import tensorflow as tf

        self.name = module.name
        self.parameter_shapes = entry_parameter_shapes(module)
        if any(shape.is_tuple for shape in self.parameter_shapes):
            raise UnsupportedModule("an entry parameter is a tuple")
        self.result_shapes = entry_result_shapes(module)
        self.parameter_dtypes = [tf_dtype(shape) for shape in self.parameter_shapes]
        self.result_dtypes = [tf_dtype(shape) for shape in self.result_shapes]
        self._platforms = list(platforms)
        stablehlo = _jax.mlir.hlo_to_stablehlo(_copies_as_reshapes(module))
        self._artifact = _jax.mlir.serialize_portable_artifact(stablehlo, STABLEHLO_TARGET)
        self._compiled = tf.function(self._call_unpacked, jit_compile=True, autograph=False)

    def call(self, inputs: Sequence) -> list:
        """The call_module op on `inputs`: one tensor per result leaf."""
        import tensorflow as tf
        from tensorflow.compiler.tf2xla.python import xla as tf2xla

        if len(inputs) != len(self.parameter_shapes):
            raise ValueError(
                f"{self.name} takes {len(self.parameter_shapes)} inputs, got {len(inputs)}"
            )
        outputs = tf2xla.call_module(
            list(inputs),
            version=CALL_MODULE_VERSION,
            module=self._artifact,
            Tout=self.result_dtypes,
            Sout=[tf.TensorShape(shape.dims) for shape in self.result_shapes],
            platforms=self._platforms,
        )
        return list(outputs)

    def _call_unpacked(self, *inputs):
        return self.call(inputs)

    def __call__(self, *inputs) -> list:
        """Run the module compiled by TensorFlow's XLA (traced once per input signature)."""
        return list(self._compiled(*inputs))
