"""The simulator's events as files to look at: a Chrome / Perfetto trace
(`chrome_trace`) and a PNG Gantt chart (`plot_gantt`), one lane per stream or
thread."""

from __future__ import annotations

from disco_xla.simulator.result import SimulationResult


def chrome_trace(result: SimulationResult) -> dict:
    """The events as a Chrome / Perfetto trace (open it in ui.perfetto.dev)."""
    lanes = sorted({e.lane for e in result.events}, key=lambda lane: (lane != "compute", lane))
    lane_id = {lane: index for index, lane in enumerate(lanes)}
    trace = [
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": lane_id[lane], "args": {"name": lane}}
        for lane in lanes
    ]
    trace += [
        {
            "name": e.name,
            "cat": e.kind,
            "ph": "X",
            "pid": 0,
            "tid": lane_id[e.lane],
            "ts": e.start_s * 1e6,
            "dur": (e.end_s - e.start_s) * 1e6,
        }
        for e in result.events
    ]
    return {"traceEvents": trace, "displayTimeUnit": "ms", "otherData": result.summary()}


def plot_gantt(results: dict[str, SimulationResult], path: str) -> None:
    """A PNG Gantt chart, one panel per result, compute and communication lanes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"kernel": "#4c78a8", "copy": "#f58518", "all-reduce": "#e45756"}
    figure, axes = plt.subplots(
        len(results), 1, figsize=(12, 1.6 + 1.2 * len(results)), squeeze=False
    )
    for axis, (title, result) in zip(axes[:, 0], results.items(), strict=True):
        lanes = sorted({e.lane for e in result.events}, key=lambda lane: (lane != "compute", lane))
        for row, lane in enumerate(lanes):
            spans = [
                (e.start_s * 1e3, (e.end_s - e.start_s) * 1e3, e.kind)
                for e in result.events
                if e.lane == lane
            ]
            for kind in dict.fromkeys(k for _, _, k in spans):
                chosen = [(s, d) for s, d, k in spans if k == kind]
                colour = colours.get(kind, "#b279a2")  # another collective
                axis.broken_barh(chosen, (row - 0.4, 0.8), facecolors=colour, label=kind)
        axis.set_yticks(range(len(lanes)), lanes)
        axis.set_title(
            f"{title}: {result.iteration_s * 1e3:.3f} ms, T/T_ideal {result.t_over_ideal:.2f}"
        )
        axis.set_xlabel("ms")
        handles, labels = axis.get_legend_handles_labels()
        unique = dict(zip(labels, handles, strict=True))
        axis.legend(unique.values(), unique.keys(), loc="upper right", fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
