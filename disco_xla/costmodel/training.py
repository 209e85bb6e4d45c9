"""Train and evaluate the GNN kernel cost model on a profiling data set.

Training: the loss is the mean squared error of the standardised log-time, which
weighs relative errors alike for fast and slow kernels. optax Adam (learning rate
`LEARNING_RATE`, gradients clipped to norm 1), batches of `BATCH_GRAPHS` kernels
padded to power-of-two sizes, and early stopping: a validation split of the
training kernels (10%, by structural hash, so a kernel measured twice is never on
both sides) is scored after each epoch; training stops after `PATIENCE` epochs
without improvement and keeps the best weights. The opcode vocabulary is the
fixed one less the opcodes the training kernels never use; 2% of the nodes are
shown as the 'other' opcode, so that bucket is trained for opcodes never seen.

Training and evaluation see each distinct kernel of a module once (the same
structural hash recurs across plans and repeated layers), with the median of its
measured times. Samples whose group XLA emitted no kernel for (`kernel_count ==
0`: only the call thunk was timed, tenths of a microsecond) are left out.

Evaluation: MAPE (mean |predicted - measured| / measured), median APE and Kendall
τ-b between predicted and measured times, for the GNN and for the roofline of a
cluster profile side by side. Split by model (`hold_out_model`) for honest
figures: a model's kernels are then never seen in training; `hold_out_models`
and `only_models` hold out, and evaluate on, several models at once (a family).
"""

from __future__ import annotations

import time
import types
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from disco_xla.costmodel.dataset import KernelDataset
from disco_xla.costmodel.features import LATEST_FEATURE_SET, OPCODE_VOCABULARY
from disco_xla.costmodel.network import BATCH_GRAPHS as PREDICT_BATCH
from disco_xla.costmodel.network import (
    GnnCostModel,
    NetworkConfig,
    batch,
    jitted_apply,
    network,
)
from disco_xla.costmodel.weights import save_model
from disco_xla.errors import DiscoInputError
from disco_xla.simulator.cost_models import RooflineCostModel
from disco_xla.simulator.kernels import KernelArrays
from disco_xla.simulator.profiles import ClusterProfile

# optax and jraph (the GNN's training) and scipy are imported inside the functions
# that use them: the CLI imports this module at start-up.

LEARNING_RATE = 1e-3
BATCH_GRAPHS = 128
PATIENCE = 8
VALIDATION_FRACTION = 0.1
OTHER_FRACTION = 0.02  # nodes shown to training as the 'other' opcode
LIBRARY_OPCODES = ("convolution", "dot")


def library_kernels(data: KernelDataset) -> np.ndarray:
    """[kernels] bool: which kernels hold a dot or a convolution, the ops
    XLA:CPU hands to a library (Eigen, oneDNN): few of a step's distinct
    kernels, and its slowest."""
    holds = np.isin(data.node_opcode, LIBRARY_OPCODES).astype(np.int64)
    before = np.concatenate([[0], np.cumsum(holds)])
    return before[data.node_offsets[1:]] > before[data.node_offsets[:-1]]


def measured(dataset: KernelDataset) -> KernelDataset:
    """One sample per distinct kernel of each module (same structural hash),
    with the median of its measured times, over the samples with at least one
    kernel and a positive time."""
    keep = np.flatnonzero((dataset.kernel_count > 0) & (dataset.time_s > 0))
    times: dict[tuple[str, str], list[float]] = {}
    first: dict[tuple[str, str], int] = {}
    for index in keep:
        key = (str(dataset.module[index]), str(dataset.structural_hash[index]))
        times.setdefault(key, []).append(float(dataset.time_s[index]))
        first.setdefault(key, int(index))
    distinct = dataset.subset(list(first.values()))
    distinct.time_s = np.array([float(np.median(times[key])) for key in first])
    return distinct


