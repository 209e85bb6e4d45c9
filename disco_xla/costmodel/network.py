"""The GNN kernel cost model: a graph network over a fused kernel's instructions
that predicts the kernel's log-time (the DisCo paper's learned cost model).

Input, one `jraph.GraphsTuple` per kernel (`features.kernel_graph`):
- nodes: an opcode embedding over a fixed vocabulary with an 'other' bucket, a
  one-hot dtype, log2(1 + dim) for up to `MAX_RANK` dims, rank, and log2(1 + x) of
  the instruction's FLOPs, result bytes and bytes read from outside the kernel,
  whether its result leaves the kernel, and (feature set 2) log2 of its structural
  attributes: window, strides, groups, fan-in, minor dimension, and whether a
  transpose moves the minor dimension (`features.STRUCTURAL_ATTRIBUTE_NAMES`),
  and (feature set 3) beside those, for a dot or a convolution, log2 of the rows,
  columns, contracted size and batch of its matrix product, and whether its
  operands and result come in the library's layout
  (`features.LIBRARY_ATTRIBUTE_NAMES`);
- edges: operand → user, with log2(1 + tensor bytes);
- globals: log2(1 + x) of the kernel's FLOPs, bytes in, bytes out and node count:
  the roofline's inputs, so a kernel of unseen opcodes still gets a sensible time.

Network: node and edge encoders (MLPs) to width H, then L message-passing layers
(`jraph.GraphNetwork`), each with residual connections:
    e' = e + MLP_e([e, h_sender, h_receiver])
    h' = LayerNorm(h + MLP_h([h, Σ_in e', Σ_out e']))
then mean- and max-pooling of the nodes, concatenated with the encoded globals,
and an MLP head that predicts standardised log(seconds). Batches are padded with
`jraph.pad_with_graphs` to power-of-two sizes, so jit compiles a few shapes only.

`GnnCostModel` implements the simulator's `CostModel` protocol, with a cache keyed
by the kernel's structural hash. Its weights are read and written by `weights.py`.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np

from disco_xla.costmodel.features import (
    ATTRIBUTE_NAMES,
    DTYPE_VOCABULARY,
    LATEST_FEATURE_SET,
    MAX_RANK,
    OPCODE_VOCABULARY,
    SET_ATTRIBUTES,
    KernelGraph,
    kernel_graph,
)
from disco_xla.costmodel.weights import read_model
from disco_xla.errors import DiscoInputError
from disco_xla.simulator.kernels import Kernel, TaskGraph

# haiku and jraph, the GNN's own libraries (~0.2 s to import), are imported inside
# the functions that build and batch it: the CLI imports this module at start-up.

BATCH_GRAPHS = 512  # graphs per prediction batch (padding rounds up to a power of two)

log = logging.getLogger(__name__)

# Node features before the attribute columns of a feature set (`SET_ATTRIBUTES`).
NODE_FEATURES = len(DTYPE_VOCABULARY) + 1 + MAX_RANK + 5
GLOBAL_FEATURES = 4


class FlatGraphs(Protocol):
    """Many kernel graphs stored flat (the data set's layout, see
    `dataset.py`; `stack_graphs` builds one from `KernelGraph`s)."""

    node_opcode: np.ndarray
    node_dtype: np.ndarray
    node_dims: np.ndarray
    node_rank: np.ndarray
    node_flops: np.ndarray
    node_out_bytes: np.ndarray
    node_in_bytes: np.ndarray
    node_is_output: np.ndarray
    node_attributes: np.ndarray
    edge_sender: np.ndarray
    edge_receiver: np.ndarray
    edge_bytes: np.ndarray
    node_offsets: np.ndarray
    edge_offsets: np.ndarray
    kernel_flops: np.ndarray
    kernel_bytes_in: np.ndarray
    kernel_bytes_out: np.ndarray


@dataclass
class StackedGraphs:
    node_opcode: np.ndarray
    node_dtype: np.ndarray
    node_dims: np.ndarray
    node_rank: np.ndarray
    node_flops: np.ndarray
    node_out_bytes: np.ndarray
    node_in_bytes: np.ndarray
    node_is_output: np.ndarray
    node_attributes: np.ndarray
    edge_sender: np.ndarray
    edge_receiver: np.ndarray
    edge_bytes: np.ndarray
    node_offsets: np.ndarray
    edge_offsets: np.ndarray
    kernel_flops: np.ndarray
    kernel_bytes_in: np.ndarray
    kernel_bytes_out: np.ndarray


def stack_graphs(graphs: Sequence[KernelGraph]) -> StackedGraphs:
    """`KernelGraph`s as one flat batch."""

    def cat(values, dtype, shape=(0,)):
        arrays = [np.asarray(v, dtype) for v in values]
        return np.concatenate(arrays) if arrays else np.zeros(shape, dtype)

    return StackedGraphs(
        node_opcode=np.array([o for g in graphs for o in g.opcodes], dtype=str),
        node_dtype=np.array([d for g in graphs for d in g.dtypes], dtype=str),
        node_dims=cat([g.dims for g in graphs], np.int64, (0, MAX_RANK)),
        node_rank=cat([g.ranks for g in graphs], np.int64),
        node_flops=cat([g.flops for g in graphs], np.float64),
        node_out_bytes=cat([g.out_bytes for g in graphs], np.float64),
        node_in_bytes=cat([g.in_bytes for g in graphs], np.float64),
        node_is_output=cat([g.is_output for g in graphs], bool),
        node_attributes=cat(
            [g.attributes for g in graphs], np.float64, (0, len(ATTRIBUTE_NAMES))
        ).reshape(-1, len(ATTRIBUTE_NAMES)),
        edge_sender=cat([g.senders for g in graphs], np.int64),
        edge_receiver=cat([g.receivers for g in graphs], np.int64),
        edge_bytes=cat([g.edge_bytes for g in graphs], np.float64),
        node_offsets=np.concatenate([[0], np.cumsum([g.node_count for g in graphs])]).astype(
            np.int64
        ),
        edge_offsets=np.concatenate([[0], np.cumsum([g.edge_count for g in graphs])]).astype(
            np.int64
        ),
        kernel_flops=np.array([g.kernel_flops for g in graphs], np.float64),
        kernel_bytes_in=np.array([g.kernel_bytes_in for g in graphs], np.float64),
        kernel_bytes_out=np.array([g.kernel_bytes_out for g in graphs], np.float64),
    )


def _log2p(values: np.ndarray) -> np.ndarray:
    return np.log2(1.0 + np.maximum(values, 0.0))


def _index(values: np.ndarray, vocabulary: Sequence[str]) -> tuple[np.ndarray, set[str]]:
    """Vocabulary positions of `values`; unknown ones get len(vocabulary) ('other')."""
    position = {name: n for n, name in enumerate(vocabulary)}
    unique, inverse = np.unique(values, return_inverse=True)
    mapped = np.array([position.get(str(u), len(vocabulary)) for u in unique], np.int32)
    unknown = {str(u) for u in unique if str(u) not in position}
    return (mapped[inverse] if len(unique) else np.zeros(0, np.int32)), unknown


@dataclass
class Features:
    """Featurised flat graphs: what the network reads, before batching."""

    opcode: np.ndarray  # [N] int32 vocabulary index
    nodes: np.ndarray  # [N, NODE_FEATURES + its set's attributes] float32
    edges: np.ndarray  # [E, 1] float32
    senders: np.ndarray  # [E] int32, global node index
    receivers: np.ndarray
    globals: np.ndarray  # [G, GLOBAL_FEATURES] float32
    node_offsets: np.ndarray
    edge_offsets: np.ndarray
    unknown_opcodes: set[str] = field(default_factory=set)

    def __len__(self) -> int:
        return len(self.globals)


def featurize(
    flat: FlatGraphs,
    opcodes: Sequence[str] = OPCODE_VOCABULARY,
    feature_set: int = LATEST_FEATURE_SET,
) -> Features:
    """The network's input features of every graph in `flat` (see the module
    docstring and `features.FEATURE_SETS`); log2 values are scaled by 1/32 (attributes by
    1/16) to stay near [0, 1]."""
    opcode, unknown = _index(flat.node_opcode, opcodes)
    dtype, _ = _index(flat.node_dtype, DTYPE_VOCABULARY)
    count = len(opcode)
    dtype_one_hot = np.zeros((count, len(DTYPE_VOCABULARY) + 1), np.float32)
    dtype_one_hot[np.arange(count), dtype] = 1.0
    scalars = np.stack(
        [
            flat.node_rank / MAX_RANK,
            _log2p(flat.node_flops) / 32,
            _log2p(flat.node_out_bytes) / 32,
            _log2p(flat.node_in_bytes) / 32,
            flat.node_is_output.astype(np.float64),
        ],
        axis=-1,
    ).reshape(count, 5)
    parts = [dtype_one_hot, _log2p(flat.node_dims.astype(np.float64)) / 16, scalars]
    if SET_ATTRIBUTES[feature_set]:
        attributes = np.asarray(flat.node_attributes, np.float64).reshape(count, -1)
        attributes = attributes[:, : SET_ATTRIBUTES[feature_set]]
        parts.append(np.log2(np.maximum(attributes, 2.0**-16)) / 16)
    nodes = np.concatenate(parts, axis=-1).astype(np.float32)
    edge_graph = np.repeat(np.arange(len(flat.edge_offsets) - 1), np.diff(flat.edge_offsets))
    base = flat.node_offsets[:-1][edge_graph]
    node_counts = np.diff(flat.node_offsets)
    globals_ = np.stack(
        [
            _log2p(flat.kernel_flops) / 32,
            _log2p(flat.kernel_bytes_in) / 32,
            _log2p(flat.kernel_bytes_out) / 32,
            _log2p(node_counts.astype(np.float64)) / 8,
        ],
        axis=-1,
    ).astype(np.float32)
    return Features(
        opcode=opcode.astype(np.int32),
        nodes=nodes,
        edges=(_log2p(flat.edge_bytes) / 32).astype(np.float32).reshape(-1, 1),
        senders=(flat.edge_sender + base).astype(np.int32),
        receivers=(flat.edge_receiver + base).astype(np.int32),
        globals=globals_,
        node_offsets=flat.node_offsets,
        edge_offsets=flat.edge_offsets,
        unknown_opcodes=unknown,
    )


def _power_of_two(value: int, smallest: int) -> int:
    return max(smallest, 1 << max(0, math.ceil(math.log2(max(value, 1)))))


def batch(features: Features, start: int, stop: int, min_graphs: int = 16):
    """Graphs [start, stop) as one `jraph.GraphsTuple`, padded with
    `jraph.pad_with_graphs`: nodes and edges both to one power of two that holds
    either (at least 64), graphs to a power of two (at least `min_graphs`). So a
    stream of batches has few shapes, and jit compiles a few times only."""
    import jraph

    n0, n1 = int(features.node_offsets[start]), int(features.node_offsets[stop])
    e0, e1 = int(features.edge_offsets[start]), int(features.edge_offsets[stop])
    graph = jraph.GraphsTuple(
        nodes={"opcode": features.opcode[n0:n1], "x": features.nodes[n0:n1]},
        edges=features.edges[e0:e1],
        senders=features.senders[e0:e1] - n0,
        receivers=features.receivers[e0:e1] - n0,
        globals=features.globals[start:stop],
        n_node=np.diff(features.node_offsets[start : stop + 1]).astype(np.int32),
        n_edge=np.diff(features.edge_offsets[start : stop + 1]).astype(np.int32),
    )
    size = _power_of_two(max(n1 - n0 + 1, e1 - e0), 64)
    return jraph.pad_with_graphs(
        graph, n_node=size, n_edge=size, n_graph=_power_of_two(stop - start + 1, min_graphs)
    )


@dataclass(frozen=True)
class NetworkConfig:
    hidden: int = 64
    layers: int = 3
    opcode_embedding: int = 16
    opcodes: tuple[str, ...] = tuple(OPCODE_VOCABULARY)
    feature_set: int = LATEST_FEATURE_SET

    def to_dict(self) -> dict:
        return {**self.__dict__, "opcodes": list(self.opcodes)}

    def featurize(self, flat: FlatGraphs) -> Features:
        """`flat`'s features as this network reads them (its vocabulary and set)."""
        return featurize(flat, self.opcodes, self.feature_set)


