"""The first-call trial of `disco_xla.jit`: the candidate programs of one
argument signature built, run on copies of the user's arguments, judged against
the original (which runs once, last, on the user's own arguments, and may
consume them), and timed; and the agreement of every rank of a `jax.distributed`
job on each of those steps, so that all of them run the same program.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from disco_xla.settings import OptimizeSettings
from disco_xla.timing import rotating_median_seconds
from disco_xla.wrapped_step import TIMING_ROUNDS, fastest_label, one_line, slower_status

if TYPE_CHECKING:
    from disco_xla.jax_api import OptimizedFunction


@dataclass
class SignatureRecord:
    """What one argument signature of a step runs, and what its trial found."""

    status: str  # 'optimized', 'not data-parallel', or 'original: <reason>'
    run: Callable | None = None  # the rewritten program, when status is 'optimized'
    kept: list[int] = field(default_factory=list)
    delete_after: list[int] = field(default_factory=list)  # donated leaves `run` leaves alive
    out_tree: Any = None
    plan: Any = None
    timing: tuple[float, float] | None = None  # (original, rewritten) median seconds per step
    candidates: dict[str, dict] = field(default_factory=dict)  # see WrappedStep.measurements


# Timing the candidates of a first call: rounds of every program once.
TIMING_TARGET_S = 2.0
MAX_TIMING_ROUNDS = 5 * TIMING_ROUNDS


def agree_on_module(name: str, module, step: int, wait_s: float) -> None:
    """Raise AgreementError on every rank unless all captured the same module
    (every rank then runs the original, as the script wrote it)."""
    from disco_xla.runtime.agreement import AgreementError, gather

    fingerprints = gather(f"step{step}/module", module.fingerprint, wait_s)
    if len(set(fingerprints)) > 1:
        raise AgreementError(
            f"{name}: the ranks captured different modules (fingerprints "
            + ", ".join(f"rank {r}: {f[:12]}" for r, f in enumerate(fingerprints))
            + "); every rank must run the same step"
        )


def shared_choice(module, settings: OptimizeSettings, step: int, wait_s: float):
    """Rank 0's `PlanChoice` (from its cache or its search), on every rank."""
    from disco_xla.plan_cache import CandidateRecord
    from disco_xla.planning import PlanChoice, find_plan
    from disco_xla.runtime.agreement import broadcast

    def found() -> str:
        choice = find_plan(module, settings)
        return json.dumps({"key": choice.cache_key, "record": choice.candidates.to_json()})

    shared = json.loads(broadcast(f"step{step}/plan", found, wait_s))
    record = CandidateRecord.from_json(shared["record"], f"<plan for {module.name}>")
    return PlanChoice(record.plans["plan"], True, 0.0, record, shared["key"])


def mark_cached(report: dict[str, dict], label: str | None) -> None:
    """Mark the candidate tried only because the plan cache recorded it."""
    if label is not None and label in report:
        report[label]["from_cache"] = True


def remember(choice, settings: OptimizeSettings, trial: Trial, chosen: str) -> None:
    """Rank 0 stores the measured choice in its plan cache."""
    from disco_xla.planning import remember_measurement

    if jax.process_index() == 0 and trial.measured_s:
        remember_measurement(choice, settings, chosen, trial.measured_s)


def timing_rounds(round_s: float, budget_s: float) -> int:
    """How many rounds to time, when one round (every program once) takes
    `round_s`: enough to fill about TIMING_TARGET_S, at least TIMING_ROUNDS and
    at most MAX_TIMING_ROUNDS, and no more than fit `budget_s` (but two)."""
    wanted = min(MAX_TIMING_ROUNDS, max(TIMING_ROUNDS, int(TIMING_TARGET_S / max(round_s, 1e-9))))
    return max(2, min(wanted, int(budget_s / max(round_s, 1e-9))))


def deleted(leaf) -> bool:
    return getattr(leaf, "is_deleted", lambda: False)()


def donation_note(call: CallArguments) -> str:
    """'; donates args[0], opt_state' for a step whose original consumed those
    arguments on the first call (each named by its position or keyword, as the
    user passes it), else ''."""
    if not any(call.donated):
        return ""
    args, kwargs = jax.tree_util.tree_unflatten(call.tree, call.donated)
    names = [f"args[{i}]" for i, part in enumerate(args) if any(jax.tree_util.tree_leaves(part))]
    names += [name for name, part in kwargs.items() if any(jax.tree_util.tree_leaves(part))]
    return f"; donates {', '.join(names)}"


