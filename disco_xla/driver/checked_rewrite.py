"""Rewriting a module for a plan, and the checked rewrite: the candidate
programs of a plan rewritten, run against the original on this machine, and the
fastest one that computes the same kept (`checked_rewrite`), else the original.
What `disco-xla apply`, `disco-xla optimize -o MODULE` and the demo write."""

from __future__ import annotations

from dataclasses import dataclass

from disco_xla.errors import DiscoInputError, RewriteError
from disco_xla.hlo.graph import HloModule
from disco_xla.plan import Plan
from disco_xla.runtime.apply import apply_plan
from disco_xla.runtime.candidate_timing import time_candidates
from disco_xla.runtime.xla_runner import compile_separately, devices_needed
from disco_xla.search.fusion_source import XlaFusion, xla_fusion_of

# XLA's own fusion of the modules seen last, by fingerprint: every candidate of
# one module is rewritten against the same compile.
_OWN_FUSION: dict[str, XlaFusion] = {}
_OWN_FUSION_KEPT = 8


def xla_own_fusion(module: HloModule) -> XlaFusion:
    """The fusion XLA forms by itself on `module` (its kernels compiled here and
    mapped back onto it, combiner off, as every baseline), modelled when the
    module does not compile here (`fusion_source.xla_fusion_of`)."""
    found = _OWN_FUSION.get(module.fingerprint)
    if found is None:
        found = xla_fusion_of(module, compile_separately)
        if len(_OWN_FUSION) >= _OWN_FUSION_KEPT:
            _OWN_FUSION.pop(next(iter(_OWN_FUSION)))
        _OWN_FUSION[module.fingerprint] = found
    return found


def xla_own_groups(module: HloModule) -> tuple[tuple[str, ...], ...]:
    """The groups of `xla_own_fusion`."""
    return xla_own_fusion(module).groups


def rewrite(
    module: HloModule,
    plan: Plan,
    fusion: bool = True,
    check: bool = True,
    source: str | None = None,
) -> HloModule:
    """The module rewritten to run `plan` (only its buckets with `fusion=False`),
    verified to compile to its buckets unless `check=False` (then the caller
    compiles it and calls `runtime.collective_census.check_collectives`). Only the groups
    that depart from XLA's own fusion get a boundary."""
    source = source or f"<plan for {module.name}>"
    left_to_xla = xla_own_groups(module) if fusion else None
    return apply_plan(
        module, plan, plan_source=source, fusion=fusion, check=check, left_to_xla=left_to_xla
    )


# A module that needs more devices than this is not run here to check it.
MAX_CHECK_DEVICES = 16


@dataclass(frozen=True)
class CheckedRewrite:
    """What a safe rewrite wrote, and the measurements that chose it."""

    module: HloModule  # the program to write
    written: (
        str  # 'plan', 'buckets' (the plan's buckets alone), an alternative's label, or 'original'
    )
    why: str  # one line: why this one
    original_s: float | None  # median step times, paired (None when not measured)
    written_s: float | None
    equal: bool | None  # the written program's outputs against the original's
    # label -> {'seconds', 'equal', 'max_rel_diff'} (and 'simulated_s' where
    # known), {'error'}, or {'same_as': the label of the same program}
    candidates: dict
    plan: Plan | None = None  # the plan written (whole, or its buckets); None: the original

    def measured(self) -> dict | None:
        """The `measured` object of the CLI's JSON (None when not checked)."""
        if self.original_s is None:
            return None
        return {
            "original_s": self.original_s,
            "written_s": self.written_s,
            "equal": self.equal,
            "written": self.written,
            "candidates": self.candidates,
        }


def checked_rewrite(
    module: HloModule,
    plan: Plan,
    source: str,
    buckets_only: bool = False,
    check: bool = True,
    rounds: int = 5,
    alternatives: dict[str, Plan] | None = None,
    simulated_s: dict[str, float] | None = None,
    budget_s: float | None = None,
) -> CheckedRewrite:
    """The best program for `plan` that is never slower than `module` nor
    computes differently: the plan (fusion boundaries and buckets), its buckets
    alone, or one of the `alternatives` (label -> plan: the search's next best
    plans, the best baseline; each rewritten whole, or its buckets alone with
    `buckets_only`), else `module` unchanged. Each candidate is run against the
    original on the same random inputs on this machine's CPU devices, timed in
    paired rotating rounds (their wall time capped by `budget_s`); the fastest
    one that is equal and faster than the original is written (timed against
    XLA's own program of `module`, all-reduce combiner on). The report gives each
    candidate's measured time, and its simulated time from `simulated_s` (by
    label) where known. `check=False` writes the plan (or its buckets)
    unmeasured, for a module meant for another machine. Raises DiscoInputError
    when the module cannot be checked here, or the plan does not fit it."""
    kinds = ("buckets",) if buckets_only else ("plan", "buckets")
    if not check:
        return _unchecked_rewrite(module, plan, kinds[0], source, "not checked (--no-check)")
    own = xla_own_fusion(module)
    if own.source == "model":  # XLA cannot compile the module here: nothing to run
        why = f"not measured: the module does not run here; {own.note}"
        return _unchecked_rewrite(module, plan, kinds[0], source, why)
    devices = _devices_to_check(module)
    wanted = {kind: (plan, kind == "plan") for kind in kinds}
    for label, other in (alternatives or {}).items():
        wanted[label] = (other, not buckets_only)
    candidates, report = _distinct_rewrites(module, wanted, kinds, source)
    original_s, results = _timed(module, candidates, devices, rounds, budget_s)
    _add_results(report, results, simulated_s or {})
    passing = [
        kind
        for kind in results
        if results[kind].outputs.equal and results[kind].seconds < original_s
    ]
    if not passing:
        refusals = "; ".join(f"the {kind} {_refusal(report[kind], original_s)}" for kind in report)
        return CheckedRewrite(module, "original", refusals, original_s, original_s, True, report)
    best = min(passing, key=lambda kind: results[kind].seconds)
    why = f"{original_s / results[best].seconds:.2f}x the original's speed, outputs equal"
    if best != kinds[0]:
        why += f"; the {kinds[0]} was {_refusal(report[kinds[0]], original_s)}"
    seconds = results[best].seconds
    return CheckedRewrite(
        candidates[best], best, why, original_s, seconds, True, report, wanted[best][0]
    )