def network(config: NetworkConfig):
    """The haiku-transformed network: GraphsTuple -> standardised log-time per graph."""
    import haiku as hk
    import jraph

    def mlp(width: int, name: str):
        return hk.nets.MLP([width, width], activation=jax.nn.gelu, name=name)

    def forward(graph: jraph.GraphsTuple) -> jnp.ndarray:
        width = config.hidden
        embedded = hk.Embed(len(config.opcodes) + 1, config.opcode_embedding, name="opcode")(
            graph.nodes["opcode"]
        )
        nodes = mlp(width, "node_encoder")(jnp.concatenate([embedded, graph.nodes["x"]], -1))
        edges = hk.Linear(width, name="edge_encoder")(graph.edges)
        encoded_globals = mlp(width, "global_encoder")(graph.globals)
        graph = graph._replace(nodes=nodes, edges=edges, globals=encoded_globals)
        for layer in range(config.layers):
            edge_mlp = mlp(width, f"edge_update_{layer}")
            node_mlp = mlp(width, f"node_update_{layer}")
            norm = hk.LayerNorm(-1, True, True, name=f"node_norm_{layer}")

            def update_edge(edges, sent, received, globals_, edge_mlp=edge_mlp):
                return edges + edge_mlp(jnp.concatenate([edges, sent, received], -1))

            def update_node(nodes, outgoing, incoming, globals_, node_mlp=node_mlp, norm=norm):
                return norm(nodes + node_mlp(jnp.concatenate([nodes, incoming, outgoing], -1)))

            graph = jraph.GraphNetwork(
                update_edge_fn=update_edge, update_node_fn=update_node, update_global_fn=None
            )(graph)
        graph_count = graph.n_node.shape[0]
        graph_index = jnp.repeat(
            jnp.arange(graph_count), graph.n_node, total_repeat_length=graph.nodes.shape[0]
        )
        mean = jraph.segment_mean(graph.nodes, graph_index, graph_count)
        largest = jraph.segment_max(graph.nodes, graph_index, graph_count)
        largest = jnp.where(jnp.isfinite(largest), largest, 0.0)
        pooled = jnp.concatenate([mean, largest, graph.globals], -1)
        head = hk.nets.MLP([width, width, 1], activation=jax.nn.gelu, name="head")
        return head(pooled)[:, 0]

    return hk.without_apply_rng(hk.transform(forward))


