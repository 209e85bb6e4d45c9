"""The task graph of chunked collectives on the Llama FSDP step: chunks of a
collective and of the kernels with its dots, each chunk waiting for its own,
the MLP's chunks run chunk by chunk, and a pipeline that hides communication
where compute and communication are of one size."""

from __future__ import annotations

import dataclasses

from disco_xla.search.backtracking import greedy_fusion_plan
from disco_xla.simulator.cost_models import RooflineCostModel
from disco_xla.simulator.events import simulate
from disco_xla.simulator.incremental import PlanState
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.profiles import Link, load_profile
from disco_xla.simulator.result import PS_PER_S
from tests.hlo.test_chunking import _mlp


def balanced_profile(module):
    """A GPU profile made slow enough (its peak FLOPs 1e6 times, links at 10
    MB/s without latency) that the tiny step's MLP computes about as long as
    its collectives take: the regime where the 8B step's MLP sits."""
    base = load_profile("a100-2x8-100g", module.worker_count())
    link = Link(1e7, 0.0)
    return dataclasses.replace(
        base,
        peak_flops={k: v / 1e6 for k, v in base.peak_flops.items()},
        kernel_launch_s=0.0,
        intra_node=link,
        inter_node=link,
    )


def _chunked(plan, *pairs):
    return dataclasses.replace(plan, chunked_collectives=tuple(pairs))


def test_each_chunk_waits_for_its_own_and_the_mlp_runs_chunk_by_chunk(fsdp_step):
    gather, reduce = _mlp(fsdp_step)
    g, r = gather.collective.name, reduce.collective.name
    plan = greedy_fusion_plan(fsdp_step)
    whole, graph = (
        build_task_graph(fsdp_step, plan),
        build_task_graph(fsdp_step, _chunked(plan, (g, 4), (r, 4))),
    )
    first = len(graph.kernels)
    tasks = {name: n for n, (name, _, _) in enumerate(graph.communications)}
    sizes = {name: size for name, size, _ in whole.communications}
    assert len(graph.communications) == len(whole.communications) + 6
    for name in (g, r):
        for j in range(4):
            assert graph.communications[tasks[f"{name}.chunk{j}"]][1] * 4 == sizes[name]
    for j in range(4):
        gathered = first + tasks[f"{g}.chunk{j}"]
        readers = [k for k, deps in enumerate(graph.dependencies[:first]) if gathered in deps]
        assert readers and all(graph.kernels[k].name.endswith(f".chunk{j}") for k in readers)
        assert all(graph.kernel_shares[k] == 0.25 for k in readers)
        producer = max(d for d in graph.dependencies[first + tasks[f"{r}.chunk{j}"]] if d < first)
        assert graph.kernels[producer].name.endswith(f".chunk{j}")
        # Chunk by chunk: chunk j's reduction is produced before chunk j+1 is read.
        if j < 3:
            later = first + tasks[f"{g}.chunk{j + 1}"]
            assert producer < min(k for k, d in enumerate(graph.dependencies[:first]) if later in d)
    # The copies around the chunks: a slice of the gathered activation, and
    # the concatenation of the reduced (and sliced) result, once a trip.
    moved = sum(graph.kernel_copy_bytes)
    sliced = reduce.collective.users[0]
    assert moved == gather.collective.operands[0].shape.bytes + sliced.shape.bytes
    # Whatever read the whole reduction waits for every chunk.
    whole_readers = [deps for deps in graph.dependencies if first + tasks[f"{r}.chunk0"] in deps]
    assert whole_readers and all(
        first + tasks[f"{r}.chunk{j}"] in deps for deps in whole_readers for j in range(4)
    )


def test_the_pipeline_hides_what_each_split_alone_cannot(fsdp_step):
    gather, reduce = _mlp(fsdp_step)
    g, r = gather.collective.name, reduce.collective.name
    profile = balanced_profile(fsdp_step)
    cost_model = RooflineCostModel(profile)
    plan = greedy_fusion_plan(fsdp_step)

    def seconds(trial) -> float:
        return simulate(build_task_graph(fsdp_step, trial), profile, cost_model).iteration_s

    none = seconds(plan)
    gathered, reduced = seconds(_chunked(plan, (g, 4))), seconds(_chunked(plan, (r, 4)))
    pipeline = seconds(_chunked(plan, (g, 4), (r, 4)))
    unlinked = seconds(_chunked(plan, (g, 4), (r, 2)))
    assert gathered < none and reduced < none
    # Together at one count the chunks flow from the gather to the reduction.
    assert pipeline < (none - (none - gathered) - (none - reduced))
    assert pipeline < unlinked
    # The incremental state evaluates a plan with chunks in full, to the same time.
    state = PlanState(fsdp_step, _chunked(plan, (g, 4), (r, 4)), profile, cost_model)
    assert state.full_only
    assert state.iteration_ps == round(pipeline * PS_PER_S)
