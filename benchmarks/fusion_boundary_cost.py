"""What a fusion boundary costs: XLA's own fusion enforced through our rewrite.

For each model it captures the data-parallel step (pmap over 4 CPU devices, in
one process), maps XLA's own kernels back onto it (`xla_fusion_plan`, combiner
off) and rewrites the module to enforce exactly those groups, in several ways:

- `every-group`: every group outlined into its own non-inlineable call (the
  mechanism before issue 15);
- `library-groups`: only the groups that hold a convolution or a dot;
- `other-groups`: only the groups that hold neither;
- `departures`: what `fusion_boundaries` does now: only groups XLA would not
  form by itself, never a library op. For XLA's own plan that is no call at all.

Each is run against the original compiled with the combiner off
(`xla-nocombine`) on the same random inputs, paired and alternating
(`runtime.candidate_timing.verify_rewrite`), and the outputs compared. It also counts the
compiled programs' instructions by opcode (what the boundaries add: copies,
transposes, calls), and with `--trace` sums the profiler's per-thunk times by
opcode for the original and `every-group` (which kernels slow down).

    .venv/bin/python benchmarks/fusion_boundary_cost.py [--models resnet50 gpt2_small
        keras:MobileNetV2] [--rounds 7] [--trace] [--json]

Models: the JAX zoo's names (tiny, batch 8); `sharded:NAME` for the same step as
`jax.jit` over sharded arguments (captured after XLA's SPMD partitioning, run as
replicas), and `sharded:llama` for the Llama-style model (data x FSDP mesh);
`bf16:NAME` for a transformer's mixed-precision variant (pmap, bf16 gradients);
`tf:NAME` for a TF zoo step (tiny,
batch 2, with our inserted all-reduces over 4 replicas); or `keras:NAME` for a
`keras.applications` model (Keras on JAX, no weights, 96x96 images, 2 per
device, SGD), e.g. keras:MobileNetV2, keras:Xception, keras:EfficientNetB0,
keras:DenseNet121. Keras runs on one backend per process, so `tf:` and `keras:`
models go in separate runs. `--variants` picks some of the variants.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter, defaultdict

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
DEVICES = 4
VARIANTS = ("every-group", "library-groups", "other-groups", "departures")
# Opcodes whose count in the compiled program is reported.
COUNTED_OPCODES = ("fusion", "call", "copy", "transpose", "convolution", "dot", "custom-call")


def keras_step(name: str):
    """A pmap'd SGD step of `keras.applications.NAME` (no weights): (fn, args)."""
    import jax
    import jax.numpy as jnp
    import keras
    import numpy as np

    model = getattr(keras.applications, name)(weights=None, input_shape=(96, 96, 3), classes=10)
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]

    def step(trainable, non_trainable, images, labels):
        def loss_fn(trainable):
            logits, state = model.stateless_call(trainable, non_trainable, images, training=True)
            loss = jnp.mean(keras.losses.sparse_categorical_crossentropy(labels, logits))
            return loss, state

        (loss, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable)
        grads = jax.lax.pmean(grads, "data")
        updated = [w - 0.01 * g for w, g in zip(trainable, grads, strict=True)]
        return updated, state, jax.lax.pmean(loss, "data")

    rng = np.random.default_rng(0)
    replicated = jax.tree_util.tree_map(
        lambda x: jnp.broadcast_to(x, (DEVICES, *x.shape)), (trainable, non_trainable)
    )
    images = rng.standard_normal((DEVICES, 2, 96, 96, 3)).astype(np.float32)
    labels = rng.integers(0, 10, (DEVICES, 2))
    fn = jax.pmap(step, axis_name="data", devices=jax.devices()[:DEVICES])
    return fn, (*replicated, images, labels)


