"""`disco-xla capture`: capture a zoo model's data-parallel training step."""

from __future__ import annotations

import argparse
import json
import time

import jax

from disco_xla.cli.progress import StageProgress
from disco_xla.errors import DiscoInputError
from disco_xla.hlo.hlo_io import save_module
from disco_xla.zoo import LLAMA_MODELS, ZOO, capture_model, zoo_entry


def add_parser(commands, common: argparse.ArgumentParser) -> None:
    capture = commands.add_parser(
        "capture", parents=[common], help="capture a zoo model's data-parallel training step"
    )
    capture.add_argument("--list", action="store_true", help="list the models")
    capture.add_argument("--model", help="a name from --list")
    capture.add_argument("--framework", choices=["jax", "tf"], default="jax")
    capture.add_argument("--replicas", type=int, default=2, help="data-parallel devices")
    capture.add_argument("--size", choices=["tiny", "full"], default="tiny")
    capture.add_argument("--batch", type=int, help="global batch (default 2 per replica)")
    capture.add_argument(
        "--mode",
        choices=["pmap", "shard_map", "sharded"],
        default="pmap",
        help="JAX: pmap, jit+shard_map, or jit with sharded arguments (captured after "
        "XLA's SPMD partitioning)",
    )
    capture.add_argument(
        "--precision",
        choices=["f32", "bf16"],
        default="f32",
        help="JAX: bf16 computes with bf16 copies of f32 parameters and all-reduces "
        "bf16 gradients (mixed precision)",
    )
    capture.add_argument(
        "--fsdp",
        type=int,
        help="llama models: devices on the mesh's FSDP axis, the rest on its data axis "
        "(default 2 when --replicas is even, else 1)",
    )
    capture.add_argument(
        "--sequence", type=int, help="llama models: tokens a sequence (default the size's own)"
    )
    capture.add_argument("-o", "--output", help="where to write the module (.pb, .txt, ...)")
    capture.add_argument("--json", action="store_true", help="print one JSON object, no progress")
    capture.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.list:
        for entry in ZOO:
            print(f"{entry.framework:<4} {entry.name:<18} {entry.description}")
        return 0
    _check_arguments(args)
    # The capture runs on this many host CPU devices; no GPU, weights or data needed.
    jax.config.update("jax_num_cpu_devices", args.replicas)

    start = time.perf_counter()
    with StageProgress(["build", "lower", "write"], quiet=args.json) as progress:
        captured = capture_model(
            args.model,
            args.framework,
            args.replicas,
            args.size,
            args.batch,
            args.mode,
            on_stage=progress.stage,
            precision=args.precision,
            fsdp=args.fsdp,
            sequence=args.sequence,
        )
        progress.stage("write")
        save_module(captured.module, args.output)
    report = _report(args, captured, time.perf_counter() - start)
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"wrote {args.output}: {args.framework} {args.model} ({args.size}), "
            f"{captured.parameter_count:,} parameters, {report['instructions']} instructions, "
            f"{report['gradient_all_reduces']} gradient all-reduces for "
            f"{captured.parameter_tensors} parameter tensors, {report['capture_s']:.1f} s"
        )
    return 0


def _check_arguments(args: argparse.Namespace) -> None:
    """A one-line error for a model, framework, batch or precision that cannot be captured."""
    if not args.model or not args.output:
        raise DiscoInputError("capture", "--model and -o/--output are required (or --list)")
    try:
        zoo_entry(args.model, args.framework)
    except KeyError:
        names = sorted(e.name for e in ZOO if e.framework == args.framework)
        raise DiscoInputError(
            args.model, f"no {args.framework} model of this name; choose from {', '.join(names)}"
        ) from None
    if args.replicas < 1:
        raise DiscoInputError(args.model, f"--replicas must be at least 1, not {args.replicas}")
    llama = args.model in LLAMA_MODELS
    if llama and args.mode != "sharded":
        raise DiscoInputError(
            args.model,
            "is written for jax.jit over a mesh of data and FSDP axes: use --mode sharded",
        )
    if (args.fsdp is not None or args.sequence is not None) and not llama:
        raise DiscoInputError(args.model, "--fsdp and --sequence apply to the llama models")
    if args.fsdp is not None and (args.fsdp < 1 or args.replicas % args.fsdp):
        raise DiscoInputError(
            args.model, f"--fsdp {args.fsdp} must divide the {args.replicas} replicas"
        )
    if args.sequence is not None and args.sequence < 1:
        raise DiscoInputError(args.model, f"--sequence must be at least 1, not {args.sequence}")
    if args.batch is not None and args.batch % args.replicas:
        raise DiscoInputError(
            args.model, f"the batch {args.batch} must split evenly over {args.replicas} replicas"
        )
    if args.precision != "f32":
        # The JAX models' module imports haiku and optax (~0.3 s): not at start-up.
        from disco_xla.zoo.jax_steps import BF16_MODELS

        if args.framework != "jax" or args.model not in BF16_MODELS:
            raise DiscoInputError(
                args.model,
                "--precision bf16 applies to the JAX transformers (the llama models are "
                "bf16 as written; the CNNs' batch norm needs f32)",
            )


def _report(args: argparse.Namespace, captured, capture_s: float) -> dict:
    """What `--json` prints about the captured step."""
    module = captured.module
    gradients = module.gradient_all_reduces
    return {
        "model": args.model,
        "framework": args.framework,
        "size": args.size,
        "replicas": args.replicas,
        "output": args.output,
        "parameters": captured.parameter_count,
        "parameter_tensors": captured.parameter_tensors,
        "gradient_all_reduces": len(gradients),
        "gradient_bytes": sum(a.bytes for a in gradients),
        "instructions": module.instruction_count,
        "capture_s": round(capture_s, 3),
    }
