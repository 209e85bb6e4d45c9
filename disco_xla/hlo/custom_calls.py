"""Custom calls: which targets only mark values for XLA's passes, and what the
others compute.

A module from a GPU job calls libraries XLA cannot see into: cuBLAS GEMMs
(`__cublas$gemm`, `__cublas$lt$matmul`), cuDNN convolutions and fused attention
(`__cudnn$conv...`, `__cudnn$fmha...`), Transformer Engine's FFI kernels
(`te_fused_attn_forward_ffi`), Triton kernels. Each such library call is a
kernel of its own: it fuses with nothing, and its time comes from its operands
and its target (`library_call_kind`):

- `gemm`: a dot, 2·M·N·K FLOPs, from the backend config's dot dimensions (else
  the left operand's last dimension contracted);
- `convolution`: as XLA's convolution, from its window and dimension labels;
- `attention-forward`: 4·B·H·S_q·S_kv·D FLOPs (two matrix products) from the
  query (operand 0, [batch, sequence, heads, head size]) and the key's sequence
  length (operand 1, dimension 1); `attention-backward` 2.5 times that (the
  convention of FlashAttention-2's paper, Dao 2023);
- `other`: no FLOPs known; its time is its bytes at the memory roofline.

Markers (`is_marker`: the partitioner's sharding annotations, host offload and
layout marks) compute nothing and are not kernels.

An analysis over the IR (`graph`); it changes nothing.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from disco_xla.hlo.graph import Instruction

# Targets (exact, or by prefix where they end in '.' or '$') that mark values.
_MARKER_TARGETS = frozenset(
    {
        "Sharding",
        "SPMDFullToShardShape",
        "SPMDShardToFullShape",
        "ShardBarrierFrom",
        "ShardBarrierTo",
        "annotate_device_placement",
        "MoveToHost",
        "MoveToDevice",
        "LayoutConstraint",
        "InspectSharding",
        "X64Combine",
        "X64SplitLow",
        "X64SplitHigh",
    }
)
_MARKER_PREFIXES = ("xla.sdy.",)
_GEMM_PREFIXES = ("__cublas$gemm", "__cublas$lt$matmul", "__onednn$matmul", "__cudnn$gemm")
_CONVOLUTION_PREFIXES = ("__cudnn$conv", "__onednn$convolution")
_ATTENTION_WORDS = ("fmha", "fused_attn", "flash_attn", "flash_attention", "dot_product_attention")
_BACKWARD_WORDS = ("backward", "bwd")
KINDS = ("gemm", "convolution", "attention-forward", "attention-backward", "other")
# How `inspect` describes each kind's cost.
COSTED_AS = {
    "gemm": "a dot: 2*M*N*K FLOPs",
    "convolution": "a convolution: 2*output*window*input-features FLOPs",
    "attention-forward": "attention forward: 4*B*H*S_q*S_kv*D FLOPs",
    "attention-backward": "attention backward: 2.5x the forward's FLOPs",
    "other": "its bytes at the memory roofline",
}


def is_marker(target: str) -> bool:
    """Whether a custom call with this target only marks a value (computes nothing)."""
    return target in _MARKER_TARGETS or target.startswith(_MARKER_PREFIXES)


def is_library_call(instr: Instruction) -> bool:
    """Whether `instr` is a custom call that computes: a kernel of its own."""
    return instr.opcode == "custom-call" and not is_marker(instr.proto.custom_call_target)


def library_call_kind(instr: Instruction) -> str:
    """One of KINDS, from the custom call's target."""
    target = instr.proto.custom_call_target
    lower = target.lower()
    if target.startswith(_GEMM_PREFIXES):
        return "gemm"
    if target.startswith(_CONVOLUTION_PREFIXES):
        return "convolution"
    if any(word in lower for word in _ATTENTION_WORDS):
        backward = any(word in lower for word in _BACKWARD_WORDS)
        return "attention-backward" if backward else "attention-forward"
    return "other"


def library_call_flops(instr: Instruction, convolution_flops) -> int:
    """The FLOPs of a library call by its kind (the module docstring);
    `convolution_flops(instr, output_elements)` prices a convolution."""
    kind = library_call_kind(instr)
    operands = [o.shape.dims for o in instr.operands]
    leaves = instr.shape.leaves()
    output = leaves[0].elements if leaves else 0  # a GEMM's result, before its workspace
    if kind == "gemm" and operands:
        return 2 * output * _contracted(instr, operands[0])
    if kind == "convolution":
        return convolution_flops(instr, output)
    if kind.startswith("attention") and len(operands) >= 2 and operands[0]:
        query, key = operands[0], operands[1]
        key_length = key[1] if len(key) == 4 else (key[-2] if len(key) >= 2 else 1)
        forward = 4 * math.prod(max(d, 0) for d in query) * max(key_length, 0)
        return forward if kind == "attention-forward" else forward * 5 // 2
    return 0


def _contracted(instr: Instruction, lhs: tuple[int, ...]) -> int:
    """The contracted size of a GEMM's left operand: the dimensions its
    backend config names, else the last."""
    numbers = _backend_config(instr).get("gemm_backend_config", {}).get("dot_dimension_numbers")
    dims = [int(d) for d in (numbers or {}).get("lhs_contracting_dimensions", [])]
    if not dims and lhs:
        dims = [len(lhs) - 1]
    return math.prod(max(lhs[d], 0) for d in dims if 0 <= d < len(lhs))


def _backend_config(instr: Instruction) -> dict:
    try:
        found = json.loads(instr.proto.backend_config or b"{}")
    except (ValueError, UnicodeDecodeError):
        return {}
    return found if isinstance(found, dict) else {}