def captured(name: str):
    """The model's step as our IR, calls inlined as the planner sees it."""
    from disco_xla.driver.planning import prepared
    from disco_xla.hlo.graph import HloModule

    if name.startswith("tf:"):
        from disco_xla.zoo.tf_steps import build_tf_step, capture_tf_step

        step = build_tf_step(name.split(":", 1)[1], "tiny", batch=2)
        return prepared(capture_tf_step(step, replicas=DEVICES))
    if name.startswith("sharded:"):
        # jax.jit with sharded arguments: captured after XLA's SPMD partitioning.
        from disco_xla.capture import capture_jax
        from disco_xla.zoo.jax_steps import build_jax_step

        model = name.split(":", 1)[1]
        if model == "llama":
            from disco_xla.zoo.llama import build_llama_step

            fn, args, _, _ = build_llama_step("tiny", DEVICES, 2 * DEVICES, fsdp=2)
            return prepared(capture_jax(fn, *args))
        step = build_jax_step(model, "tiny", DEVICES, 2 * DEVICES, mode="sharded")
        return prepared(capture_jax(step.fn, *step.args))
    if name.startswith("bf16:"):
        from disco_xla.zoo.jax_steps import build_jax_step

        model = name.split(":", 1)[1]
        step = build_jax_step(model, "tiny", DEVICES, 2 * DEVICES, precision="bf16")
        fn, args = step.fn, step.args
    elif name.startswith("keras:"):
        fn, args = keras_step(name.split(":", 1)[1])
    else:
        from disco_xla.zoo.jax_steps import build_jax_step

        step = build_jax_step(name, "tiny", replicas=DEVICES, global_batch=2 * DEVICES)
        fn, args = step.fn, step.args
    raw = fn.lower(*args).compiler_ir("hlo").as_serialized_hlo_module_proto()
    return prepared(HloModule.from_bytes(raw, name, "memory"))


def opcode_counts(module) -> dict[str, int]:
    from disco_xla.runtime.xla_runner import NO_COMBINER, compile_module

    counts = Counter(i.opcode for i in compile_module(module, NO_COMBINER).instructions())
    return {opcode: counts[opcode] for opcode in COUNTED_OPCODES}


def traced_time_by_opcode(module, runs: int = 3) -> dict[str, float]:
    """Seconds per step of the profiler's thunks, summed by the opcode of the
    compiled instruction each is named after (over every device)."""
    from disco_xla.runtime.candidate_timing import _inputs
    from disco_xla.runtime.xla_runner import NO_COMBINER, program_for, random_arguments
    from disco_xla.timing import traced_events

    program = program_for(module, DEVICES, NO_COMBINER)
    opcode_of = {i.name: i.opcode for i in program.compiled_module().instructions()}
    run = program.device_runner(_inputs(program, random_arguments(program.parameters, 0)))
    run()
    totals: dict[str, float] = defaultdict(float)
    for name, stats, seconds in traced_events(run, runs, ("/host:CPU",)):
        op = stats.get("hlo_op", name)
        if op in opcode_of:
            totals[opcode_of[op]] += seconds / runs
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def measure(name: str, rounds: int, trace: bool, variants=VARIANTS) -> dict:
    from disco_xla.driver.checked_rewrite import xla_own_groups
    from disco_xla.plan import EXPENSIVE_OPCODES, departing_groups
    from disco_xla.runtime.apply import apply_plan
    from disco_xla.runtime.candidate_timing import verify_rewrite
    from disco_xla.runtime.xla_runner import NO_COMBINER, compile_module
    from disco_xla.search.xla_fusion import xla_fusion_plan

    module = captured(name)
    own = xla_fusion_plan(module, compile_module(module, NO_COMBINER))
    by_name = {i.name: i for i in module.instructions()}

    def has_library_op(group) -> bool:
        return any(by_name[n].opcode in EXPENSIVE_OPCODES for n in group)

    row = {
        "model": name,
        "groups": len(own.fusion_groups),
        "library_groups": sum(map(has_library_op, own.fusion_groups)),
        "xla-nocombine": {"opcodes": opcode_counts(module)},
    }
    for variant in variants:
        if variant == "departures":
            left_to_xla = xla_own_groups(module)
            rewritten = apply_plan(module, own, check=False, left_to_xla=left_to_xla)
            calls = len(departing_groups(module, own, left_to_xla))
        else:
            keep = {
                "every-group": lambda g: True,
                "library-groups": has_library_op,
                "other-groups": lambda g: not has_library_op(g),
            }[variant]
            # Outlined by the pass's own mechanism, library ops included.
            rewritten = _outline_every(module, own, keep)
            calls = sum(map(keep, own.fusion_groups))
        comparison = verify_rewrite(module, rewritten, DEVICES, rounds)
        row[variant] = {
            "calls": calls,
            "identical_program": rewritten.fingerprint == module.fingerprint,
            "speed_vs_xla_nocombine": comparison.original_s / comparison.rewritten_s,
            "bit_equal": comparison.bit_equal,
            "equal": comparison.equal,
            "max_rel_diff": comparison.max_rel_diff,
            "opcodes": opcode_counts(rewritten),
        }
        print(f"  {name} {variant}: {row[variant]}", file=sys.stderr, flush=True)
    if trace and "every-group" in variants:
        row["xla-nocombine"]["traced_s_by_opcode"] = traced_time_by_opcode(module)
        every = _outline_every(module, own, lambda g: True)
        row["every-group"]["traced_s_by_opcode"] = traced_time_by_opcode(every)
    return row


