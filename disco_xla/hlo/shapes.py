"""Array shapes of HLO values: element types, dimensions and byte sizes."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

# XLA's PrimitiveType numbers (xla_data.proto) that code writes by name.
F32_TYPE = 11
TUPLE_TYPE = 13
# XLA's PrimitiveType numbers -> (name, bits per element).
ELEMENT_TYPES: dict[int, tuple[str, int]] = {
    1: ("pred", 8),
    30: ("s1", 1),
    26: ("s2", 2),
    21: ("s4", 4),
    2: ("s8", 8),
    3: ("s16", 16),
    4: ("s32", 32),
    5: ("s64", 64),
    31: ("u1", 1),
    27: ("u2", 2),
    22: ("u4", 4),
    6: ("u8", 8),
    7: ("u16", 16),
    8: ("u32", 32),
    9: ("u64", 64),
    10: ("f16", 16),
    F32_TYPE: ("f32", 32),
    16: ("bf16", 16),
    12: ("f64", 64),
    19: ("f8e5m2", 8),
    28: ("f8e4m3", 8),
    20: ("f8e4m3fn", 8),
    23: ("f8e4m3b11fnuz", 8),
    29: ("f8e3m4", 8),
    24: ("f8e5m2fnuz", 8),
    25: ("f8e4m3fnuz", 8),
    32: ("f4e2m1fn", 4),
    33: ("f8e8m0fnu", 8),
    15: ("c64", 64),
    18: ("c128", 128),
    TUPLE_TYPE: ("tuple", 0),
    14: ("opaque", 0),
    17: ("token", 0),
}


@dataclass(frozen=True)
class Shape:
    """An array shape, or a tuple of shapes when `element_type == "tuple"`."""

    element_type: str
    dims: tuple[int, ...] = ()
    tuple_shapes: tuple[Shape, ...] = ()
    bits_per_element: int = 0

    @property
    def is_tuple(self) -> bool:
        return self.element_type == "tuple"

    # The figures below are computed once per shape object (the cost models ask
    # for them in their inner loops).
    @cached_property
    def elements(self) -> int:
        """Number of elements of an array shape (0 for tuples and tokens)."""
        if self.is_tuple or self.bits_per_element == 0:
            return 0
        return math.prod(max(d, 0) for d in self.dims)

    @cached_property
    def bytes(self) -> int:
        """Size in bytes; a tuple's size is the sum of its leaves."""
        if self.is_tuple:
            return sum(s.bytes for s in self.tuple_shapes)
        return (self.elements * self.bits_per_element + 7) // 8

    def leaves(self) -> list[Shape]:
        """The array shapes inside this shape, depth first."""
        if not self.is_tuple:
            return [self]
        return [leaf for s in self.tuple_shapes for leaf in s.leaves()]

    def __str__(self) -> str:
        return self._text

    @cached_property
    def _text(self) -> str:
        if self.is_tuple:
            return "(" + ", ".join(str(s) for s in self.tuple_shapes) + ")"
        return f"{self.element_type}[{','.join(str(d) for d in self.dims)}]"


def shape_from_proto(proto) -> Shape:
    """Build a `Shape` from a ShapeProto. Unknown element types keep their number."""
    type_number = proto.element_type
    if type_number == TUPLE_TYPE:
        return Shape("tuple", (), tuple(shape_from_proto(s) for s in proto.tuple_shapes))
    name, bits = ELEMENT_TYPES.get(type_number, (f"type{type_number}", 0))
    return Shape(name, tuple(proto.dimensions), (), bits)
