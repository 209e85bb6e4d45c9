"""The GNN cost model's weights on disk, and where the shipped ones live.

A model directory holds `config.json` (schema `MODEL_SCHEMA`, the network's
settings: sizes, opcode vocabulary and feature set; the target's scaling: mean and
standard deviation of the training kernels' log-seconds; a training report) and
`params.npz` (haiku's parameters, keyed `module/name`; no pickle). Shipped
weights are in `configs/costmodels/<device>/`, one directory per device whose
kernels trained them.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from disco_xla.costmodel.features import FEATURE_SETS
from disco_xla.errors import DiscoInputError

if TYPE_CHECKING:
    from disco_xla.costmodel.network import NetworkConfig

MODEL_SCHEMA = "disco-xla-gnn/1"
_REPO_WEIGHTS = Path(__file__).resolve().parents[2] / "configs" / "costmodels"
_INSTALLED_WEIGHTS = Path(sys.prefix) / "share" / "disco-xla" / "configs" / "costmodels"
DEFAULT_DEVICE = "cpu"


def weights_device(device_name: str) -> str:
    """The shipped weights for a cluster profile's `device_name`: the directory of
    `configs/costmodels/` named by one of its words ('NVIDIA H200 SXM' -> 'h200'),
    else the CPU's. Kernel times of one device do not predict another's, so a
    profile whose device has no weights of its own gets the CPU's only as a last
    resort (the roofline uses its peak figures)."""
    for word in device_name.lower().replace("-", " ").split():
        if word != DEFAULT_DEVICE and (default_model_directory(word) / "config.json").exists():
            return word
    return DEFAULT_DEVICE


def default_model_directory(device: str = DEFAULT_DEVICE) -> Path:
    """Shipped weights for `device`: `configs/costmodels/<device>/` of the source
    tree, else of the installed data files (found as the cluster profiles are)."""
    for root in (_REPO_WEIGHTS, _INSTALLED_WEIGHTS):
        candidate = root / device
        if (candidate / "config.json").exists():
            return candidate
    return _REPO_WEIGHTS / device


def save_model(
    directory: str, params, config: NetworkConfig, target_mean: float, target_std: float, info
) -> None:
    """Write `config.json` and `params.npz` (haiku's module/parameter names as keys)."""
    os.makedirs(directory, exist_ok=True)
    flat = {
        f"{module}/{name}": np.asarray(v) for module, p in params.items() for name, v in p.items()
    }
    np.savez(os.path.join(directory, "params.npz"), **flat)
    with open(os.path.join(directory, "config.json"), "w") as file:
        json.dump(
            {
                "schema": MODEL_SCHEMA,
                "network": config.to_dict(),
                "target_log_s_mean": target_mean,
                "target_log_s_std": target_std,
                "training": info,
            },
            file,
            indent=1,
        )


@dataclass(frozen=True)
class SavedModel:
    """A model directory as read: `network` holds `NetworkConfig`'s fields."""

    params: dict[str, dict[str, Any]]
    network: dict[str, Any]
    target_mean: float
    target_std: float


def read_model(directory: str) -> SavedModel:
    """Read a model directory; DiscoInputError if it is missing or corrupt, or of
    another schema or feature set. (Whether the parameters fit the network is
    `GnnCostModel.load`'s check.)"""
    config_path = os.path.join(directory, "config.json")
    try:
        with open(config_path) as file:
            data = json.load(file)
        if not isinstance(data, dict) or data.get("schema") != MODEL_SCHEMA:
            schema = data.get("schema") if isinstance(data, dict) else None
            raise DiscoInputError(
                directory, f"model schema {schema!r}, this version reads {MODEL_SCHEMA!r}"
            )
        network_config = data["network"]
        network = {
            "hidden": int(network_config["hidden"]),
            "layers": int(network_config["layers"]),
            "opcode_embedding": int(network_config["opcode_embedding"]),
            "opcodes": tuple(str(o) for o in network_config["opcodes"]),
            "feature_set": int(network_config.get("feature_set", 1)),
        }
        if network["feature_set"] not in FEATURE_SETS:
            raise DiscoInputError(
                directory,
                f"feature set {network['feature_set']}, this version reads {FEATURE_SETS}",
            )
        mean, std = float(data["target_log_s_mean"]), float(data["target_log_s_std"])
        params: dict[str, dict[str, Any]] = {}
        with np.load(os.path.join(directory, "params.npz"), allow_pickle=False) as arrays:
            for key in arrays.files:
                module, name = key.rsplit("/", 1)
                params.setdefault(module, {})[name] = arrays[key]
    except DiscoInputError:
        raise
    except FileNotFoundError as error:
        raise DiscoInputError(
            directory,
            f"not a GNN cost model directory (no {os.path.basename(error.filename or '')})",
        ) from None
    except (OSError, ValueError, KeyError, TypeError, EOFError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise DiscoInputError(directory, f"corrupt GNN cost model ({message})") from None
    return SavedModel(params, network, mean, std)
