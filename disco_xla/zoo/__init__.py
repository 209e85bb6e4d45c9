"""Real models' data-parallel training steps, to capture as HLO.

JAX (dm-haiku): ResNet-50, VGG-19, Inception-v3, BERT-base, BERT-large,
Transformer-base, GPT-2 small, and a Llama-style LM at TinyLlama 1.1B's and at
Llama-3 8B's shapes (`zoo.llama`: scan over layers, bf16, sharded over data and
FSDP axes; `jax.jit` form only).
TensorFlow (Keras 3): ResNet50, VGG16 and InceptionV3 from keras.applications,
and a BERT-like encoder.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from disco_xla.capture import capture_jax
from disco_xla.hlo.graph import HloModule
from disco_xla.zoo.tf_steps import build_tf_step, capture_tf_step


@dataclass(frozen=True)
class ZooEntry:
    name: str
    framework: str  # 'jax' or 'tf'
    description: str
    published_parameters: int | None  # the figure papers quote, where they quote one


ZOO = (
    ZooEntry("resnet50", "jax", "ResNet-50 (He et al. 2016), 224x224", 25_600_000),
    ZooEntry("vgg19", "jax", "VGG-19 (Simonyan & Zisserman 2015), 224x224", 143_700_000),
    ZooEntry("inception_v3", "jax", "Inception-v3 (Szegedy et al. 2016), 299x299", None),
    ZooEntry("bert_base", "jax", "BERT-base pre-training, sequence 128", 110_000_000),
    ZooEntry("bert_large", "jax", "BERT-large pre-training, sequence 128", 340_000_000),
    ZooEntry("transformer_base", "jax", "Transformer-base encoder-decoder, 37k vocab", None),
    ZooEntry("gpt2_small", "jax", "GPT-2 small language model, sequence 128", 124_000_000),
    ZooEntry(
        "llama",
        "jax",
        "Llama-style LM (TinyLlama 1.1B shapes): scan over layers, bf16, data x FSDP",
        1_100_000_000,
    ),
    ZooEntry(
        "llama3_8b",
        "jax",
        "Llama-style LM (Llama-3 8B shapes, sequence 8192): as llama",
        8_000_000_000,
    ),
    ZooEntry(
        "llama2_7b",
        "jax",
        "Llama-style LM (Llama 2 7B shapes, sequence 4096): as llama",
        6_740_000_000,
    ),
    ZooEntry(
        "llama2_70b",
        "jax",
        "Llama-style LM (Llama 2 70B shapes, sequence 4096): as llama",
        69_000_000_000,
    ),
    ZooEntry("resnet50", "tf", "keras.applications.ResNet50", None),
    ZooEntry("vgg16", "tf", "keras.applications.VGG16", None),
    ZooEntry("inception_v3", "tf", "keras.applications.InceptionV3", None),
    ZooEntry("bert_encoder", "tf", "BERT-like encoder in Keras layers, classification", None),
)


# The Llama-style models: `jax.jit` over a data x FSDP mesh only.
LLAMA_MODELS = ("llama", "llama3_8b", "llama2_7b", "llama2_70b")


def zoo_entry(name: str, framework: str) -> ZooEntry:
    for entry in ZOO:
        if entry.name == name and entry.framework == framework:
            return entry
    raise KeyError(f"{framework}:{name}")


@dataclass(frozen=True)
class Capture:
    module: HloModule
    parameter_tensors: int
    parameter_count: int


def capture_model(
    name: str,
    framework: str,
    replicas: int,
    size: str = "tiny",
    batch: int | None = None,
    mode: str = "pmap",
    on_stage: Callable[[str], None] = lambda stage: None,
    precision: str = "f32",
    fsdp: int | None = None,
    sequence: int | None = None,
) -> Capture:
    """Capture a zoo model's data-parallel training step.

    `batch` is the global batch (default two examples per replica). JAX needs
    `replicas` CPU devices; full sizes are lowered from shapes only. `on_stage`
    is told when each stage starts ('build', 'lower'). `precision='bf16'` gives
    a JAX model's mixed-precision variant (`jax_steps`; Llama is bf16 already).
    For the Llama models, `fsdp` devices make up the mesh's FSDP axis (default 2
    when `replicas` is even, else 1) and `sequence` sets the tokens a sequence.
    """
    batch = batch or 2 * replicas
    if framework == "jax":
        # The JAX models import haiku and optax (~0.3 s): only when one is built.
        from disco_xla.zoo.jax_steps import build_jax_step

        on_stage("build")
        if name in LLAMA_MODELS:
            from disco_xla.zoo.llama import build_llama_step

            if mode != "sharded":
                raise ValueError(f"{name} is written for jax.jit over a mesh: use --mode sharded")
            if fsdp is None:
                fsdp = 2 if replicas % 2 == 0 else 1
            fn, args, tensors, count = build_llama_step(
                size, replicas, batch, fsdp, False, model=name, sequence=sequence
            )
            on_stage("lower")
            return Capture(capture_jax(fn, *args), tensors, count)
        step = build_jax_step(
            name, size, replicas, batch, mode, concrete=False, precision=precision
        )
        on_stage("lower")
        module = capture_jax(step.fn, *step.args)
        return Capture(module, step.parameter_tensors, step.parameter_count)
    if framework == "tf":
        if batch % replicas:
            raise ValueError(f"the batch {batch} does not split over {replicas} replicas")
        on_stage("build")
        step = build_tf_step(name, size, batch // replicas)
        on_stage("lower")
        module = capture_tf_step(step, replicas)
        return Capture(module, len(step.variable_names), step.parameter_count)
    raise KeyError(framework)