@functools.lru_cache(maxsize=8)
def jitted_apply(config: NetworkConfig):
    """One jit-compiled forward pass per network configuration, shared by every
    model of that configuration (compiled shapes are reused)."""
    return jax.jit(network(config).apply)


class GnnCostModel:
    """Predicted kernel times from the GNN, cached by structural hash."""

    name = "gnn"

    def __init__(self, params, config: NetworkConfig, target_mean: float, target_std: float):

        self.params = params
        self.config = config
        self.target_mean = target_mean
        self.target_std = target_std
        self.cache: dict[str, float] = {}  # structural hash -> seconds
        self._hash_of: dict[tuple, str] = {}  # a group's instructions -> structural hash
        self._apply = jitted_apply(config)
        self._warned: set[str] = set()

    @classmethod
    def load(cls, directory: str | os.PathLike) -> GnnCostModel:
        """Read a model directory; DiscoInputError if it is missing or corrupt."""
        directory = str(directory)
        saved = read_model(directory)
        config = NetworkConfig(**saved.network)
        model = cls(saved.params, config, saved.target_mean, saved.target_std)
        model._check_parameters(directory)
        return model

    def _check_parameters(self, source: str) -> None:
        # Abstract evaluation only: loading must not start JAX's backends (the CLI
        # sets the CPU device count after building the cost model).
        key = jax.ShapeDtypeStruct((2,), np.uint32)
        tiny = batch(_tiny_features(self.config.feature_set), 0, 1)
        expected = jax.eval_shape(network(self.config).init, key, tiny)
        for module, values in expected.items():
            for name, shape in values.items():
                got = self.params.get(module, {}).get(name)
                if got is None or got.shape != shape.shape:
                    raise DiscoInputError(
                        source, f"corrupt GNN cost model (parameter {module}/{name} mismatched)"
                    )

    def predict_features(self, features: Features) -> np.ndarray:
        """Seconds for every graph of `features`, in batches of BATCH_GRAPHS."""
        new_unknown = features.unknown_opcodes - self._warned
        if new_unknown:
            self._warned |= new_unknown
            log.warning(
                "GNN cost model: opcodes never seen in training, predicted through the "
                "'other' bucket and the roofline features: %s",
                ", ".join(sorted(new_unknown)),
            )
        out = np.zeros(len(features))
        for start in range(0, len(features), BATCH_GRAPHS):
            stop = min(start + BATCH_GRAPHS, len(features))
            padded = batch(features, start, stop)
            standardised = np.asarray(self._apply(self.params, padded))[: stop - start]
            out[start:stop] = np.exp(standardised * self.target_std + self.target_mean)
        return out

    def predict_graphs(self, graphs: Sequence[KernelGraph]) -> np.ndarray:
        if not graphs:
            return np.zeros(0)
        return self.predict_features(self.config.featurize(stack_graphs(graphs)))

    def kernels_s(self, graph: TaskGraph) -> list[float]:
        """Predicted times of all the graph's kernels: cached ones by structural
        hash, the others in one batched call."""
        return self.predict_kernels(graph.kernels)

    def predict_kernels(self, kernels: Sequence[Kernel]) -> list[float]:
        """Predicted seconds of `kernels`, cached by structural hash. The hash of a
        group seen before (the same instruction objects, which the cache keeps
        alive, so their identities cannot be reused) is not recomputed."""
        hashes = []
        for kernel in kernels:
            members = tuple(kernel.instructions)
            key = self._hash_of.get(members)
            if key is None:
                key = self._hash_of[members] = kernel.structural_hash
            hashes.append(key)
        missing: dict[str, Kernel] = {}
        for key, kernel in zip(hashes, kernels, strict=True):
            if key not in self.cache and key not in missing:
                missing[key] = kernel
        if missing:
            predicted = self.predict_graphs([kernel_graph(k) for k in missing.values()])
            self.cache.update(zip(missing, predicted.tolist(), strict=True))
        return [self.cache[key] for key in hashes]

    def kernel_s(self, kernel: Kernel) -> float:
        return self.predict_kernels([kernel])[0]

    def clear_cache(self) -> None:
        self.cache.clear()
        self._hash_of.clear()


def _tiny_features(feature_set: int = LATEST_FEATURE_SET) -> Features:
    """One one-node graph, to trace the network's parameter shapes."""
    one = KernelGraph(
        opcodes=("add",),
        dtypes=("f32",),
        dims=np.ones((1, MAX_RANK), np.int64),
        ranks=np.ones(1, np.int64),
        flops=np.ones(1),
        out_bytes=np.ones(1),
        in_bytes=np.ones(1),
        is_output=np.ones(1, bool),
        attributes=np.ones((1, len(ATTRIBUTE_NAMES))),
        senders=np.zeros(0, np.int64),
        receivers=np.zeros(0, np.int64),
        edge_bytes=np.zeros(0),
        kernel_flops=1.0,
        kernel_bytes_in=1.0,
        kernel_bytes_out=1.0,
    )
    return featurize(stack_graphs([one]), feature_set=feature_set)