def _devices_to_check(module: HloModule) -> int:
    """The devices the module runs on, refused past MAX_CHECK_DEVICES."""
    devices = devices_needed(module)
    if devices > MAX_CHECK_DEVICES:
        raise DiscoInputError(
            module.source,
            f"the module runs on {devices} devices; this machine checks rewrites on at most "
            f"{MAX_CHECK_DEVICES} (pass --no-check to write the plan unchecked)",
        )
    return devices


def _timed(module: HloModule, candidates: dict, devices: int, rounds: int, budget_s):
    """`time_candidates` against XLA's own program (combiner on): what the user
    would run otherwise. XLA's errors mean the module does not run here."""
    try:
        return time_candidates(module, candidates, devices, rounds, 0, (), budget_s=budget_s)
    except Exception as error:  # noqa: BLE001 - one line for the user, not a traceback
        message = " ".join(str(error).split())[:300]
        raise DiscoInputError(
            module.source,
            f"cannot run the module here to check the rewrite ({type(error).__name__}: "
            f"{message}); pass --no-check to write the plan unchecked",
        ) from None


def _unchecked_rewrite(
    module: HloModule, plan: Plan, kind: str, source: str, why: str
) -> CheckedRewrite:
    """The plan (or its buckets alone, `kind`) written without running it. A
    module XLA cannot compile here is still checked as far as XLA goes here:
    its parser and verifier must accept the rewritten module (`_accepted_by_xla`)."""
    compiles_here = xla_own_fusion(module).source != "model"
    try:
        written = rewrite(module, plan, fusion=kind == "plan", check=compiles_here, source=source)
        if not compiles_here:
            _accepted_by_xla(module, written)
    except RewriteError as error:
        raise DiscoInputError(source, str(error)) from None
    return CheckedRewrite(written, kind, why, None, None, None, {}, plan)


def _accepted_by_xla(original: HloModule, written: HloModule) -> None:
    """Raise RewriteError unless XLA accepts `written` as far as this host
    goes: its compile may fail only where the original's does, at a custom
    call this host has no handler for (XLA looks for one after its parser and
    verifier have passed the module)."""
    try:
        compile_separately(written)
    except Exception as error:  # noqa: BLE001 - XLA's errors, read below
        message = str(error)
        targets = {i.proto.custom_call_target for i in original.instructions()}
        if not any(target and target in message for target in targets):
            first = " ".join(message.split())[:300]
            raise RewriteError(f"XLA refuses the rewritten module: {first}") from None


def _add_results(report: dict[str, dict], results: dict, simulated_s: dict[str, float]) -> None:
    """Each measured candidate's entry in the report, and the simulated
    seconds of every candidate that has an entry."""
    for kind, result in results.items():
        report[kind] = {
            "seconds": result.seconds,
            "equal": result.outputs.equal,
            "max_rel_diff": result.outputs.max_rel_diff,
        }
    for label, seconds in simulated_s.items():
        if label in report:
            report[label]["simulated_s"] = seconds


def _distinct_rewrites(
    module: HloModule, wanted: dict[str, tuple[Plan, bool]], kinds: tuple[str, ...], source: str
) -> tuple[dict[str, HloModule], dict[str, dict]]:
    """Each wanted candidate (label -> (plan, fusion)) rewritten, leaving out
    those that make the same program as one before them; and the report's
    entries of those that failed ({'error'}) or were left out ({'same_as'};
    not for the plan's own `kinds`, which the report describes otherwise)."""
    candidates: dict[str, HloModule] = {}
    report: dict[str, dict] = {}
    for label, (each, fusion) in wanted.items():
        try:
            candidate = rewrite(module, each, fusion=fusion, source=source)
        except RewriteError as error:
            report[label] = {"error": str(error)}
            continue
        same = [c for c, m in candidates.items() if m.fingerprint == candidate.fingerprint]
        if same and label not in kinds:
            report[label] = {"same_as": same[0]}
        if same:
            continue  # e.g. no fusion departure: the plan is its buckets
        candidates[label] = candidate
    return candidates, report


def _refusal(entry: dict, original_s: float) -> str:
    """Why a measured candidate was not written, in a few words."""
    if "error" in entry:
        return f"failed ({entry['error']})"
    if "same_as" in entry:
        return f"the same program as the {entry['same_as']}"
    if not entry["equal"]:
        return f"computed differently (max relative difference {entry['max_rel_diff']:.2g})"
    if entry["seconds"] >= original_s:
        return f"slower ({original_s / entry['seconds']:.2f}x the original's speed)"
    return "slower than the program written"
