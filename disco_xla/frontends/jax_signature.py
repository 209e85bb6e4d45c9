"""What decides a JAX step's program, as `disco_xla.jit` keys its records: the
arguments' tree structure, each leaf's type, shape, dtype and layout over
devices, and the static arguments (`Signature`)."""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
from jax._src.array import ArrayImpl

MAX_QUICK_KEYS = 4096  # quick keys kept per step before the table is cleared


class Signature:
    """What decides a step's program: its arguments' tree structure, each
    leaf's `leaf_key`, and the static arguments (`key`); hashed once."""

    __slots__ = ("key", "_hash")

    def __init__(self, key: tuple):
        self.key, self._hash = key, hash(key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Signature) and self.key == other.key

    @property
    def tree(self):
        return self.key[0]


def quick_leaf_key(leaf) -> tuple:
    """A device array's shape, dtype, weak type and sharding object (a
    sharding's hash is kept, its layout is not: `leaf_key` makes that)."""
    if type(leaf) is ArrayImpl:
        return (leaf.shape, leaf.dtype, leaf.weak_type, leaf.sharding)
    if type(leaf) is np.ndarray:  # a host batch, as many loops pass one each step
        return (leaf.shape, leaf.dtype)
    return leaf_key(leaf)


def leaf_key(leaf) -> tuple:
    """What of one argument leaf decides the program: its type, shape, dtype and
    layout (asked of every leaf of every call, so device arrays take the quick
    way)."""
    if isinstance(leaf, jax.Array):
        return (leaf.shape, leaf.dtype, leaf.weak_type, _layout_of(leaf.sharding, leaf.ndim))
    return (type(leaf).__name__, np.shape(leaf), str(getattr(leaf, "dtype", "")), _layout(leaf))


def _layout(leaf) -> Any:
    """How a leaf is laid out over devices, as a hashable key: two shardings that
    place the same shards on the same devices (a pmap's output and its input,
    whose meshes name their axes differently, say) give the same key, so they
    share one first call."""
    sharding = getattr(leaf, "sharding", None)
    if sharding is None:
        return None
    return _layout_of(sharding, len(np.shape(leaf)))


@functools.lru_cache(maxsize=4096)
def _layout_of(sharding, rank: int) -> Any:
    """`_layout`'s key for a sharding of arrays of `rank` dimensions (cached:
    it is asked for every argument of every call)."""
    try:
        return (
            str(sharding._to_xla_hlo_sharding(rank)),
            tuple(device.id for device in sharding._device_assignment),
            sharding.memory_kind,
        )
    except Exception:  # noqa: BLE001 - a sharding of a kind we do not know: as it is
        return sharding
