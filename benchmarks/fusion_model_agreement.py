"""How often the model of XLA's fusion (`search.fusion_model`) agrees with the
fusion XLA:CPU really makes, on the zoo's JAX steps (tiny, 2 replicas).

For each model: its captured step, XLA's compile of it with the all-reduce
combiner off mapped back onto it (`xla_fusion_plan`), and the model's plan.
Over the data edges between compute instructions it prints the share both fuse
or both cut (`agreement`), and of the edges either fuses, the share both do
(`fused agreement`), then the means.

    .venv/bin/python benchmarks/fusion_model_agreement.py [--models NAME ...] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")

MODELS = ("resnet50", "vgg19", "inception_v3", "bert_base", "transformer_base", "gpt2_small")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from disco_xla.capture import capture_jax
    from disco_xla.driver.planning import prepared
    from disco_xla.runtime.xla_runner import compile_separately
    from disco_xla.search.fusion_model import fusion_agreement, modelled_xla_fusion
    from disco_xla.search.xla_fusion import xla_fusion_plan
    from disco_xla.zoo.jax_steps import JAX_MODELS, build_jax_step

    rows = []
    for name in args.models:
        if name not in JAX_MODELS:
            print(f"skipping {name}: not a zoo JAX model", file=sys.stderr)
            continue
        step = build_jax_step(name, "tiny", replicas=2, global_batch=4)
        module = prepared(capture_jax(step.fn, *step.args))
        xla = xla_fusion_plan(module, compile_separately(module))
        model = modelled_xla_fusion(module)
        found = fusion_agreement(module, xla, model)
        found.update(model=name, xla_kernels=len(xla.fusion_groups))
        found["model_kernels"] = len(model.fusion_groups)
        rows.append(found)
    if args.json:
        print(json.dumps(rows))
        return 0
    print("| model | edges | agreement | fused agreement | XLA's kernels | model's kernels |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(
            f"| {row['model']} | {row['edges']} | {row['agreement']:.3f} | "
            f"{row['fused_agreement']:.3f} | {row['xla_kernels']} | {row['model_kernels']} |"
        )
    if rows:
        mean = sum(r["agreement"] for r in rows) / len(rows)
        fused = sum(r["fused_agreement"] for r in rows) / len(rows)
        print(f"\nmean agreement {mean:.3f}, mean fused agreement {fused:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