def _validation_mask(hashes: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    buckets = np.array([zlib.crc32(f"{seed}:{h}".encode()) % 1000 for h in hashes])
    return buckets < fraction * 1000


def train(
    dataset: KernelDataset,
    epochs: int = 60,
    seed: int = 0,
    config: NetworkConfig | None = None,
    hold_out_model: str | None = None,
    max_steps: int | None = None,
    verbose: bool = False,
    max_seconds: float | None = None,
    hold_out_models: Sequence[str] = (),
    feature_set: int = LATEST_FEATURE_SET,
) -> tuple[GnnCostModel, dict]:
    """Train on `dataset` (less the kernels of `hold_out_model` and of every model
    in `hold_out_models`); returns the model with the best validation loss and a
    report. `max_seconds` stops after the epoch that reaches that much wall time
    (a budgeted run keeps its best model)."""
    start_s = time.perf_counter()
    held_out = _held_out(hold_out_model, hold_out_models)
    data = _training_kernels(dataset, held_out)
    config = config or _default_config(data, feature_set)
    train_data, validation_data = _split(data, seed)
    log_s = np.log(train_data.time_s)
    mean, std = float(log_s.mean()), float(max(log_s.std(), 1e-3))
    train_targets = ((log_s - mean) / std).astype(np.float32)
    validation_targets = ((np.log(validation_data.time_s) - mean) / std).astype(np.float32)
    predict_validation = _batched_predictor(config, config.featurize(validation_data))

    def validation_loss(params) -> float:
        return float(np.mean((predict_validation(params) - validation_targets) ** 2))

    model = network(config)
    rng = np.random.default_rng(seed)
    first_graph = batch(config.featurize(train_data), 0, 1)
    params = model.init(jax.random.PRNGKey(seed), first_graph)
    run = _EpochRun(model, params, config, train_data, train_targets, rng, max_steps)
    stopped = _run_epochs(run, validation_loss, epochs, verbose, start_s, max_seconds)
    gnn = GnnCostModel(stopped.best_params, config, mean, std)
    validation_predicted = np.exp(predict_validation(stopped.best_params) * std + mean)
    report = {
        "train_samples": len(train_data),
        "validation_samples": len(validation_data),
        "held_out_model": hold_out_model,
        "held_out_models": held_out,
        "models": sorted(set(train_data.model.tolist())),
        "epochs": stopped.epochs_run,
        "best_epoch": stopped.best_epoch,
        "steps": run.steps,
        "initial_validation_loss": stopped.initial_loss,
        "best_validation_loss": stopped.best_loss,
        "validation_mape": _mape(validation_predicted, validation_data.time_s),
        "seconds": time.perf_counter() - start_s,
        "target_log_s_mean": mean,
        "target_log_s_std": std,
    }
    return gnn, report


def _default_config(data: KernelDataset, feature_set: int) -> NetworkConfig:
    """The network for `data`: the vocabulary is the fixed one less the opcodes
    training never saw; those go to the 'other' bucket, which learns from
    OTHER_FRACTION of the nodes."""
    seen = set(data.node_opcode.tolist())
    return NetworkConfig(
        opcodes=tuple(o for o in OPCODE_VOCABULARY if o in seen), feature_set=feature_set
    )


@dataclass(frozen=True)
class _Stopped:
    """Where early stopping left a training run: the validation loss before the
    first epoch, and the best epoch's loss and parameters."""

    initial_loss: float
    best_loss: float
    best_params: Any
    best_epoch: int
    epochs_run: int


def _run_epochs(
    run: _EpochRun,
    validation_loss: Callable[[Any], float],
    epochs: int,
    verbose: bool,
    start_s: float,
    max_seconds: float | None,
) -> _Stopped:
    """Early stopping: epochs of `run` until `epochs`, `PATIENCE` epochs without a
    lower validation loss, the end of the step budget, or `max_seconds` of wall
    time since `start_s`, whichever comes first."""
    initial_loss = validation_loss(run.params)
    best_loss, best_params, best_epoch = initial_loss, run.params, 0
    epochs_run, since_best = 0, 0
    for epoch in range(epochs):
        run.epoch()
        epochs_run = epoch + 1
        loss = validation_loss(run.params)
        if verbose:
            print(f"epoch {epochs_run}: validation loss {loss:.4f}", flush=True)
        if loss < best_loss:
            best_loss, best_params, best_epoch, since_best = loss, run.params, epochs_run, 0
        else:
            since_best += 1
        out_of_time = max_seconds is not None and time.perf_counter() - start_s >= max_seconds
        if since_best >= PATIENCE or run.out_of_steps() or out_of_time:
            break
    return _Stopped(initial_loss, best_loss, best_params, best_epoch, epochs_run)


def _held_out(hold_out_model: str | None, hold_out_models: Sequence[str]) -> list[str]:
    """The models to hold out: `hold_out_model` (if given) and `hold_out_models`."""
    models = [hold_out_model] if hold_out_model is not None else []
    return models + [m for m in hold_out_models if m not in models]


def _training_kernels(dataset: KernelDataset, held_out: Sequence[str]) -> KernelDataset:
    """The measured kernels training sees: all but the `held_out` models', at least two."""
    data = measured(dataset)
    if held_out:
        present = set(data.model.tolist())
        for model in held_out:
            if model not in present:
                raise DiscoInputError(model, "no kernels of this model in the data set")
        data = data.subset(np.flatnonzero(~np.isin(data.model, list(held_out))))
    if len(data) < 2:
        raise DiscoInputError("data set", f"{len(data)} measured kernels; too few to train")
    return data


def _split(data: KernelDataset, seed: int) -> tuple[KernelDataset, KernelDataset]:
    """(training, validation) kernels: `VALIDATION_FRACTION` of the structural
    hashes go to validation, or every tenth kernel where that leaves a side empty."""
    in_validation = _validation_mask(data.structural_hash, VALIDATION_FRACTION, seed)
    if in_validation.all() or not in_validation.any():
        in_validation = np.arange(len(data)) % 10 == 0
    return data.subset(np.flatnonzero(~in_validation)), data.subset(np.flatnonzero(in_validation))


def _batched_predictor(config: NetworkConfig, features):
    """params -> the standardised log-times of the graphs of `features`,
    predicted in the cost model's batches (so the compiled shapes are shared
    with it)."""
    predict = jitted_apply(config)

    def predictions(params) -> np.ndarray:
        parts = []
        for first in range(0, len(features), PREDICT_BATCH):
            last = min(first + PREDICT_BATCH, len(features))
            graph = batch(features, first, last)
            parts.append(np.asarray(predict(params, graph))[: last - first])
        return np.concatenate(parts)

    return predictions


class _EpochRun:
    """The training parameters under Adam (gradients clipped to norm 1) on the
    mean squared error, an epoch at a time, counting the steps against `max_steps`.

    Shuffled batches are contiguous slices of a permuted copy, padded to
    power-of-two sizes: a few shapes, so jit compiles a few times only."""

    def __init__(self, model, params, config, train_data, train_targets, rng, max_steps) -> None:
        import optax

        self.config, self.train_data, self.train_targets = config, train_data, train_targets
        self.rng, self.max_steps, self.steps = rng, max_steps, 0
        optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(LEARNING_RATE))
        self.params, self.opt_state = params, optimizer.init(params)
        self.update = _jitted_update(model, optimizer)

    def out_of_steps(self) -> bool:
        return self.max_steps is not None and self.steps >= self.max_steps

    def epoch(self) -> None:
        """One pass over a shuffled copy of the training kernels."""
        order = self.rng.permutation(len(self.train_data))
        shuffled = self.train_data.subset(order)
        features = self.config.featurize(shuffled)
        shown_as_other = self.rng.random(len(features.opcode)) < OTHER_FRACTION
        features.opcode[shown_as_other] = len(self.config.opcodes)
        targets = self.train_targets[order]
        # Full batches only (one graph-count shape), unless there is just one.
        for first in range(0, max(len(shuffled) - BATCH_GRAPHS + 1, 1), BATCH_GRAPHS):
            last = min(first + BATCH_GRAPHS, len(shuffled))
            graph = batch(features, first, last, BATCH_GRAPHS + 1)
            padded = np.zeros(graph.n_node.shape[0], np.float32)
            padded[: last - first] = targets[first:last]
            self.params, self.opt_state, _ = self.update(self.params, self.opt_state, graph, padded)
            self.steps += 1
            if self.out_of_steps():
                break


