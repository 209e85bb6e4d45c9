"""Every cross-device reduction of a module, all-reduce or reduce-scatter, as
`AllReduce` records (what `HloModule.all_reduces` holds), with which ones
reduce gradients (`gradients.is_gradient_reduction`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from disco_xla.hlo.collectives import (
    collective_bytes,
    collective_kind,
    collective_scope,
    device_groups,
    reduction_kind,
    replica_group_sizes,
)
from disco_xla.hlo.gradients import (
    BackwardCode,
    computations_with_several_call_sites,
    is_gradient_reduction,
)
from disco_xla.hlo.opcodes import REDUCTION_OPCODES

if TYPE_CHECKING:
    from disco_xla.hlo.graph import HloModule


@dataclass(frozen=True)
class AllReduce:
    """What the IR knows about one cross-device reduction: an all-reduce, or a
    reduce-scatter (`kind`)."""

    name: str
    computation: str
    shape: str
    bytes: int  # the whole buffer reduced (`collective_bytes`)
    tensors: int  # operands reduced together (1 unless variadic)
    reduction: str  # 'sum', 'max', 'min', 'product' or the reducer's root opcode
    group_size: int | None  # devices per replica group; None means all devices
    scope: str  # 'replica' (no channel), 'partition', or 'global' device ids
    is_gradient: bool
    groups: tuple = ()  # the device groups, as device-id tuples (() : one group of all)
    kind: str = "all-reduce"  # or 'reduce-scatter' (`collective_kind`)


def cross_device_reductions(module: HloModule) -> list[AllReduce]:
    """Every all-reduce and reduce-scatter of `module`, in computation order."""
    backward = BackwardCode(module)
    shared = computations_with_several_call_sites(module)
    found = []
    for computation in module.computations:
        for instr in computation.instructions:
            if instr.opcode not in REDUCTION_OPCODES:
                continue
            reduction = reduction_kind(instr)
            group_size, _ = replica_group_sizes(instr.proto)
            cross_device = group_size is None or group_size > 1
            found.append(
                AllReduce(
                    name=instr.name,
                    computation=computation.name,
                    shape=str(instr.shape),
                    bytes=collective_bytes(instr),
                    tensors=len(instr.operands),
                    reduction=reduction,
                    group_size=group_size,
                    scope=collective_scope(instr.proto),
                    is_gradient=is_gradient_reduction(
                        instr, reduction == "sum" and cross_device, backward, shared
                    ),
                    groups=device_groups(instr.proto),
                    kind=collective_kind(instr),
                )
            )
    return found