def _outline_every(module, plan, keep):
    """`module` with each group of `plan` that `keep` accepts outlined into a call
    (library ops too: the outliner itself, below `plan.departing_groups`' rule)."""
    from disco_xla.hlo.graph import HloModule
    from disco_xla.hlo_passes import fusion_boundaries

    copy = HloModule.from_bytes(module.to_bytes(), f"{module.name} outlined")
    fusion_boundaries.OutlineFusionGroups([g for g in plan.fusion_groups if keep(g)]).run(copy)
    return HloModule.from_bytes(copy.to_bytes(), copy.source)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet50", "gpt2_small"])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    prefixes = {name.split(":", 1)[0] for name in args.models if ":" in name}
    if prefixes == {"tf", "keras"}:
        parser.error("tf: and keras: models need separate runs (one Keras backend a process)")
    if "keras" in prefixes:
        os.environ["KERAS_BACKEND"] = "jax"
    import jax

    jax.config.update("jax_num_cpu_devices", DEVICES)
    rows = [measure(name, args.rounds, args.trace, args.variants) for name in args.models]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(
        f"{'model':22s} {'variant':15s} {'calls':>6s} {'speed':>7s}  equal      copies transposes"
    )
    for row in rows:
        base = row["xla-nocombine"]["opcodes"]
        print(
            f"{row['model']:22s} {'xla-nocombine':15s} {0:6d} {1:7.3f}  -          "
            f"{base['copy']:6d} {base['transpose']:10d}"
        )
        for variant in (v for v in VARIANTS if v in row):
            cell = row[variant]
            equal = "bit-equal" if cell["bit_equal"] else f"{cell['max_rel_diff']:.1e}"
            print(
                f"{'':22s} {variant:15s} {cell['calls']:6d} "
                f"{cell['speed_vs_xla_nocombine']:7.3f}  {equal:10s} "
                f"{cell['opcodes']['copy']:6d} {cell['opcodes']['transpose']:10d}"
            )
        for variant in ("xla-nocombine", "every-group"):
            traced = row.get(variant, {}).get("traced_s_by_opcode")
            if traced:
                top = ", ".join(f"{op} {s * 1e3:.2f}" for op, s in list(traced.items())[:6])
                print(f"{'':22s} traced ms/step ({variant}): {top}")


if __name__ == "__main__":
    main()
