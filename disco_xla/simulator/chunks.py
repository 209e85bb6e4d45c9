"""The task graph of a plan's chunked collectives (`Plan.chunked_collectives`,
realised by `hlo_passes.chunk_collectives`).

A collective split into k chunks becomes k communication tasks of 1/k of its
bytes each, and the kernel that holds its producing dot (or each kernel that
holds a reading dot) becomes k kernels, each 1/k of the kernel's work
(`TaskGraph.kernel_shares`), run back to back where the kernel ran:
- producer split: chunk j of the collective waits for chunk j of the kernel,
  so it is sent while the next chunks compute;
- readers split: chunk j of each reading kernel waits for chunk j of the
  collective, so it computes while the next chunks arrive.
Whatever read the whole collective or kernel waits for all its chunks. A chunk
costs the kernel's launch once more (`chunk_kernel_s`), and each chunk of a
collective its own latency (`comm.collective_s` of the chunk's bytes). The
copies the rewrite adds (a slice of what a split reads whole, the
concatenation of what something reads whole: `Chunking.copied_bytes`,
`Chunking.joined`) are read and written at the memory bandwidth, on the
chunks of the kernels they belong to.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from disco_xla.hlo.chunking import chunked_computation
from disco_xla.hlo.graph import HloModule

if TYPE_CHECKING:  # `kernels` builds its graphs through this module
    from disco_xla.simulator.kernels import TaskGraph
    from disco_xla.simulator.profiles import ClusterProfile


def with_chunks(graph: TaskGraph, module: HloModule, chunked) -> TaskGraph:
    """`graph` (of `module` under a plan) with the plan's `chunked` collectives
    ((name, chunks) pairs) split, and the kernels that hold what is computed in
    chunks (`hlo.chunking.chunked_computation`), in every instance (a
    computation called from several places has several)."""
    try:
        chunking = chunked_computation(module, chunked)
    except ValueError as error:
        raise ValueError(f"the plan's chunks: {error}") from None
    by_count: dict[int, tuple[set[str], set[str]]] = {}
    for name, (_, chunks) in chunking.computed.items():
        by_count.setdefault(chunks, (set(), set()))[0].add(name)
    for split, chunks in chunking.splits:
        by_count.setdefault(chunks, (set(), set()))[1].add(split.collective.name)
    joined = chunking.joined(module)
    for chunks, (names, collectives) in sorted(by_count.items()):
        holding: dict[int, list[int]] = {}  # id(instruction) -> kernels that hold it
        for k, kernel in enumerate(graph.kernels):
            for instr in kernel.instructions:
                if instr.name in names:
                    holding.setdefault(id(instr), []).append(k)
        kernels = {k for found in holding.values() for k in found}
        comms = [
            c
            for c, (_, _, members) in enumerate(graph.communications)
            if len(members) == 1 and members[0] in collectives
        ]
        copies: dict[int, float] = {}
        for split, count in chunking.splits:
            if count == chunks:
                share = chunking.copied_bytes(split, count) / len(split.dots)
                for dot in split.dots:
                    for k in holding.get(id(dot), ()):
                        copies[k] = copies.get(k, 0.0) + share
        for value in joined:
            if chunking.computed[value.name][1] == chunks:
                for k in holding.get(id(value), ()):
                    copies[k] = copies.get(k, 0.0) + value.shape.bytes
        graph = _split(graph, comms, kernels, chunks, copies)
    return graph


def chunk_kernel_s(seconds, graph: TaskGraph, profile: ClusterProfile):
    """Kernel times (a list or an array) with each chunk's share of its
    kernel's work: a chunk of 1/k takes 1/k of the kernel's time past its
    launch, and the whole launch; and the copies around the chunks (the slices
    before them, the concatenations after), read and written at the memory
    bandwidth, on the kernels of the split."""
    shares, copied = graph.kernel_shares, graph.kernel_copy_bytes
    if not shares:
        return seconds
    launch_s, bandwidth = profile.kernel_launch_s, profile.memory_bandwidth_bytes_per_s
    copied = copied + [0.0] * (len(shares) - len(copied))
    return [
        (float(s) if share == 1.0 else launch_s + max(float(s) - launch_s, 0.0) * share)
        + 2.0 * moved / bandwidth
        for s, share, moved in zip(seconds, shares, copied, strict=True)
    ]


def _split(
    graph: TaskGraph, comms: list[int], kernels: set[int], chunks: int, moved: dict[int, float]
) -> TaskGraph:
    """`graph` with communication tasks `comms` and `kernels` in `chunks`
    chunks (see the module's docstring), the kernels in chunk-major order
    (`_chunk_major`); `moved[k]`: the bytes copied around kernel k's chunks,
    shared by them. Each collective's first chunk keeps its task number; the
    others come after every communication task."""
    kernel_count, comm_count = len(graph.kernels), len(graph.communications)
    split = _split_kernels(graph, kernels, chunks, moved)
    first_comm = len(split.kernels)
    comm_chunks: dict[int, list[int]] = {}
    extra = first_comm + comm_count
    for c in comms:
        comm_chunks[c] = [first_comm + c] + list(range(extra, extra + chunks - 1))
        extra += chunks - 1

    def ids(task: int, chunk: int | None) -> list[int]:
        """The new tasks of old `task`: chunk `chunk` of a split one, where given."""
        if task < kernel_count:
            found = split.positions[task]
        elif task - kernel_count in comm_chunks:
            found = comm_chunks[task - kernel_count]
        else:
            return [first_comm + task - kernel_count]
        return [found[chunk]] if chunk is not None and len(found) > 1 else found

    def mapped(deps: list[int], chunk: int | None) -> list[int]:
        return sorted({new for d in deps for new in ids(d, chunk)})

    dependencies = [mapped(graph.dependencies[k], j) for k, j in split.origin]
    for c in range(comm_count):
        dependencies.append(
            mapped(graph.dependencies[kernel_count + c], 0 if c in comm_chunks else None)
        )
    communications = list(graph.communications)
    appended = []  # the old task of each appended chunk
    for c in comms:
        name, size, names = graph.communications[c]
        communications[c] = (f"{name}.chunk0", size // chunks, names)
        for j in range(1, chunks):
            communications.append((f"{name}.chunk{j}", size // chunks, names))
            dependencies.append(mapped(graph.dependencies[kernel_count + c], j))
            appended.append(c)
    split_graph = _with_chunked_communications(graph, comms, appended, communications)
    split_graph = replace(
        split_graph,
        kernels=split.kernels,
        dependencies=dependencies,
        kernel_runs=split.runs,
        kernel_shares=split.shares,
        kernel_copy_bytes=split.copied,
    )
    return _chunk_major(split_graph, split.origin, kernels)


@dataclass
class _SplitKernels:
    """The kernels once the chosen ones are split into chunks, with their
    runs, shares of the work and copied bytes; `positions[k]`: the new
    numbers of old kernel k; `origin[i]`: (old kernel, chunk or None) of new
    kernel i."""

    kernels: list = field(default_factory=list)
    runs: list[int] = field(default_factory=list)
    shares: list[float] = field(default_factory=list)
    copied: list[float] = field(default_factory=list)
    positions: list[list[int]] = field(default_factory=list)
    origin: list[tuple[int, int | None]] = field(default_factory=list)


def _split_kernels(
    graph: TaskGraph, kernels: set[int], chunks: int, moved: dict[int, float]
) -> _SplitKernels:
    """Each kernel of `kernels` as `chunks` kernels of 1/chunks of its work and
    of its copied bytes (with `moved[k]`, the bytes copied around its chunks);
    the others as they are."""
    kernel_count = len(graph.kernels)
    shares = graph.kernel_shares + [1.0] * (kernel_count - len(graph.kernel_shares))
    runs = graph.kernel_runs + [1] * (kernel_count - len(graph.kernel_runs))
    copied = graph.kernel_copy_bytes + [0.0] * (kernel_count - len(graph.kernel_copy_bytes))
    split = _SplitKernels()
    for k, kernel in enumerate(graph.kernels):
        count = chunks if k in kernels else 1
        start = len(split.kernels)
        split.positions.append(list(range(start, start + count)))
        for j in range(count):
            name = kernel.name if count == 1 else f"{kernel.name}.chunk{j}"
            split.kernels.append(kernel if count == 1 else replace(kernel, name=name))
            split.runs.append(runs[k])
            split.shares.append(shares[k] / count)
            split.copied.append((copied[k] + moved.get(k, 0.0)) / count)
            split.origin.append((k, j if count > 1 else None))
    return split


def _with_chunked_communications(
    graph: TaskGraph, comms: list[int], appended: list[int], communications: list
) -> TaskGraph:
    """`graph` with `communications` (the chunked collectives' first chunks in
    place, their other chunks appended, one for each old task in `appended`),
    and each communication attribute extended to the appended chunks; a chunk
    is sent as one array, never a tuple."""
    comm_count = len(graph.communications)

    def extended(values: list, default) -> list:
        values = values + [default] * (comm_count - len(values))
        return values + [values[c] for c in appended]

    tuple_bytes = extended(graph.tuple_element_bytes, ())
    for c in comms:
        tuple_bytes[c] = ()
    tuple_bytes[comm_count:] = [()] * len(appended)
    return replace(
        graph,
        communications=communications,
        is_bucket=extended(graph.is_bucket, False),
        tuple_element_bytes=tuple_bytes,
        communication_runs=extended(graph.communication_runs, 1),
        communication_kinds=extended(graph.communication_kinds, "all-reduce"),
        communication_groups=extended(graph.communication_groups, ((), 0)),
    )


def _chunk_major(
    graph: TaskGraph, origin: list[tuple[int, int | None]], split: set[int]
) -> TaskGraph:
    """`graph` with its kernels reordered so that the chunks of each connected
    group of split kernels run chunk by chunk (every kernel's chunk 0, then
    every chunk 1, ...), where they ran; other kernels keep their order. A
    kernel's place is the least of (its group's first old position, chunk, old
    position) among the ready kernels, so the order is the old one where
    nothing is split."""
    kernel_count = len(graph.kernels)
    parent = {k: k for k in split}

    def root(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    readers: dict[int, list[int]] = {}
    for new, (old, chunk) in enumerate(origin):
        if chunk is None:
            continue
        for dep in graph.dependencies[new]:
            if dep < kernel_count and origin[dep][1] is not None:
                a, b = root(old), root(origin[dep][0])
                parent[max(a, b)] = min(a, b)
            elif dep >= kernel_count:
                readers.setdefault(dep, []).append(old)
    for olds in readers.values():
        for old in olds[1:]:
            a, b = root(old), root(olds[0])
            parent[max(a, b)] = min(a, b)
    keys = [(old, 0, old) if chunk is None else (root(old), chunk, old) for old, chunk in origin]
    order = _ordered(graph, keys)
    if order == list(range(kernel_count)):
        return graph
    renumber = {old: new for new, old in enumerate(order)}
    renumber.update({t: t for t in range(kernel_count, graph.task_count)})
    dependencies = [sorted(renumber[d] for d in graph.dependencies[k]) for k in order]
    dependencies += [
        sorted(renumber[d] for d in deps) for deps in graph.dependencies[kernel_count:]
    ]
    return replace(
        graph,
        kernels=[graph.kernels[k] for k in order],
        dependencies=dependencies,
        kernel_runs=[graph.kernel_runs[k] for k in order],
        kernel_shares=[graph.kernel_shares[k] for k in order],
        kernel_copy_bytes=[graph.kernel_copy_bytes[k] for k in order],
    )


def _ordered(graph: TaskGraph, keys: list[tuple]) -> list[int]:
    """The kernels in the order of a list scheduler that runs, each time, the
    ready kernel of least key; communication tasks pass as soon as they are
    ready (they hold no place in the kernel order)."""
    kernel_count, tasks = len(graph.kernels), graph.task_count
    waiting = [len(set(deps)) for deps in graph.dependencies]
    users: list[list[int]] = [[] for _ in range(tasks)]
    for task, deps in enumerate(graph.dependencies):
        for dep in set(deps):
            users[dep].append(task)
    heap = [(keys[k], k) for k in range(kernel_count) if waiting[k] == 0]
    heapq.heapify(heap)
    passing = [t for t in range(kernel_count, tasks) if waiting[t] == 0]
    order = []

    def done(task: int) -> None:
        for user in users[task]:
            waiting[user] -= 1
            if waiting[user] == 0:
                if user < kernel_count:
                    heapq.heappush(heap, (keys[user], user))
                else:
                    passing.append(user)

    while heap or passing:
        while passing:
            done(passing.pop())
        if heap:
            _, kernel = heapq.heappop(heap)
            order.append(kernel)
            done(kernel)
    if len(order) < kernel_count:
        raise ValueError("the chunked task graph has a cycle")
    return order
