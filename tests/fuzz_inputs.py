"""Deterministic mutations of real modules, for the no-crash, no-hang fuzz test."""

from __future__ import annotations

import random

_TEXT_ALPHABET = "{}()[],=%0123456789 \n-.:_abcdefxyzf32s"


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """Flip, delete, insert or truncate a few bytes of a serialized proto."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        if not out:
            break
        choice = rng.random()
        at = rng.randrange(len(out))
        if choice < 0.4:
            out[at] = rng.randrange(256)
        elif choice < 0.6:
            del out[at : at + rng.randint(1, 16)]
        elif choice < 0.8:
            out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        else:
            del out[at:]
    return bytes(out)


_OPCODES = [
    "dot",
    "convolution",
    "fusion",
    "reduce",
    "reduce-window",
    "all-reduce",
    "while",
    "call",
    "sort",
    "",
    "made-up-op",
    "tuple",
    "get-tuple-element",
]


def mutate_structure(data: bytes, rng: random.Random) -> bytes:
    """Parse a module and corrupt its graph: ids, roots, calls, opcodes, shapes."""
    from disco_xla.hlo.hlo_schema import HloModuleProto

    module = HloModuleProto.FromString(data)
    computation_ids = [c.id for c in module.computations]
    for _ in range(rng.randint(1, 4)):
        computation = rng.choice(module.computations)
        instr = rng.choice(computation.instructions)
        ids = [i.id for i in computation.instructions]
        choice = rng.randrange(10)
        if choice == 0:
            instr.operand_ids.append(rng.choice([instr.id, rng.randrange(1 << 40), *ids]))
        elif choice == 1 and instr.operand_ids:
            instr.operand_ids[0] = rng.choice(ids)  # may close a cycle
        elif choice == 2:
            instr.shape.dimensions.append(rng.choice([-7, 0, 1 << 40, rng.randrange(64)]))
            instr.shape.element_type = rng.randrange(40)
        elif choice == 3:
            instr.opcode = rng.choice(_OPCODES)
        elif choice == 4 and len(computation.instructions) > 1:
            del computation.instructions[rng.randrange(len(computation.instructions))]
        elif choice == 5:
            computation.root_id = rng.choice([rng.randrange(1 << 40), *ids])
        elif choice == 6:
            instr.called_computation_ids.append(
                rng.choice([computation.id, rng.randrange(1 << 40), *computation_ids])
            )
        elif choice == 7:
            module.entry_computation_id = rng.choice([rng.randrange(1 << 40), *computation_ids])
        elif choice == 8:
            instr.dot_dimension_numbers.lhs_contracting_dimensions.append(rng.randint(-3, 9))
            instr.convolution_dimension_numbers.kernel_spatial_dimensions.append(rng.randint(-3, 9))
        else:
            instr.collective_device_list.replica_groups.add().replica_ids.extend(
                rng.sample(range(64), rng.randint(0, 5))
            )
            instr.channel_id = rng.randrange(3)
    return module.SerializeToString()


def mutate_text(text: str, rng: random.Random) -> str:
    """Delete, insert or replace a few characters of HLO text."""
    chars = list(text)
    for _ in range(rng.randint(1, 6)):
        if not chars:
            break
        choice = rng.random()
        at = rng.randrange(len(chars))
        if choice < 0.35:
            del chars[at : at + rng.randint(1, 40)]
        elif choice < 0.7:
            chars.insert(at, rng.choice(_TEXT_ALPHABET))
        else:
            chars[at] = rng.choice(_TEXT_ALPHABET)
    return "".join(chars)


def run_inspect_on_each(paths: list[str]) -> list[dict]:
    """Run `disco-xla inspect --json` in this process on each path; record the
    exit code and what went to stderr."""
    import contextlib
    import io

    from disco_xla.cli import main

    results = []
    for path in paths:
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                code = main(["inspect", path, "--json"])
            except SystemExit as exit_:  # argparse; should not happen here
                code = exit_.code
        results.append({"path": path, "code": code, "stderr": stderr.getvalue()})
    return results


if __name__ == "__main__":
    import json
    import sys

    listing = sys.argv[1]
    with open(listing) as file:
        paths = file.read().split("\n")
    json.dump(run_inspect_on_each([p for p in paths if p]), sys.stdout)
