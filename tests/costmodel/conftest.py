"""What the cost-model tests share, built once for the package: the demo step,
its kernels measured under XLA's compile and three sampled plans, and a small
network trained on them."""

from __future__ import annotations

import pytest

from disco_xla.costmodel.dataset import from_samples
from disco_xla.costmodel.network import NetworkConfig
from disco_xla.costmodel.training import train
from disco_xla.hlo.graph import HloModule
from tests.costmodel.kernel_data import demo_step, measured_samples


@pytest.fixture(scope="package")
def step_module(captured) -> HloModule:
    return demo_step(captured)


@pytest.fixture(scope="package")
def samples(step_module):
    return measured_samples(step_module)


@pytest.fixture(scope="package")
def dataset(samples):
    return from_samples(samples)


@pytest.fixture(scope="package")
def trained(dataset):
    # A small network: these tests check the plumbing, not the accuracy.
    return train(dataset, epochs=3, seed=0, config=NetworkConfig(hidden=16, layers=1))
