"""The kernel-time data set: measured fused kernels and their instruction graphs.

One `.npz` file (numpy's zip of arrays; no pickle) holds many kernel samples. The
graphs are stored flat, as concatenated node and edge arrays with per-graph offsets
(graph g owns nodes `node_offsets[g]:node_offsets[g+1]`; edge endpoints are local
to their graph). Strings are fixed-width unicode arrays. `SCHEMA` names the layout;
a file of another schema is refused with a one-line error.

Per sample: the measured time (seconds; the sum of the kernels XLA emitted for
the group, each the median over repeats), how many kernels that was, the module
and model it came from, the plan kind, the kernel's structural hash, and what the
roofline needs (FLOPs, bytes in and out, element type, op class), and the
machine's speed reference when the sample was timed (`reference_s`, seconds of
the fixed workload in `profiling/speed_reference.py`; NaN in files of schema 3).

`MODEL_FAMILIES` maps each model name a data set may hold to its architecture
family, for leave-one-family-out evaluation (`model_family`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from disco_xla.costmodel.features import ATTRIBUTE_NAMES, MAX_RANK, KernelGraph
from disco_xla.errors import DiscoInputError

SCHEMA = "disco-xla-kernels/4"  # 2: node_attributes; 3: their library columns; 4: reference_s
# Older schemas this version still reads, and the fields they lack (filled with NaN).
_READABLE_SCHEMAS = {"disco-xla-kernels/3": ("reference_s",)}

# Model name (as in a data set: the module file's name up to its first '.') ->
# architecture family. JAX zoo models go by their zoo names; keras.applications
# models as `keras_NAME` (captured as `keras:NAME` by
# benchmarks/collect_cost_model_data.sh), TF zoo models as `tf_NAME`.
# Families overlap in their kernels (EfficientNet and MobileNetV3 have depthwise
# convolutions too): a family is named for what sets it apart.
MODEL_FAMILIES = {
    # JAX zoo (dm-haiku)
    "resnet50": "residual-conv",
    "vgg19": "plain-conv",
    "inception_v3": "inception",
    "bert_base": "encoder-attention",
    "bert_large": "encoder-attention",
    "transformer_base": "encoder-attention",
    "gpt2_small": "decoder-attention",
    "llama": "decoder-attention-rmsnorm-rotary",
    # keras.applications on JAX
    "keras_ResNet50": "residual-conv",
    "keras_VGG16": "plain-conv",
    "keras_VGG19": "plain-conv",
    "keras_InceptionV3": "inception",
    "keras_MobileNet": "depthwise-conv",
    "keras_MobileNetV2": "depthwise-conv",
    "keras_Xception": "depthwise-conv",
    "keras_DenseNet121": "dense-conv",
    "keras_DenseNet169": "dense-conv",
    "keras_EfficientNetB0": "squeeze-excitation",
    "keras_EfficientNetV2B0": "squeeze-excitation",
    "keras_MobileNetV3Small": "squeeze-excitation",
    "keras_ResNeXt26": "grouped-conv",  # built from Keras layers (collect_cost_model_data.sh)
    "keras_NASNetMobile": "nas-cell",
    "keras_ConvNeXtTiny": "convnext",
    # TensorFlow zoo (Keras 3 on TF)
    "tf_resnet50": "residual-conv",
    "tf_vgg16": "plain-conv",
    "tf_inception_v3": "inception",
    "tf_bert_encoder": "encoder-attention",
}


def model_family(model: str) -> str:
    """The family of a data set's model name (`keras:NAME` is read as `keras_NAME`);
    DiscoInputError, one line, for a model `MODEL_FAMILIES` lacks."""
    name = model.replace(":", "_", 1) if model.startswith(("keras:", "tf:")) else model
    try:
        return MODEL_FAMILIES[name]
    except KeyError:
        raise DiscoInputError(
            model,
            "no family for this model; add it to MODEL_FAMILIES in disco_xla/costmodel/dataset.py",
        ) from None


@dataclass(frozen=True)
class KernelSample:
    graph: KernelGraph
    time_s: float
    kernel_count: int  # kernels XLA emitted for the group (0: only its call was timed)
    module: str
    model: str
    plan_kind: str  # 'xla-like', 'unfused', 'random', 'xla-compiled'
    structural_hash: str
    element_type: str
    op_class: str
    reference_s: float = float("nan")  # the speed reference around its timing


@dataclass
class KernelDataset:
    """Flat arrays of many kernel graphs (see the module docstring)."""

    node_opcode: np.ndarray  # [N] str
    node_dtype: np.ndarray  # [N] str
    node_dims: np.ndarray  # [N, MAX_RANK] int64
    node_rank: np.ndarray
    node_flops: np.ndarray
    node_out_bytes: np.ndarray
    node_in_bytes: np.ndarray
    node_is_output: np.ndarray
    node_attributes: np.ndarray  # [N, len(ATTRIBUTE_NAMES)] float64
    edge_sender: np.ndarray  # [E] local node index
    edge_receiver: np.ndarray
    edge_bytes: np.ndarray
    node_offsets: np.ndarray  # [G + 1]
    edge_offsets: np.ndarray  # [G + 1]
    time_s: np.ndarray  # [G]
    kernel_count: np.ndarray
    module: np.ndarray  # [G] str
    model: np.ndarray
    plan_kind: np.ndarray
    structural_hash: np.ndarray
    element_type: np.ndarray
    op_class: np.ndarray
    kernel_flops: np.ndarray
    kernel_bytes_in: np.ndarray
    kernel_bytes_out: np.ndarray
    reference_s: np.ndarray  # [G] seconds; NaN where none was taken

    def __len__(self) -> int:
        return len(self.time_s)

    def graph(self, index: int) -> KernelGraph:
        n0, n1 = self.node_offsets[index], self.node_offsets[index + 1]
        e0, e1 = self.edge_offsets[index], self.edge_offsets[index + 1]
        return KernelGraph(
            opcodes=tuple(str(s) for s in self.node_opcode[n0:n1]),
            dtypes=tuple(str(s) for s in self.node_dtype[n0:n1]),
            dims=self.node_dims[n0:n1],
            ranks=self.node_rank[n0:n1],
            flops=self.node_flops[n0:n1],
            out_bytes=self.node_out_bytes[n0:n1],
            in_bytes=self.node_in_bytes[n0:n1],
            is_output=self.node_is_output[n0:n1],
            attributes=self.node_attributes[n0:n1],
            senders=self.edge_sender[e0:e1],
            receivers=self.edge_receiver[e0:e1],
            edge_bytes=self.edge_bytes[e0:e1],
            kernel_flops=float(self.kernel_flops[index]),
            kernel_bytes_in=float(self.kernel_bytes_in[index]),
            kernel_bytes_out=float(self.kernel_bytes_out[index]),
        )

    def subset(self, indices: Sequence[int] | np.ndarray) -> KernelDataset:
        """The samples at `indices`, in that order."""
        indices = np.asarray(indices, np.int64)
        node_parts = [np.arange(self.node_offsets[g], self.node_offsets[g + 1]) for g in indices]
        edge_parts = [np.arange(self.edge_offsets[g], self.edge_offsets[g + 1]) for g in indices]
        nodes = np.concatenate(node_parts) if node_parts else np.zeros(0, np.int64)
        edges = np.concatenate(edge_parts) if edge_parts else np.zeros(0, np.int64)
        node_counts = np.diff(self.node_offsets)[indices]
        edge_counts = np.diff(self.edge_offsets)[indices]
        values = {}
        for name in _NODE_FIELDS:
            values[name] = getattr(self, name)[nodes]
        for name in _EDGE_FIELDS:
            values[name] = getattr(self, name)[edges]
        for name in _GRAPH_FIELDS:
            values[name] = getattr(self, name)[indices]
        values["node_offsets"] = np.concatenate([[0], np.cumsum(node_counts)]).astype(np.int64)
        values["edge_offsets"] = np.concatenate([[0], np.cumsum(edge_counts)]).astype(np.int64)
        return KernelDataset(**values)


_NODE_FIELDS = (
    "node_opcode",
    "node_dtype",
    "node_dims",
    "node_rank",
    "node_flops",
    "node_out_bytes",
    "node_in_bytes",
    "node_is_output",
    "node_attributes",
)
_EDGE_FIELDS = ("edge_sender", "edge_receiver", "edge_bytes")
_GRAPH_FIELDS = (
    "time_s",
    "kernel_count",
    "module",
    "model",
    "plan_kind",
    "structural_hash",
    "element_type",
    "op_class",
    "kernel_flops",
    "kernel_bytes_in",
    "kernel_bytes_out",
    "reference_s",
)


def from_samples(samples: Sequence[KernelSample]) -> KernelDataset:
    """Pack samples into flat arrays."""
    graphs = [s.graph for s in samples]

    def cat(values, dtype, width=None):
        arrays = [np.asarray(v, dtype) for v in values]
        if not arrays:
            return np.zeros((0, width) if width else 0, dtype)
        return np.concatenate(arrays)

    node_counts = [g.node_count for g in graphs]
    edge_counts = [g.edge_count for g in graphs]
    return KernelDataset(
        node_opcode=np.array([o for g in graphs for o in g.opcodes], dtype=str),
        node_dtype=np.array([d for g in graphs for d in g.dtypes], dtype=str),
        node_dims=cat([g.dims for g in graphs], np.int64, MAX_RANK).reshape(-1, MAX_RANK),
        node_rank=cat([g.ranks for g in graphs], np.int64),
        node_flops=cat([g.flops for g in graphs], np.float64),
        node_out_bytes=cat([g.out_bytes for g in graphs], np.float64),
        node_in_bytes=cat([g.in_bytes for g in graphs], np.float64),
        node_is_output=cat([g.is_output for g in graphs], bool),
        node_attributes=cat([g.attributes for g in graphs], np.float64, len(ATTRIBUTE_NAMES)),
        edge_sender=cat([g.senders for g in graphs], np.int64),
        edge_receiver=cat([g.receivers for g in graphs], np.int64),
        edge_bytes=cat([g.edge_bytes for g in graphs], np.float64),
        node_offsets=np.concatenate([[0], np.cumsum(node_counts)]).astype(np.int64),
        edge_offsets=np.concatenate([[0], np.cumsum(edge_counts)]).astype(np.int64),
        time_s=np.array([s.time_s for s in samples], np.float64),
        kernel_count=np.array([s.kernel_count for s in samples], np.int64),
        module=np.array([s.module for s in samples], dtype=str),
        model=np.array([s.model for s in samples], dtype=str),
        plan_kind=np.array([s.plan_kind for s in samples], dtype=str),
        structural_hash=np.array([s.structural_hash for s in samples], dtype=str),
        element_type=np.array([s.element_type for s in samples], dtype=str),
        op_class=np.array([s.op_class for s in samples], dtype=str),
        kernel_flops=np.array([g.kernel_flops for g in graphs], np.float64),
        kernel_bytes_in=np.array([g.kernel_bytes_in for g in graphs], np.float64),
        kernel_bytes_out=np.array([g.kernel_bytes_out for g in graphs], np.float64),
        reference_s=np.array([s.reference_s for s in samples], np.float64),
    )


def concatenate(datasets: Sequence[KernelDataset]) -> KernelDataset:
    """Several data sets as one."""
    if len(datasets) == 1:
        return datasets[0]
    values = {}
    for name in _NODE_FIELDS + _EDGE_FIELDS + _GRAPH_FIELDS:
        values[name] = np.concatenate([getattr(d, name) for d in datasets])
    for name in ("node_offsets", "edge_offsets"):
        parts, base = [np.zeros(1, np.int64)], 0
        for d in datasets:
            offsets = getattr(d, name)
            parts.append(offsets[1:] + base)
            base += offsets[-1]
        values[name] = np.concatenate(parts)
    return KernelDataset(**values)


def save_dataset(dataset: KernelDataset, path: str) -> None:
    """Write `dataset` as a compressed .npz of SCHEMA."""
    arrays = {name: getattr(dataset, name) for name in dataset.__dataclass_fields__}
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        with open(path, "wb") as file:
            np.savez_compressed(file, schema=np.array(SCHEMA), **arrays)
    except OSError as error:
        raise DiscoInputError(path, f"cannot write the data set ({error.strerror})") from None


def load_dataset(path: str) -> KernelDataset:
    """Read a data set file; DiscoInputError if it is missing, corrupt or of
    another schema."""
    try:
        with np.load(path, allow_pickle=False) as data:
            schema = str(data["schema"]) if "schema" in data.files else "none"
            if schema != SCHEMA and schema not in _READABLE_SCHEMAS:
                raise DiscoInputError(
                    path, f"data set schema {schema!r}, this version reads {SCHEMA!r}"
                )
            absent = _READABLE_SCHEMAS.get(schema, ())
            values = {
                name: data[name]
                for name in KernelDataset.__dataclass_fields__
                if name not in absent
            }
            for name in absent:
                values[name] = np.full(len(values["time_s"]), np.nan)
    except DiscoInputError:
        raise
    except FileNotFoundError:
        raise DiscoInputError(path, "no such data set file") from None
    except (OSError, ValueError, KeyError, EOFError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise DiscoInputError(path, f"not a kernel data set ({message})") from None
    dataset = KernelDataset(**values)
    if len(dataset.node_offsets) != len(dataset) + 1 or dataset.node_offsets[-1] != len(
        dataset.node_opcode
    ):
        raise DiscoInputError(path, "not a kernel data set (inconsistent offsets)")
    return dataset


def load_datasets(paths: Sequence[str]) -> KernelDataset:
    return concatenate([load_dataset(p) for p in paths])
