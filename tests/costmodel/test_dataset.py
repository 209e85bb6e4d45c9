"""The kernel data set: it round-trips through its npz file, and a file of
another schema or a corrupt one is refused."""

from __future__ import annotations

import numpy as np
import pytest

from disco_xla.costmodel.dataset import (
    SCHEMA,
    from_samples,
    load_dataset,
    load_datasets,
    save_dataset,
)
from disco_xla.errors import DiscoInputError


def test_the_data_set_round_trips_through_npz(samples, tmp_path):
    dataset = from_samples(samples)
    path = str(tmp_path / "kernels.npz")
    save_dataset(dataset, path)
    again = load_dataset(path)
    assert len(again) == len(samples)
    np.testing.assert_array_equal(again.time_s, dataset.time_s)
    for index in (0, len(samples) // 2, len(samples) - 1):
        graph, expected = again.graph(index), samples[index].graph
        assert graph.opcodes == expected.opcodes
        np.testing.assert_array_equal(graph.senders, expected.senders)
        np.testing.assert_array_equal(graph.dims, expected.dims)
    both = load_datasets([path, path])
    assert len(both) == 2 * len(samples)
    assert both.graph(len(samples)).opcodes == dataset.graph(0).opcodes


def test_a_data_set_of_another_schema_or_a_corrupt_file_is_refused(samples, tmp_path):
    other = tmp_path / "other.npz"
    arrays = {k: getattr(from_samples(samples), k) for k in ("time_s", "node_opcode")}
    np.savez(other, schema=np.array("disco-xla-kernels/0"), **arrays)
    with pytest.raises(DiscoInputError, match="schema"):
        load_dataset(str(other))
    corrupt = tmp_path / "corrupt.npz"
    corrupt.write_bytes(b"not a zip file")
    with pytest.raises(DiscoInputError, match="not a kernel data set"):
        load_dataset(str(corrupt))
    current = tmp_path / "current.npz"
    save_dataset(from_samples(samples), str(current))
    with np.load(current) as data:
        assert str(data["schema"]) == SCHEMA
