"""Each plan dimension is one module of `disco_xla.plan`, declared once in
`plan.DIMENSIONS`, and every layer's table has a row for it: the rewrite's
passes, the simulator's graph steps, the search's steps, the ablation. A
dimension added without its rows fails here."""

from __future__ import annotations

import dataclasses
import json

import pytest

from disco_xla.plan import DIMENSIONS, IDENTITY_FIELDS, Plan, dimension_named
from disco_xla.runtime.apply import REWRITE_PASSES
from disco_xla.search.ablation import DIMENSIONS as ABLATED
from disco_xla.search.pipeline import BACKTRACKING, REFINEMENTS, SEARCH_STEPS
from disco_xla.simulator.graph_steps import GRAPH, GRAPH_STEPS, STAGES, untracked_dimensions

NAMES = [dimension.name for dimension in DIMENSIONS]


def test_every_plan_field_but_its_identity_is_one_dimension():
    fields = [f.name for f in dataclasses.fields(Plan) if f.name not in IDENTITY_FIELDS]
    assert sorted(d.field for d in DIMENSIONS) == sorted(fields)
    assert len(set(NAMES)) == len(NAMES)
    for dimension in DIMENSIONS:
        assert dimension.meaning  # it says what it chooses
        assert dimension_named(dimension.name) is dimension
    with pytest.raises(KeyError):
        dimension_named("pipelining")


def test_each_dimension_comes_after_the_ones_it_names():
    for position, dimension in enumerate(DIMENSIONS):
        for earlier in dimension.after:
            assert earlier in NAMES[:position], (dimension.name, earlier)


@pytest.mark.parametrize(
    "table",
    [REWRITE_PASSES, GRAPH_STEPS, SEARCH_STEPS, ABLATED],
    ids=["rewrite passes", "graph steps", "search steps", "ablation"],
)
def test_every_layer_has_one_row_per_dimension(table):
    assert sorted(table) == sorted(NAMES)


def test_every_graph_step_has_the_hook_of_its_stage():
    for name, step in GRAPH_STEPS.items():
        assert step.stage in STAGES, name
        assert (step.split is not None) == (step.stage == GRAPH), name
        assert (step.add is not None) == (step.stage != GRAPH), name


def test_the_incremental_simulator_follows_the_dimensions_its_rows_say():
    plan = Plan("m", "f" * 64, fusion_groups=(("a",),), all_reduce_buckets=(("g",),))
    assert untracked_dimensions(plan) == []
    chunked = dataclasses.replace(plan, chunked_collectives=(("y", 2),))
    both = dataclasses.replace(chunked, prefetched_all_gathers=("x",))
    assert untracked_dimensions(chunked) == ["chunks"]
    assert untracked_dimensions(both) == ["chunks", "prefetch"]


def test_every_search_step_runs():
    for step in SEARCH_STEPS.values():
        assert step == BACKTRACKING or step in REFINEMENTS


def test_each_dimension_writes_and_reads_its_own_json():
    plan = Plan(
        "m",
        "f" * 64,
        fusion_groups=(("a", "b"), ("c",)),
        all_reduce_buckets=(("g1", "g2"),),
        all_gather_buckets=(("x",), ("y", "z")),
        prefetched_all_gathers=("x",),
        chunked_collectives=(("y", 2),),
    )
    data = json.loads(plan.to_json())
    for dimension in DIMENSIONS:
        assert dimension.read(data) == getattr(plan, dimension.field)
    assert Plan.from_json(plan.to_json()) == plan
    # A plan without the newer dimensions writes only the two it always has.
    bare = dataclasses.replace(
        plan, all_gather_buckets=(), prefetched_all_gathers=(), chunked_collectives=()
    )
    written = set(json.loads(bare.to_json())) - {"format", "module", "fingerprint"}
    assert written == {d.field for d in DIMENSIONS if d.always_written}
    lines = [d.describe(plan) for d in DIMENSIONS]
    assert lines[NAMES.index("chunks")] == "1 collectives split into chunks (y in 2)"
    assert all(d.describe(bare) is None for d in DIMENSIONS)