def _fresh_copy(leaf):
    """A copy of a device array in its own buffers, laid out and committed to
    its devices as the original (JAX refuses a committed array on other
    devices than a step's)."""
    if not isinstance(leaf, jax.Array):
        return leaf  # a host value: a step cannot consume it
    return jnp.array(leaf, copy=True)


class CallArguments:
    """The arguments of a first call. The step may donate some of them: JAX
    deletes a donated array when the call is made (and `args_info` does not
    always say which: a pmap's counts `donate_argnums` as leaf positions). So
    every run of the trial but one takes fresh copies of the arguments, copied
    from one set saved before anything runs, and the original runs once on the
    user's own arguments (`original`), giving the result the user gets; the
    arguments it deleted are the donated ones."""

    def __init__(self, function: OptimizedFunction, args: tuple, kwargs: dict, leaves, tree):
        self.function, self.args, self.kwargs = function, args, kwargs
        self.leaves, self.tree = list(leaves), tree
        self.donated = [False] * len(self.leaves)  # known once the original has run
        self.result: Any = None  # the original's result, once it has run
        self._saved: list | None = None

    def _save(self) -> list:
        if self._saved is None:
            self._saved = [_fresh_copy(leaf) for leaf in self.leaves]
        return self._saved

    def fresh_leaves(self) -> list:
        """Every argument leaf as a new copy (a program may consume it)."""
        return [_fresh_copy(leaf) for leaf in self._save()]

    def original(self, keep_copies: bool = True) -> Any:
        """Run the original step on the user's own arguments (which it may
        consume), once, and keep its result and what it donated; with
        `keep_copies`, copies of the arguments are saved first, for runs after."""
        if keep_copies:
            self._save()
        self.result = self.function._original(*self.args, **self.kwargs)
        self.donated = [deleted(leaf) for leaf in self.leaves]
        return self.result

    def original_on(self, leaves: list) -> Any:
        """Run the original on `leaves` (e.g. `fresh_leaves()`)."""
        args, kwargs = self.function._with_leaves(self.args, self.kwargs, self.tree, leaves)
        return self.function._original(*args, **kwargs)

    def release(self) -> None:
        """Drop the saved copies (the trial is over)."""
        self._saved = None