def _jitted_update(model, optimizer):
    """(params, opt_state, graph, targets) -> (params, opt_state, loss): one
    optimizer step on the squared error of the graphs that are not padding."""
    import jraph
    import optax

    def loss_fn(params, graph, targets):
        mask = jraph.get_graph_padding_mask(graph)
        error = (model.apply(params, graph) - targets) ** 2
        return jnp.sum(jnp.where(mask, error, 0.0)) / jnp.maximum(jnp.sum(mask), 1)

    @jax.jit
    def update(params, opt_state, graph, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, graph, targets)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return update


def train_and_save(dataset: KernelDataset, directory: str, **options) -> dict:
    """Train, then write the model directory (config.json + params.npz)."""
    gnn, report = train(dataset, **options)
    try:
        save_model(directory, gnn.params, gnn.config, gnn.target_mean, gnn.target_std, report)
    except OSError as error:
        raise DiscoInputError(directory, f"cannot write the model ({error.strerror})") from None
    return {**report, "out": directory}


def _mape(predicted: np.ndarray, measured_s: np.ndarray) -> float:
    return float(np.mean(np.abs(predicted - measured_s) / measured_s)) if len(measured_s) else 0.0


def error_figures(predicted_s: np.ndarray, measured_s: np.ndarray) -> dict:
    """MAPE, median APE (fractions: 0.08 is 8%) and Kendall τ-b; `level`, the
    median of predicted / measured (how far the whole set's level is off), and
    `mape_at_level`, the MAPE once the predictions are divided by `level`: the
    error that one scale for the whole set, learned from a measured run, would
    leave."""
    from scipy.stats import kendalltau

    relative = np.abs(predicted_s - measured_s) / measured_s
    tau = kendalltau(predicted_s, measured_s).statistic if len(measured_s) > 1 else float("nan")
    level = float(np.median(predicted_s / measured_s)) if len(measured_s) else float("nan")
    return {
        "mape": float(relative.mean()),
        "median_ape": float(np.median(relative)),
        "kendall_tau": float(tau),
        "level": level,
        "mape_at_level": _mape(predicted_s / level, measured_s),
    }


