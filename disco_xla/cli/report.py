"""The HTML report of `disco-xla optimize`: the table of every baseline, the
ablations and the found plan (all simulated over the captured module), the
timelines of `xla` and the found plan one above the other, and the found plan's
buckets."""

from __future__ import annotations

import base64
import html
import os
import tempfile

from disco_xla.hlo.graph import HloModule
from disco_xla.plan import Plan
from disco_xla.simulator.profiles import ClusterProfile
from disco_xla.simulator.result import SimulationResult
from disco_xla.simulator.trace import plot_gantt


def write_report(
    path: str,
    module: HloModule,
    profile: ClusterProfile,
    results: dict[str, SimulationResult],
    plan: Plan,
    fusion_note: str = "",
) -> None:
    """Write the page to `path`: `results` holds each simulated plan by name,
    `xla` and `found` among them; `plan` is the found plan; `fusion_note` says
    where the baselines' XLA fusion came from (`fusion_source.XlaFusion.note`)."""
    xla_s = results["xla"].iteration_s
    rows = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{r.iteration_s * 1e3:.3f}</td>"
        f"<td>{xla_s / r.iteration_s:.2f}x</td><td>{r.t_over_ideal:.2f}</td>"
        f"<td>{r.exposed_comm_s * 1e3:.3f}</td><td>{r.buckets}</td><td>{r.kernels}</td></tr>"
        for name, r in results.items()
    )
    with tempfile.TemporaryDirectory() as directory:
        chart = os.path.join(directory, "gantt.png")
        plot_gantt({"xla": results["xla"], "found": results["found"]}, chart)
        with open(chart, "rb") as file:
            image = base64.b64encode(file.read()).decode()
    sizes = {i.name: i.shape.bytes for i in module.instructions()}
    buckets = "".join(
        f"<tr><td>{index}</td><td>{len(bucket)}</td>"
        f"<td>{sum(sizes[n] for n in bucket) / 1e6:.3f}</td>"
        f"<td>{html.escape(', '.join(bucket[:6]) + (' ...' if len(bucket) > 6 else ''))}</td></tr>"
        for index, bucket in enumerate(plan.all_reduce_buckets)
    )
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>disco-xla: {html.escape(module.name)}</title>
<style>body{{font-family:sans-serif;margin:2em}} td,th{{padding:2px 10px;text-align:right}}
td:first-child,th:first-child{{text-align:left}}</style></head><body>
<h1>{html.escape(module.name)} on {html.escape(profile.name)}</h1>
<p>{profile.workers} workers, {html.escape(profile.execution)}; times simulated with the
{html.escape(results["found"].cost_model)} cost model. Baselines from
{html.escape(fusion_note or "no XLA fusion")}.</p>
<table><tr><th>plan</th><th>iteration ms</th><th>vs xla</th><th>T/T_ideal</th>
<th>exposed comm ms</th><th>buckets</th><th>kernels</th></tr>{rows}</table>
<p>T_ideal = max(C, A) = {results["found"].ideal_s * 1e3:.3f} ms: C is the kernel time of
XLA's fusion, A one all-reduce of every gradient byte.</p>
<h2>Timelines</h2>
<img alt="Gantt charts of xla and the found plan" src="data:image/png;base64,{image}">
<h2>Buckets of the found plan</h2>
<table><tr><th>bucket</th><th>gradients</th><th>MB</th><th>first members</th></tr>{buckets}</table>
</body></html>
"""
    with open(path, "w") as file:
        file.write(page)
