"""Full-size zoo captures and their XLA compiles, cached under `build/` (git-ignored).

Each model is captured once (`disco_xla.zoo.capture_model`, shapes only, nothing
runs) and compiled once by XLA:CPU with its all-reduce combiner off; both modules
are written as `.hlo.pb` and read back on later runs. Call `use_devices(n)` before
anything touches JAX's backend.
"""

from __future__ import annotations

import os
import time

CACHE_DIR = os.path.join("build", "search_table")
# Global batch per replica: 32 images, or 8 sequences of 128 tokens (as zoo_table).
IMAGES_PER_REPLICA, SEQUENCES_PER_REPLICA = 32, 8
CNNS = ("resnet50", "vgg19", "inception_v3")


def use_devices(count: int) -> None:
    import jax

    jax.config.update("jax_num_cpu_devices", count)


def captured_and_compiled(model: str, replicas: int = 8, directory: str = CACHE_DIR):
    """(captured module, compiled module, seconds spent capturing and compiling now)."""
    from disco_xla.hlo.hlo_io import load_module, save_module

    os.makedirs(directory, exist_ok=True)
    per_replica = IMAGES_PER_REPLICA if model in CNNS else SEQUENCES_PER_REPLICA
    stem = os.path.join(directory, f"{model}.full.r{replicas}.b{per_replica}")
    captured_path, compiled_path = stem + ".hlo.pb", stem + ".compiled.hlo.pb"
    started = time.perf_counter()
    if os.path.exists(captured_path):
        captured = load_module(captured_path)
    else:
        from disco_xla.zoo import capture_model

        captured = capture_model(model, "jax", replicas, "full", per_replica * replicas).module
        save_module(captured, captured_path)
        captured = load_module(captured_path)
    if os.path.exists(compiled_path):
        compiled = load_module(compiled_path)
    else:
        from disco_xla.runtime.xla_runner import NO_COMBINER, compile_module

        compiled = compile_module(captured, NO_COMBINER)
        save_module(compiled, compiled_path)
    return captured, compiled, time.perf_counter() - started
