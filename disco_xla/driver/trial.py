"""The trial of a step's candidate programs, the same for every framework.

A first call (or, in the background, a later one) builds the candidate programs
of one argument signature, runs each once beside the original, keeps those that
compute the same (the rule of `runtime.output_comparison.compare_outputs`), times them
beside the original as the user calls it, and fills the signature's record with
the fastest, or with the original and why. `Trial` holds those steps and the
report of what it found; a framework adapter (`jax_trial.JaxTrial`,
`tf_trial.TfTrial`) says how to compile a rewritten module, run it, run the
original, compare results and time a call. The trial speaks to the other ranks
of a job through `_gather` and `_broadcast`; a single process (the adapter's
default) answers them itself, so the same code serves `jax.distributed`, where
every rank must reach every verdict alike.

The candidates come from the plan cache's `CandidateRecord`: the plan, its
buckets alone and, when they are timed, the search's next best plans and the
best baseline (`candidate_order`). A choice that an earlier measured run on this
machine recorded is the only one tried; a recorded 'original' runs the
original, untried (`reuses_original`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from disco_xla.driver.planning import remember_measurement
from disco_xla.driver.signature_record import RecordState, SignatureRecord
from disco_xla.errors import one_line
from disco_xla.settings import OptimizeSettings
from disco_xla.timing import rotating_median_seconds

# Timing the candidates: rounds of every program once.
TIMING_ROUNDS = 6  # at least; and the rounds of a background trial
TIMING_TARGET_S = 2.0
MAX_TIMING_ROUNDS = 5 * TIMING_ROUNDS


def timing_rounds(round_s: float, budget_s: float) -> int:
    """How many rounds to time, when one round (every program once) takes
    `round_s`: enough to fill about TIMING_TARGET_S, at least TIMING_ROUNDS and
    at most MAX_TIMING_ROUNDS, and no more than fit `budget_s` (but two)."""
    wanted = min(MAX_TIMING_ROUNDS, max(TIMING_ROUNDS, int(TIMING_TARGET_S / max(round_s, 1e-9))))
    return max(2, min(wanted, int(budget_s / max(round_s, 1e-9))))


def slower_status(original_s: float, rewritten_s: float, chosen: str) -> str | None:
    """The first-call speed check's rule: the rewritten program stays only if it
    is strictly faster than the original (times per step, as the user calls them).
    Returns the status of a signature that runs the original because it is
    faster here (or as fast), else None. `chosen` is the rewritten program's status."""
    if rewritten_s < original_s:
        return None
    return (
        f"original: faster here ({original_s * 1e3:.3f} ms per step "
        f"against {rewritten_s * 1e3:.3f} ms for {chosen})"
    )


def fastest_label(measured_s: dict[str, float], labels: list[str]) -> str:
    """The label of `labels` with the least measured time (the earlier one on a
    tie), or 'original' when it is not strictly faster than `measured_s['original']`
    (`slower_status`'s rule)."""
    best = min(labels, key=lambda label: (measured_s[label], labels.index(label)))
    return best if measured_s[best] < measured_s["original"] else "original"


def candidate_order(choice: Any, measuring: bool) -> dict[str, tuple[Any, bool]]:
    """The candidate programs of a `PlanChoice` in order of preference, label ->
    (plan, whether its fusion groups are applied): the plan, its buckets alone,
    then (when they are timed) the search's next best and the best baseline.
    A candidate that an earlier measured run on this machine chose (the cache's
    `CandidateRecord.chosen`) is the only one tried, when it is among them (a
    recorded 'original' is not a candidate: `Trial.reuses_original`)."""
    record = choice.candidates
    order = {"plan": (choice.plan, True), "buckets": (choice.plan, False)}
    if measuring:
        order.update({label: (plan, True) for label, plan in record.plans.items()})
    if record.chosen in order:
        order = {record.chosen: order[record.chosen]}
    return order


def reuses_original(candidates: Any, settings: OptimizeSettings) -> bool:
    """Whether a measured run here recorded the original as the fastest (in
    the plan cache's `candidates` record): with the speed check on, nothing is
    built and the original runs."""
    return settings.check_speed and candidates.chosen == "original"


def cached_original_status(measured: dict[str, float]) -> str:
    """The status when the plan cache records that the original ran faster on
    this machine than every candidate: with the times `measured` then."""
    others = {label: t for label, t in measured.items() if label != "original"}
    status = None
    if "original" in measured and others:
        best = min(others, key=others.get)
        status = slower_status(measured["original"], others[best], f"optimized ({best})")
    if status is None:
        return "original: faster here (measured before, from the plan cache)"
    return status.removesuffix(")") + ", from the plan cache)"


