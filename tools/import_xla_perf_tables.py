"""Turn XLA's measured GPU performance tables into the compact JSON the simulator reads.

The three tables (`../shared/data/xla-gpu-perf-tables/*.txtpb`) are textproto
literals from openxla/xla (Apache License 2.0, Copyright The OpenXLA Authors):

- `collective_perf_table.txtpb`: `xla/service/gpu/model/collective_interpolator_data.h`;
- `matmul_perf_table.txtpb`: `xla/service/gpu/model/matmul_interpolator_data.h`;
- `hlo_op_profiles.txtpb`: `xla/service/gpu/model/hlo_op_profiles_data.h`.

This script keeps their figures only, in `configs/gpu_tables/xla_perf_tables.json`:

- `matmul`: {arch: {dtype key: [[b, m, n, k, flop_per_s], ...]}};
- `collectives`: {arch: [[opcode, elements, element type, groups, devices per group,
  bytes_per_s], ...]};
- `op_cycles`: {arch: {element type: {opcode: clock cycles}}}.

Run: python tools/import_xla_perf_tables.py [TABLE_DIR] [OUT_JSON]
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

_TOKEN = re.compile(r'\s*(?:#[^\n]*|("(?:[^"\\]|\\.)*")|([{}:])|([^\s{}:#"]+))')


def _tokens(text: str):
    for match in _TOKEN.finditer(text):
        string, punct, word = match.groups()
        if string is not None:
            yield ("str", string[1:-1])
        elif punct is not None:
            yield ("punct", punct)
        elif word is not None:
            yield ("word", word)


def parse_textproto(text: str) -> dict:
    """A textproto message as {field: [values]}; a nested message is a dict,
    a scalar is an int, float or str as written."""
    stack: list[dict] = [{}]
    name = None
    for kind, value in _tokens(text):
        if kind == "punct" and value == ":":
            continue
        if kind == "punct" and value == "{":
            child: dict = {}
            stack[-1].setdefault(name, []).append(child)
            stack.append(child)
            name = None
        elif kind == "punct" and value == "}":
            stack.pop()
        elif name is None:
            name = value
        else:
            stack[-1].setdefault(name, []).append(_scalar(kind, value))
            name = None
    return stack[0]


def _scalar(kind: str, value: str):
    if kind == "str":
        return value
    for convert in (int, float):
        try:
            return convert(value)
        except ValueError:
            pass
    return value


def _by_arch(message: dict):
    for entry in message.get("entries", []):
        yield entry["key"][0], entry["value"][0].get("entries", [])


def matmul_table(message: dict) -> dict:
    table: dict = {}
    for arch, entries in _by_arch(message):
        by_dtype: dict = table.setdefault(arch, {})
        for entry in entries:
            shape = [entry[axis][0] for axis in ("b", "m", "n", "k")]
            for pair in entry.get("flops", []):
                by_dtype.setdefault(pair["key"][0], []).append([*shape, pair["value"][0]])
    return table


def collective_table(message: dict) -> dict:
    table: dict = {}
    for arch, entries in _by_arch(message):
        rows = table.setdefault(arch, [])
        for entry in entries:
            instruction = entry["instruction"][0]
            shape = instruction["shape"][0]
            elements = 1
            for size in shape.get("dimensions", []):
                elements *= size
            groups = instruction["collective_device_list"][0]["iota_replica_group_list"][0]
            rows.append(
                [
                    instruction["opcode"][0],
                    elements,
                    shape["element_type"][0].lower(),
                    groups["num_replica_groups"][0],
                    groups["num_devices_per_group"][0],
                    entry["network_throughput_bytes_per_sec"][0],
                ]
            )
    return table


def op_cycles_table(message: dict) -> dict:
    table: dict = {}
    for arch, entries in _by_arch(message):
        by_type = table.setdefault(arch, {})
        for entry in entries:
            instruction = entry["instruction"][0]
            element_type = instruction["shape"][0]["element_type"][0].lower()
            by_type.setdefault(element_type, {})[instruction["opcode"][0]] = entry["clock_cycles"][
                0
            ]
    return table


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parents[1]
    source = Path(argv[0]) if argv else root.parent / "shared" / "data" / "xla-gpu-perf-tables"
    default_out = root / "configs" / "gpu_tables" / "xla_perf_tables.json"
    out = Path(argv[1]) if len(argv) > 1 else default_out
    tables = {
        "source": "openxla/xla xla/service/gpu/model/{collective_interpolator_data.h,"
        "matmul_interpolator_data.h,hlo_op_profiles_data.h} (Apache-2.0, The OpenXLA Authors)",
        "matmul": matmul_table(parse_textproto((source / "matmul_perf_table.txtpb").read_text())),
        "collectives": collective_table(
            parse_textproto((source / "collective_perf_table.txtpb").read_text())
        ),
        "op_cycles": op_cycles_table(
            parse_textproto((source / "hlo_op_profiles.txtpb").read_text())
        ),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(tables, separators=(",", ":"), sort_keys=True) + "\n")
    print(f"wrote {out} ({out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
