"""Run the original and its rewrites on the same random inputs, compare their
outputs, and time them in paired rounds whose order rotates
(`time_candidates`; `verify_rewrite` for one rewrite). Over several processes
every rank runs the same steps and rounds (`agreement.broadcast`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from disco_xla.errors import RewriteError
from disco_xla.hlo.graph import HloModule
from disco_xla.runtime.agreement import broadcast
from disco_xla.runtime.output_comparison import OutputComparison, compare_outputs
from disco_xla.runtime.xla_runner import (
    PartitionedProgram,
    no_combiner,
    program_for,
    random_arguments,
)

# Timing: each program runs for about ROUND_S per round (at most this many steps).
ROUND_S = 0.02
MAX_STEPS_PER_ROUND = 50


@dataclass(frozen=True)
class VerifiedRewrite:
    """What `verify_rewrite` found: the rewritten step's outputs against the
    original's, and both programs' step times."""

    equal: bool  # bit-equal, or every output within the tolerance
    bit_equal: bool
    max_abs_diff: float
    max_rel_diff: float  # largest |a - b| / max|a| over the outputs
    tolerance_used: float  # largest |a - b| / (1e-6 · (max|a| + typical scale)); equal if <= 1
    original_s: float  # median step time
    rewritten_s: float
    rounds: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def verify_rewrite(
    original: HloModule,
    rewritten: HloModule,
    devices: int,
    rounds: int = 5,
    seed: int = 0,
    platform: str = "cpu",
) -> VerifiedRewrite:
    """Run both modules on the same random inputs on `devices` devices of `platform`."""
    original_s, results = time_candidates(
        original, {"rewritten": rewritten}, devices, rounds, seed, platform=platform
    )
    result = results["rewritten"]
    return VerifiedRewrite(
        **result.outputs.__dict__,
        original_s=original_s,
        rewritten_s=result.seconds,
        rounds=rounds,
    )


@dataclass(frozen=True)
class CandidateResult:
    seconds: float  # median step time
    outputs: OutputComparison  # against the original's


def time_candidates(
    original: HloModule,
    candidates: dict[str, HloModule],
    devices: int,
    rounds: int = 5,
    seed: int = 0,
    original_disabled_passes: Sequence[str] | None = None,
    budget_s: float | None = None,
    platform: str = "cpu",
) -> tuple[float, dict[str, CandidateResult]]:
    """Run the original and each candidate (a rewrite of it) on the same random
    inputs on `devices` devices of `platform`; compare each candidate's outputs
    with the original's, and time all of them in paired rounds whose order
    rotates (the machine is noisy). Candidates compile with XLA's all-reduce
    combiner off (it would merge their buckets again); the original with
    `original_disabled_passes` off (`()`: XLA's own program; None: the
    combiner, as for the candidates). `budget_s` caps the timed rounds' wall
    time (fewer rounds, at least one; compiling and the first runs are not
    counted). Returns the original's median step time and each candidate's result."""
    programs = _compiled_programs(original, candidates, devices, original_disabled_passes, platform)
    arguments = random_arguments(programs[""].parameters, seed)
    inputs = {label: _inputs(program, arguments) for label, program in programs.items()}
    outputs = {
        label: [a for per_device in program.run(inputs[label]) for a in per_device]
        for label, program in programs.items()
    }
    # Step times on arguments already on the devices, without host copies.
    runners = {label: program.device_runner(inputs[label]) for label, program in programs.items()}
    steps, rounds = _agreed_steps_and_rounds(runners, rounds, budget_s)
    times = _rotating_rounds_s(runners, steps, rounds)
    results = {
        label: CandidateResult(
            float(np.median(times[label])), compare_outputs(outputs[""], outputs[label])
        )
        for label in candidates
    }
    return float(np.median(times[""])), results


def _compiled_programs(
    original: HloModule,
    candidates: dict[str, HloModule],
    devices: int,
    original_disabled_passes: Sequence[str] | None,
    platform: str,
) -> dict:
    """The original's program (under the label "") and each candidate's, as
    `time_candidates` compiles them; raises RewriteError if a candidate takes
    other parameters than the original."""
    combiner_off = no_combiner(platform)
    if original_disabled_passes is None:
        original_disabled_passes = combiner_off
    programs = {"": program_for(original, devices, original_disabled_passes, platform)}
    for label, module in candidates.items():
        programs[label] = program_for(module, devices, combiner_off, platform)
    parameters = [str(s) for s in programs[""].parameters]
    for label, program in programs.items():
        if [str(s) for s in program.parameters] != parameters:
            raise RewriteError(f"the {label} module takes different parameters")
    return programs


def _agreed_steps_and_rounds(runners: dict, rounds: int, budget_s: float | None) -> tuple[int, int]:
    """Run each program once (warm-up), time one step of the original (label
    ""), and return `_steps_and_rounds` for it. Over several processes every
    rank must run the same steps and rounds (their collectives pair up), so
    rank 0's counts are used."""
    for run in runners.values():
        run()
    start = time.perf_counter()
    runners[""]()
    step_s = time.perf_counter() - start
    steps, rounds = map(
        int,
        broadcast(
            _next_topic("time_candidates/steps"),
            lambda: "{},{}".format(*_steps_and_rounds(step_s, len(runners), rounds, budget_s)),
        ).split(","),
    )
    return steps, rounds


def _rotating_rounds_s(runners: dict, steps: int, rounds: int) -> dict[str, list[float]]:
    """Each program's mean step time in each of `rounds` rounds of `steps`
    steps; round k starts with the k-th program (mod their number), so no
    program always runs first."""
    labels = list(runners)
    times: dict[str, list[float]] = {label: [] for label in labels}
    for round_index in range(rounds):
        shift = round_index % len(labels)
        for label in labels[shift:] + labels[:shift]:
            start = time.perf_counter()
            for _ in range(steps):
                runners[label]()
            times[label].append((time.perf_counter() - start) / steps)
    return times


def _steps_and_rounds(
    step_s: float, programs: int, rounds: int, budget_s: float | None
) -> tuple[int, int]:
    """(steps a round times each program over, rounds) for a step of `step_s`:
    about ROUND_S a program a round, and no more rounds than fit `budget_s`."""
    steps = max(1, min(MAX_STEPS_PER_ROUND, int(ROUND_S / max(step_s, 1e-9))))
    if budget_s is not None:
        rounds = max(1, min(rounds, int(budget_s / (programs * steps * max(step_s, 1e-9)))))
    return steps, rounds


_topics_used: Counter[str] = Counter()


def _next_topic(name: str) -> str:
    """A topic for `agreement`, new on each call (each is used once per job);
    every rank makes the same calls in the same order, so the names match."""
    _topics_used[name] += 1
    return f"{name}/{_topics_used[name]}"


def _inputs(program, arguments):
    """What `program.run` takes: global arguments for partitions, or the same
    arguments on every replica."""
    if isinstance(program, PartitionedProgram):
        return arguments
    return [arguments] * len(program.devices)