def cached_label(choice: Any, order: dict) -> str | None:
    """The label `candidate_order` kept alone because the cache recorded it as
    the measured choice, else None."""
    chosen = choice.candidates.chosen
    return chosen if chosen is not None and list(order) == [chosen] else None


class Trial:
    """The candidate programs of one signature: built, run, judged and timed.
    Subclasses fill in the framework's part (the methods that raise
    NotImplementedError, and the ranks' exchange where there are several)."""

    # Judge against the unchanged module compiled as the candidates are, when
    # no candidate computes what the original does (see `JaxTrial`).
    uses_reference = False

    def __init__(self, module, choice, settings: OptimizeSettings, problem: str = ""):
        self.module, self.choice, self.settings = module, choice, settings
        measuring = settings.check_speed
        self.reuses_original = reuses_original(choice.candidates, settings)
        self.order = {} if self.reuses_original else candidate_order(choice, measuring)
        self.from_cache = cached_label(choice, self.order)
        self.simulated_s: dict[str, float] = dict(choice.candidates.simulated_s)
        self.plans: dict[str, tuple[Any, bool]] = {}  # label -> (plan, fusion), as built
        self.fingerprints: dict[str, str] = {}  # label -> its rewritten module's fingerprint
        self.same_as: dict[str, str] = {}
        self.errors: dict[str, str] = {}  # label -> why its program was not built
        self.built: dict[str, Any] = {}  # label -> program, built ahead (`build_everything`)
        self.programs: dict[str, Any] = {}  # label -> program, once it ran
        self.outputs: dict[str, Any] = {}
        self.comparisons: dict[str, Any] = {}  # label -> its OutputComparison
        self.verdicts: dict[str, bool] = {}
        self.measured_s: dict[str, float] = {}
        self.peak_bytes: dict[str, int] = {}  # label -> XLA's peak buffer bytes per device
        self.original_ran = False
        self.original_result: Any = None
        self.expected: Any = None  # what the candidates' outputs are compared with
        self.against = "original"
        self.stopping: Callable[[], bool] = lambda: False  # True: build nothing more
        self.can_build = True  # False: this rank builds nothing (it still answers the others)
        self.problems: list[str] = [problem] if problem else []

    # -- the framework's part ---------------------------------------------------

    def _rewritten(self, plan, fusion: bool):
        """The module rewritten for `plan` (with its fusion groups or not)."""
        raise NotImplementedError

    def _compile(self, label: str, module, plan) -> Any:
        """A program of `module` (`plan` None: the unchanged module), or raise."""
        raise NotImplementedError

    def _run(self, label: str, program) -> Any:
        """Run `program` once on (copies of) the arguments; its outputs."""
        raise NotImplementedError

    def _run_original(self) -> tuple[Any, Any]:
        """Run the original once, as the user called it: its result, and what
        the candidates' outputs are compared with."""
        raise NotImplementedError

    def _compare(self, expected, outputs):
        """The `OutputComparison` of `outputs` against `expected` (the
        original's, or another program's outputs)."""
        raise NotImplementedError

    def _refusal(self, label: str) -> str:
        """Why `label`'s program may not run in the original's place although
        it computes the same ('' when it may)."""
        return ""

    def _timed_calls(self, labels: list[str]) -> tuple[dict[str, Callable], Callable | None]:
        """The original's and `labels`' programs as calls to time (each taking
        what the second item, when given, prepares for it)."""
        raise NotImplementedError

    def _after_timing(self) -> None:
        """Undo what the timed calls changed."""

    def _install(self, record: SignatureRecord, chosen: str) -> None:
        """Make `record` run the `chosen` candidate's program."""
        record.run = self.programs[chosen]

    def _gather(self, topic: str, value: str) -> list[str]:
        """Every rank's `value` (one process: its own)."""
        return [value]

    def _broadcast(self, topic: str, make: Callable[[], str]) -> str:
        """Rank 0's `make()`, on every rank (one process: its own)."""
        return make()

    def _records_choices(self) -> bool:
        """Whether this rank stores the measured choice in the plan cache."""
        return True

    # -- the trial ----------------------------------------------------------------

    def run_first_call(self, record: SignatureRecord) -> Any:
        """The trial in one call: fill `record` and return the original's
        result. A failure after the original ran leaves `record` on the
        original with the reason; one before it raises (the caller runs the
        original)."""
        record.plan = self.choice.plan
        if self.reuses_original:
            record.set(RecordState.ORIGINAL_FASTER, self.cached_original_status())
            record.candidates = self.report("original")
            return self.original()
        measuring = self.settings.check_speed
        equal = self.first_agreeing(all_at_once=measuring)
        if not equal:
            record.fall_back(self.why())
            record.candidates = self.report("original")
            return self.original_result
        try:
            self.finish(record, self.fastest(equal) if measuring else equal[0])
        except Exception as error:  # noqa: BLE001 - never break training
            record.fall_back("the speed check failed: " + one_line(error))
            record.candidates = self.report("original")
        return self.original_result

    def original(self) -> Any:
        """Run the original once; its result (kept, with what to compare with)."""
        self.original_result, self.expected = self._run_original()
        self.original_ran = True
        return self.original_result

    def first_agreeing(self, all_at_once: bool) -> list[str]:
        """The candidates every rank finds equal to the original (else to the
        reference), in order. With `all_at_once` every candidate is built and
        judged; otherwise one after the other until one agrees. The original
        runs once, after the first candidates (it may consume the arguments)."""
        order = self.order
        batches = [order] if all_at_once else [{label: order[label]} for label in order]
        for batch in batches:
            self.run_programs(self.build(batch))
            if not self.original_ran:
                self.original()
            equal = self._agreeing(list(batch), None)
            if equal:
                return equal
        if not self.original_ran:
            self.original()
        if not self.uses_reference:
            return []
        self.run_programs(self.build({"reference": (None, False)}))
        return self._equal_to_reference()

    def build_everything(self) -> None:
        """Build every candidate and the reference (`built`), to be judged
        later by `judge_built`."""
        self.built = self.build(self.order)
        if self.uses_reference:
            self.built.update(self.build({"reference": (None, False)}))

    def judge_built(self) -> list[str]:
        """Run every program `build_everything` built, then the original; as
        `first_agreeing`, the candidates every rank finds equal."""
        self.run_programs({label: p for label, p in self.built.items() if label != "reference"})
        self.original()
        equal = self._agreeing(list(self.order), None)
        if equal or "reference" not in self.built:
            return equal
        self.run_programs({"reference": self.built["reference"]})
        return self._equal_to_reference()

    def _equal_to_reference(self) -> list[str]:
        self.against = "reference"
        return self._agreeing([label for label in self.order if label in self.outputs], "reference")

    def build(self, candidates: dict[str, tuple[Any, bool]]) -> dict[str, Any]:
        """The programs of `candidates` (label -> (plan, fusion); the plan None
        for the unchanged module) that every rank built, by label."""
        built = {}
        for label, (plan, fusion) in candidates.items():
            if self.stopping() or not self.can_build:
                continue
            try:
                program = self._program(label, plan, fusion)
            except Exception as error:  # noqa: BLE001
                self.problems.append(f"{label}: {one_line(error)}")
                self.errors[label] = one_line(error)
                continue
            if program is not None:
                built[label] = program
        # Run only what every rank built.
        answers = self._gather(f"built/{','.join(candidates)}", ",".join(built))
        everywhere = set.intersection(*(set(a.split(",")) - {""} for a in answers))
        if len(everywhere) < len(built) and len(answers) > 1:
            self.problems.append("another rank could not build every program")
        return {label: built[label] for label in candidates if label in everywhere}

    def _program(self, label: str, plan, fusion: bool) -> Any:
        """One candidate's program, or None when its rewrite is the same module
        as a candidate's built before it."""
        target = self.module if plan is None else self._rewritten(plan, fusion)
        if plan is not None:
            for other, fingerprint in self.fingerprints.items():
                if fingerprint == target.fingerprint:
                    self.same_as[label] = other
                    return None
        program = self._compile(label, target, plan)
        if plan is not None:
            self.fingerprints[label] = target.fingerprint
            self.plans[label] = (plan, fusion)
        return program

    def run_programs(self, built: dict[str, Any]) -> None:
        """Run each built program once, keeping its outputs."""
        for label, program in built.items():
            try:
                self.outputs[label] = self._run(label, program)
                self.programs[label] = program
            except Exception as error:  # noqa: BLE001
                self.problems.append(f"{label} failed: {one_line(error)}")

    def _judge(self, label: str, against: str | None) -> bool:
        """Whether `label`'s outputs equal the original's (`against` None) or
        another program's."""
        if label not in self.outputs:
            return False
        refusal = self._refusal(label)
        if refusal:
            self.problems.append(f"{label}: {refusal}")
            return False
        expected = self.expected if against is None else self.outputs.get(against)
        if expected is None:
            return False
        try:
            comparison = self._compare(expected, self.outputs[label])
        except Exception as error:  # noqa: BLE001
            self.problems.append("could not compare the outputs: " + one_line(error))
            return False
        if against is None:
            self.comparisons[label] = comparison
        if not comparison.equal:
            named = len(self.order) > 1 and label != "plan"  # which of several differs
            self.problems.append(
                (f"{label}: " if named else "")
                + "the rewritten program's outputs differ from the original's (max "
                f"relative difference {comparison.max_rel_diff:.3g})"
            )
        return comparison.equal

    def _agreeing(self, labels: list[str], against: str | None) -> list[str]:
        """Those of `labels` whose outputs every rank finds equal to `against`."""
        local = "".join("1" if self._judge(label, against) else "0" for label in labels)
        answers = self._gather(f"verdict/{against or 'original'}/{','.join(labels)}", local)
        agreed = [all(answer[i] == "1" for answer in answers) for i in range(len(labels))]
        for label, ok in zip(labels, agreed, strict=True):
            if label in self.outputs:
                self.verdicts[label] = ok
        return [label for label, ok in zip(labels, agreed, strict=True) if ok]

    def fastest(self, labels: list[str]) -> str:
        """Time the original and the `labels`' programs, called as the user
        calls them, in rotating rounds (after one untimed round; as many as
        `timing_rounds` allows for rank 0's first round and the measuring
        budget). Returns the fastest label, or 'original' when none is strictly
        faster (`slower_status`)."""
        calls, prepare = self._timed_calls(labels)
        try:
            started = time.perf_counter()
            for call in calls.values():  # untimed: what the first runs set up is not measured
                call(prepare()) if prepare else call()
            round_s = time.perf_counter() - started
            budget_s = self.settings.measure_budget_s
            rounds = int(
                self._broadcast("timing/rounds", lambda: str(timing_rounds(round_s, budget_s)))
            )
            local_s = rotating_median_seconds(calls, rounds, prepare=prepare)
        finally:
            self._after_timing()
        return self.decide(local_s, labels)

    def decide(self, local_s: dict[str, float], labels: list[str], topic: str = "timing") -> str:
        """From this rank's median times (`local_s`), every rank's average
        (`measured_s`) and the fastest of `labels` (or 'original')."""
        answers = self._gather(topic, json.dumps(local_s))
        every = [json.loads(answer) for answer in answers]
        self.measured_s = {label: sum(a[label] for a in every) / len(every) for label in local_s}
        return fastest_label(self.measured_s, labels)

    def finish(self, record: SignatureRecord, chosen: str) -> None:
        """Fill `record` for running `chosen` (a candidate that agreed, or
        'original' when every one was slower), and store a measured choice in
        the plan cache."""
        if self.measured_s and self._records_choices():
            remember_measurement(self.choice, self.settings, chosen, self.measured_s)
        timed = chosen
        if chosen == "original":
            others = [label for label in self.measured_s if label != "original"]
            timed = min(others, key=self.measured_s.__getitem__)
            record.run = None
            faster = self.original_status(timed)
            if faster is None:
                record.fall_back(self.why())
            else:
                record.set(RecordState.ORIGINAL_FASTER, faster)
        else:
            record.set(RecordState.OPTIMIZED, self.status_of(chosen))
            record.plan = self.plans[chosen][0]
            self._install(record, chosen)
        record.comparison = self.comparisons.get(timed)
        if timed in self.measured_s:
            record.timing = (self.measured_s["original"], self.measured_s[timed])
        record.candidates = self.report(chosen)

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
            differing = self._differing(label)
        return (f"optimized ({described})" if described else "optimized") + differing

    def _differing(self, label: str) -> str:
        """What `label`'s program, judged against the reference, computes
        differently from the original ('; differs ...', or '')."""
        return ""

    def original_status(self, best: str) -> str | None:
        """The status when every agreeing candidate, `best` the fastest, was
        slower than the original (None where it was not: no candidate ran)."""
        return slower_status(
            self.measured_s["original"], self.measured_s[best], self.status_of(best)
        )

    def cached_original_status(self) -> str:
        """The status when the plan cache records that the original ran faster
        on this machine than every candidate (`cached_original_status`)."""
        return cached_original_status(self.choice.candidates.measured_s)

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
            for key, values in (("measured_s", self.measured_s), ("peak_bytes", self.peak_bytes)):
                if label in values:
                    entry[key] = values[label]
            entry["chosen"] = label == chosen
            if label == self.from_cache:
                entry["from_cache"] = True
            entries[label] = entry
        original = entries.setdefault("original", {})
        if "original" in self.simulated_s:  # XLA's own program, as the simulator sees it
            original["simulated_s"] = self.simulated_s["original"]
        for key, values in (("measured_s", self.measured_s), ("peak_bytes", self.peak_bytes)):
            if "original" in values:
                original[key] = values["original"]
        original["chosen"] = chosen == "original"
        if self.reuses_original:
            original["from_cache"] = True
        return entries

    def why(self) -> str:
        return "; ".join(dict.fromkeys(self.problems)) or "no program agreed with the original"