def roofline_s(dataset: KernelDataset, profile: ClusterProfile) -> np.ndarray:
    """The roofline cost model's times for the data set's kernels (its own
    batched formula, fed the stored FLOPs, bytes, dtypes and op classes)."""
    element_types = sorted(set(dataset.element_type.tolist()))
    op_classes = sorted(set(dataset.op_class.tolist()))
    arrays = KernelArrays(
        flops=dataset.kernel_flops,
        bytes=dataset.kernel_bytes_in + dataset.kernel_bytes_out,
        element_types=element_types,
        element_type_index=np.searchsorted(element_types, dataset.element_type),
        op_classes=op_classes,
        op_class_index=np.searchsorted(op_classes, dataset.op_class),
    )
    graph = types.SimpleNamespace(kernel_arrays=arrays)
    return np.array(RooflineCostModel(profile).kernels_s(graph))  # type: ignore[arg-type]


def evaluate(
    model: GnnCostModel,
    dataset: KernelDataset,
    profile: ClusterProfile,
    only_model: str | None = None,
    only_models: Sequence[str] = (),
) -> dict:
    """GNN and roofline error figures on the measured kernels of `dataset` (of
    `only_model` and the `only_models`, if given)."""
    data = measured(dataset)
    selected = _held_out(only_model, only_models)
    if selected:
        present = set(data.model.tolist())
        for name in selected:
            if name not in present:
                raise DiscoInputError(name, "no kernels of this model in the data set")
        data = data.subset(np.flatnonzero(np.isin(data.model, selected)))
    if not len(data):
        raise DiscoInputError("data set", "no measured kernels")
    start = time.perf_counter()
    features = model.config.featurize(data)
    predicted = model.predict_features(features)
    predict_s = time.perf_counter() - start
    library = library_kernels(data)
    return {
        "samples": len(data),
        "models": sorted(set(data.model.tolist())),
        "gnn": error_figures(predicted, data.time_s),
        # the kernels holding a dot or a convolution: few, and the slowest
        "library_kernels": int(library.sum()),
        "gnn_library": error_figures(predicted[library], data.time_s[library])
        if library.sum() > 1
        else None,
        "roofline": error_figures(roofline_s(data, profile), data.time_s),
        "cluster": profile.name,
        "predict_s": predict_s,
    }
