"""What `disco-xla inspect` reports about a module, as one plain dict."""

from __future__ import annotations

from disco_xla.hlo.custom_calls import COSTED_AS, is_library_call, library_call_kind
from disco_xla.hlo.graph import HloModule
from disco_xla.hlo.trip_counts import executions, loop_trip_counts

# Instructions that only name or group values; they move no data of their own.
_STRUCTURAL_OPCODES = frozenset(
    {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all", "call"}
)


def summarize(module: HloModule, largest: int = 5) -> dict:
    """Counts, all-reduces, FLOPs and bytes of a module.

    `bytes` estimates memory traffic: operands read plus results written, over
    the instructions that run as program code, each as often as it runs (a loop
    body once per trip, `trip_counts`).
    """
    histogram = module.opcode_histogram()
    return {
        "file": module.source,
        "format": module.file_format,
        "module": module.name,
        "fingerprint": module.fingerprint,
        "computations": len(module.computations),
        "instructions": module.instruction_count,
        "opcodes": dict(sorted(histogram.items(), key=lambda item: (-item[1], item[0]))),
        **_all_reduce_fields(module, largest),
        "flops": module.total_flops,
        "bytes": _traffic_bytes(module),
        # Each while loop's trip count and where it came from (`trip_counts`).
        "loops": {
            name: {"trip_count": trips.count, "source": trips.source}
            for name, trips in sorted(loop_trip_counts(module).items())
        },
        **module.device_counts(),
        "partitioning": _partitioning(module),
        "library_calls": _library_calls(module),
    }


def _library_calls(module: HloModule) -> dict[str, dict]:
    """Each custom-call target that computes (`custom_calls`): how many calls,
    their FLOPs in one run of each, and how the simulator costs them."""
    found: dict[str, dict] = {}
    for instr in module.instructions():
        if not is_library_call(instr):
            continue
        kind = library_call_kind(instr)
        entry = found.setdefault(
            instr.proto.custom_call_target,
            {"calls": 0, "flops": 0, "kind": kind, "costed_as": COSTED_AS[kind]},
        )
        entry["calls"] += 1
        entry["flops"] += instr.flops
    return dict(sorted(found.items()))


def _all_reduce_fields(module: HloModule, largest: int) -> dict:
    """The summary's counts and bytes of all-reduces and reduce-scatters
    (`HloModule.all_reduces`), all and gradients only, and the `largest` of them."""
    all_reduces = module.all_reduces
    gradients = [a for a in all_reduces if a.is_gradient]
    return {
        "all_reduces": len(all_reduces),
        "reduce_scatters": sum(a.kind == "reduce-scatter" for a in all_reduces),
        "all_reduce_bytes": sum(a.bytes for a in all_reduces),
        "gradient_all_reduces": len(gradients),
        "gradient_all_reduce_bytes": sum(a.bytes for a in gradients),
        "largest_all_reduces": [
            {
                "name": a.name,
                "kind": a.kind,
                "shape": a.shape,
                "bytes": a.bytes,
                "gradient": a.is_gradient,
            }
            for a in sorted(all_reduces, key=lambda a: (-a.bytes, a.name))[:largest]
        ],
    }


def _traffic_bytes(module: HloModule) -> int:
    """Operand bytes read plus result bytes written by the instructions that run
    as program code (not `_STRUCTURAL_OPCODES`), each times the runs of its
    computation in one step (`trip_counts.executions`)."""
    runs = executions(module)
    return sum(
        (instr.output_bytes + instr.operand_bytes) * runs.get(computation.name, 1)
        for computation in module.computations
        if computation.role in ("entry", "program")
        for instr in computation.instructions
        if instr.opcode not in _STRUCTURAL_OPCODES
    )


def _partitioning(module: HloModule) -> str:
    """'as written', 'one partition's program' (after XLA's SPMD partitioner),
    or 'split by XLA's partitioner' (its all-reduces appear only after it)."""
    if module.already_partitioned:
        return "one partition's program"
    if module.needs_partitioning:
        return "split by XLA's partitioner"
    return "as written"


def format_summary(summary: dict) -> str:
    """The human-readable form of `summarize`'s result."""
    lines = [
        f"module        {summary['module']}  ({summary['format']}: {summary['file']})",
        f"computations  {summary['computations']}",
        f"instructions  {summary['instructions']}",
        f"devices       {summary['num_replicas']} replica(s) x "
        f"{summary['num_partitions']} partition(s), {summary['partitioning']}",
        f"flops         {_si(summary['flops'])}FLOP",
        f"bytes         {_si(summary['bytes'])}B accessed (estimate)",
        f"all-reduces   {summary['all_reduces']}, {_si(summary['all_reduce_bytes'])}B "
        f"({summary['gradient_all_reduces']} gradient, "
        f"{_si(summary['gradient_all_reduce_bytes'])}B)"
        + (
            f", of which {summary['reduce_scatters']} reduce-scatter(s)"
            if summary["reduce_scatters"]
            else ""
        ),
    ]
    for entry in summary["largest_all_reduces"]:
        use = "gradient" if entry["gradient"] else "other"
        if entry["kind"] != "all-reduce":
            use += f" {entry['kind']}"
        lines.append(f"  {entry['name']:<24} {entry['shape']:<24} {_si(entry['bytes'])}B  {use}")
    if summary["loops"]:
        loops = ", ".join(
            f"{name} x{loop['trip_count']}"
            + (" (unknown: counted once)" if loop["source"] == "unknown" else "")
            for name, loop in summary["loops"].items()
        )
        lines.append(f"loops         {loops}")
    for target, call in summary["library_calls"].items():
        lines.append(
            f"library call  {target} x{call['calls']}, {_si(call['flops'])}FLOP: "
            f"costed as {call['costed_as']}"
        )
    opcodes = ", ".join(f"{op} {count}" for op, count in summary["opcodes"].items())
    lines.append(f"opcodes       {opcodes}")
    return "\n".join(lines)


def _si(value: float) -> str:
    for unit in ("", "K", "M", "G", "T", "P"):
        if abs(value) < 1000:
            return f"{value:.4g} {unit}"
        value /= 1000
    return f"{value:.4g} E"