class Trial:
    """The candidate programs of one first call, built, run, judged and timed
    in step on every rank (a program with collectives runs on all ranks or on
    none)."""

    def __init__(self, function, module, lowered, compiled, call, step, wait_s, problem):
        self.function, self.module, self.lowered, self.compiled = (
            function,
            module,
            lowered,
            compiled,
        )
        self.call, self.step, self.wait_s = call, step, wait_s
        self.plans: dict[str, tuple[Any, bool]] = {}  # label -> (plan, fusion), as built
        self.fingerprints: dict[str, str] = {}  # label -> its rewritten module's fingerprint
        self.simulated_s: dict[str, float] = {}
        self.original_result: Any = None
        self.programs: dict[str, Any] = {}
        self.outputs: dict[str, Any] = {}
        self.verdicts: dict[str, bool] = {}
        self.same_as: dict[str, str] = {}
        self.measured_s: dict[str, float] = {}
        self.peak_bytes: dict[str, int] = {}  # label -> XLA's peak buffer bytes per device
        self.deleted_by: dict[str, set[int]] = {}  # label -> the argument leaves it consumed
        self.built: dict[str, Any] = {}  # label -> program, built ahead (`build_everything`)
        self.errors: dict[str, str] = {}  # label -> why its program was not built
        self.stopping: Callable[[], bool] = lambda: False  # True: build nothing more
        self.against = "original"
        self.problems: list[str] = [problem] if problem else []

    def first_agreeing(self, order: dict, executable, all_at_once: bool) -> tuple[list[str], Any]:
        """The labels of `order` whose programs every rank finds equal to the
        original (else to the reference), in order, and the original's result.
        With `all_at_once` every candidate is built and judged; otherwise one
        after the other until one agrees."""
        batches = [order] if all_at_once else [{label: order[label]} for label in order]
        result, equal = None, []
        for number, batch in enumerate(batches):
            self.build_and_run(batch, executable)
            if number == 0:
                result = self.call.original()  # on the user's arguments: after ours
                self.original_result = result
            equal = self._agreeing(list(batch), result)
            if equal:
                return equal, result
        self.build_and_run({"reference": (None, False)}, executable)
        return self._equal_to_reference(order), result

    def _equal_to_reference(self, order: dict) -> list[str]:
        """The labels of `order` that ran and that every rank finds equal to the
        reference, which has run (none agreed with the original)."""
        self.against = "reference"
        return self._agreeing([label for label in order if label in self.outputs], "reference")

    def build_and_run(self, candidates: dict[str, tuple[Any, bool]], executable) -> None:
        """Build each candidate's program (label -> (plan, fusion); the plan None
        for the unchanged module), and run those every rank built, once."""
        self.run(self.build(candidates, executable))

    def build_everything(self, order: dict[str, tuple[Any, bool]], executable) -> None:
        """Build every candidate of `order` and the reference (`built`): what a
        background trial does before `judge_built` runs them."""
        self.built = self.build(order, executable)
        self.built.update(self.build({"reference": (None, False)}, executable))

    def judge_built(self, order: dict) -> tuple[list[str], Any]:
        """Run every program `build_everything` built, then the original on the
        user's arguments; as `first_agreeing`, the labels of `order` every rank
        finds equal to the original (else to the reference), and its result."""
        self.run({label: p for label, p in self.built.items() if label != "reference"})
        result = self.call.original()
        self.original_result = result
        equal = self._agreeing(list(order), result)
        if equal or "reference" not in self.built:
            return equal, result
        self.run({"reference": self.built["reference"]})
        return self._equal_to_reference(order), result

    def build(self, candidates: dict[str, tuple[Any, bool]], executable) -> dict[str, Any]:
        """The programs of `candidates` that every rank built, by label."""
        from disco_xla.runtime.agreement import gather

        built = {}
        for label, (plan, fusion) in candidates.items():
            if executable is None or self.stopping():
                continue
            try:
                program = self._build(label, plan, fusion, executable)
            except Exception as error:  # noqa: BLE001
                self.problems.append(f"{label}: {one_line(error)}")
                self.errors[label] = one_line(error)
                continue
            if program is not None:
                built[label] = program
        # Run only what every rank built.
        topic = f"step{self.step}/built/{','.join(candidates)}"
        answers = gather(topic, ",".join(built), self.wait_s)
        everywhere = set.intersection(*(set(a.split(",")) - {""} for a in answers))
        if len(everywhere) < len(built) and len(answers) > 1:
            self.problems.append("another rank could not build every program")
        return {label: built[label] for label in candidates if label in everywhere}

    def run(self, built: dict[str, Any]) -> None:
        """Run each built program once on fresh copies of the arguments."""
        for label in built:
            try:
                fresh = self.call.fresh_leaves()
                # Waited for: in-process collectives dispatched back to back can
                # deadlock on a few cores (README).
                self.outputs[label] = jax.block_until_ready(
                    built[label]([fresh[i] for i in self.compiled.kept])
                )
                self.programs[label] = built[label]
                self.deleted_by[label] = {i for i, leaf in enumerate(fresh) if deleted(leaf)}
            except Exception as error:  # noqa: BLE001
                self.problems.append(f"{label} failed: {one_line(error)}")

    def _build(self, label: str, plan, fusion: bool, executable):
        """The program of one candidate, or None when it rewrites the module
        to the same program as a candidate built before it."""
        from disco_xla.planning import rewrite
        from disco_xla.runtime.apply import NO_COMBINER, check_all_reduces
        from disco_xla.runtime.jax_program import (
            check_memory,
            peak_bytes,
            standing_in_for,
            with_aliases_of,
        )

        target = self.module if plan is None else rewrite(self.module, plan, fusion, check=False)
        if plan is not None:
            for other, fingerprint in self.fingerprints.items():
                if fingerprint == target.fingerprint:
                    self.same_as[label] = other
                    return None
        aliased = with_aliases_of(target, executable)
        program = standing_in_for(aliased, self.lowered, executable, NO_COMBINER)
        original_stats, stats = executable.memory_analysis(), program.memory_stats()
        self.peak_bytes.setdefault("original", peak_bytes(original_stats))
        self.peak_bytes[label] = peak_bytes(stats)
        check_memory(original_stats, stats)
        if plan is not None:
            check_all_reduces(self.module, plan, program.compiled_module())
            self.fingerprints[label] = target.fingerprint
            self.plans[label] = (plan, fusion)
        return program

    def _judge(self, label: str, against) -> bool:
        if label not in self.outputs:
            return False
        if self.deleted_by[label] - self.donated():
            self.problems.append(f"{label}: it consumes arguments that the original keeps")
            return False
        expected = self.outputs.get(against) if isinstance(against, str) else against
        if expected is None:
            return False
        if isinstance(against, str):
            expected = list(expected)
        why = _difference(expected, self.outputs[label])
        if why:
            self.problems.append(f"{label}: {why}")
        return not why

    def _agreeing(self, labels: list[str], against) -> list[str]:
        """Those of `labels` whose outputs every rank finds equal to `against`
        (the original's result, or a label's outputs)."""
        from disco_xla.runtime.agreement import gather

        local = [self._judge(label, against) for label in labels]
        topic = "original" if not isinstance(against, str) else against
        answers = gather(
            f"step{self.step}/verdict/{topic}/{','.join(labels)}",
            "".join("1" if ok else "0" for ok in local),
            self.wait_s,
        )
        agreed = [all(answer[i] == "1" for answer in answers) for i in range(len(labels))]
        for label, ok in zip(labels, agreed, strict=True):
            if label in self.outputs:
                self.verdicts[label] = ok
        return [label for label, ok in zip(labels, agreed, strict=True) if ok]

    def donated(self) -> set[int]:
        """The argument leaves the original consumed."""
        return {i for i, donated in enumerate(self.call.donated) if donated}

    def left_to_delete(self, label: str) -> list[int]:
        """The argument leaves the original consumes and `label`'s program does
        not (a donated argument XLA could not alias): deleted after each run,
        so the user's loop sees JAX's own behaviour."""
        return sorted(self.donated() - self.deleted_by.get(label, set()))

    def fastest(self, labels: list[str]) -> str:
        """Time the original and the `labels`' programs, called as the user
        calls them, in rotating rounds (as many as `TIMING_ROUNDS` and rank 0's
        estimate of the measuring budget allow; averaged over the ranks, so all
        decide alike). Returns the fastest label, or 'original' when none is
        strictly faster than the original (`slower_status`)."""
        from disco_xla.runtime.agreement import broadcast

        kept, on_copies = self.compiled.kept, self.call.fresh_leaves
        calls = {"original": lambda leaves: jax.block_until_ready(self.call.original_on(leaves))}
        for label in labels:
            program = self.programs[label]
            calls[label] = lambda leaves, program=program: jax.block_until_ready(
                program([leaves[i] for i in kept])
            )
        started = time.perf_counter()
        for run in calls.values():
            run(on_copies())  # untimed: what the first runs set up is not measured
        round_s = time.perf_counter() - started
        budget_s = self.function._settings.measure_budget_s
        rounds = int(
            broadcast(
                f"step{self.step}/timing/rounds",
                lambda: str(timing_rounds(round_s, budget_s)),
                self.wait_s,
            )
        )
        self.average_over_ranks(rotating_median_seconds(calls, rounds, prepare=on_copies))
        return fastest_label(self.measured_s, labels)

    def average_over_ranks(self, local_s: dict[str, float]) -> None:
        """`measured_s`: each program's time on this rank, averaged over the
        ranks (so that all of them reach one verdict)."""
        from disco_xla.runtime.agreement import gather

        answers = gather(f"step{self.step}/timing", json.dumps(local_s), self.wait_s)
        every = [json.loads(answer) for answer in answers]
        self.measured_s = {label: sum(a[label] for a in every) / len(every) for label in local_s}

    def finish(self, chosen: str, equal: list[str], from_cache: str | None) -> None:
        """Fill the signature's record for running `chosen`, one of the `equal`
        labels or 'original' (when every equal one was slower)."""
        record = self.compiled
        if chosen == "original":
            record.status = self.original_status(equal)
        else:
            record.status = self.status_of(chosen)
            record.run = self.programs[chosen]
            record.delete_after = self.left_to_delete(chosen)
            record.plan = self.plans[chosen][0]
        record.candidates = self.report(chosen)
        mark_cached(record.candidates, from_cache)
        record.timing = self.timing_of(chosen)

    def timing_of(self, chosen: str) -> tuple[float, float] | None:
        """(original, chosen) median seconds per step, when they were timed."""
        if chosen == "original" or chosen not in self.measured_s:
            return None
        return self.measured_s["original"], self.measured_s[chosen]

    def status_of(self, label: str) -> str:
        """The status of a signature that runs the `label` candidate."""
        # Timed and the plan not refused (it may not have been tried: a cached
        # measurement chose the buckets alone).
        won_on_time = self.verdicts.get("plan") is not False and "buckets" in self.measured_s
        described = {
            "plan": "",
            "buckets": "buckets only: "
            + ("measured fastest" if won_on_time else "the plan's fusion changed results"),
        }.get(label, f"{label}, measured fastest")
        differing = ""
        if self.against == "reference":
            described += (", " if described else "") + "equal to the step compiled from HLO"
            differing = _differing_from(self.original_result, self.outputs[label])
        return (f"optimized ({described})" if described else "optimized") + differing

    def original_status(self, equal: list[str]) -> str:
        """The status when every agreeing candidate was slower than the original."""
        best = min(equal, key=lambda label: self.measured_s[label])
        return slower_status(
            self.measured_s["original"], self.measured_s[best], self.status_of(best)
        ) or ("original: " + self.why())

    def report(self, chosen: str) -> dict[str, dict]:
        """`measurements()`' entry for this signature."""
        entries: dict[str, dict] = {}
        refused = [label for label in self.errors if label != "reference"]
        for label in dict.fromkeys((*self.plans, *self.same_as, *refused)):
            entry: dict = {}
            if label in self.errors:
                entry["error"] = self.errors[label]
            if label in self.simulated_s:
                entry["simulated_s"] = self.simulated_s[label]
            if label in self.same_as:
                entry["same_as"] = self.same_as[label]
            elif label in self.verdicts:
                entry["equal"] = self.verdicts[label]
            if label in self.measured_s:
                entry["measured_s"] = self.measured_s[label]
            if label in self.peak_bytes:
                entry["peak_bytes"] = self.peak_bytes[label]
            entry["chosen"] = label == chosen
            entries[label] = entry
        original = entries.setdefault("original", {})
        if "original" in self.simulated_s:  # XLA's own program, as the simulator sees it
            original["simulated_s"] = self.simulated_s["original"]
        if "original" in self.measured_s:
            original["measured_s"] = self.measured_s["original"]
        if "original" in self.peak_bytes:
            original["peak_bytes"] = self.peak_bytes["original"]
        original["chosen"] = chosen == "original"
        return entries

    def why(self) -> str:
        return "; ".join(dict.fromkeys(self.problems)) or "no program agreed with the original"


def _difference(original_result: Any, rewritten_outputs: list) -> str:
    """Why the rewritten outputs do not count as equal to the original's ('' if they do)."""
    from disco_xla.runtime.apply import compare_outputs

    try:
        verdict = compare_outputs(
            _local(jax.tree_util.tree_leaves(original_result)), _local(rewritten_outputs)
        )
    except Exception as error:  # noqa: BLE001
        return "could not compare the outputs: " + one_line(error)
    if verdict.equal:
        return ""
    return (
        "the rewritten program's outputs differ from the original's (max relative "
        f"difference {verdict.max_rel_diff:.3g})"
    )


def _differing_from(original_result: Any, rewritten_outputs: list) -> str:
    """Which of this process's outputs differ from JAX's own program, by pytree
    path: XLA's HLO-to-StableHLO import rounds some values differently (e.g. the
    softmax's division), which Adam scales up where a gradient is 0 in exact
    arithmetic (benchmarks/jax_compile_equality.py)."""
    from disco_xla.runtime.apply import differing_outputs

    paths = [
        jax.tree_util.keystr(path)
        for path, _ in jax.tree_util.tree_flatten_with_path(original_result)[0]
    ]
    expected = [_local([leaf]) for leaf in jax.tree_util.tree_leaves(original_result)]
    got = [_local([array]) for array in rewritten_outputs]
    # One entry per leaf: its shards side by side.
    found = differing_outputs(
        [np.stack(shards) for shards in expected], [np.stack(shards) for shards in got]
    )
    if not found:
        return ""
    names = ", ".join(paths[i] for i in found[:8]) + (", ..." if len(found) > 8 else "")
    return f"; differs from JAX's own program in {len(found)} outputs: {names}"


def _local(arrays) -> list[np.ndarray]:
    """This process's shards of each array, in device order."""
    return [np.asarray(shard.data) for array in arrays for shard in array.addressable_shards]
