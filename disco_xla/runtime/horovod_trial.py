"""The Horovod step that keeps whichever candidate runs fastest
(`MeasuredHorovodStep`), measured in paired rounds on the first calls, and the
candidates it chooses from for a plan (`horovod_candidates`): Horovod's own
fusion, its legacy setting's buckets, and the plan's buckets, grouped and
packed. The step itself is `horovod.HorovodStep`."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from disco_xla.runtime.horovod import FUSION_SETTINGS, Candidate, HorovodStep, fusion_buckets

# A candidate whose first timed round is over this multiple of the fastest's is
# not timed again (packing a large model's gradients in XLA took 29x the
# gradients' own compute on TF ResNet-50 here).
_DROP_SLOWER_THAN = 2.0
# A candidate wins the trial only when it is faster in all timed rounds but at
# most one (`rounds_to_win`) and its median is this fraction below the
# reference's; it then runs only if it is faster in every confirmation round too.
# A single job's step times vary by over 10% here (TF ResNet-50, 2 ranks: 300 to
# 338 ms for one setting in two jobs), and one round can be an outlier: the
# tiny BERT encoder's packed plan had a median 46% below Horovod's own and lost
# one round of 5. A candidate no faster than the reference passes the trial with
# chance 6/32 and then all 3 confirmation rounds with chance 1/8: 2.3% in all,
# below the 1/32 of winning 5 rounds of 5 alone. A wrong pick costs more than a
# missed gain.
_MIN_GAIN = 0.02


def rounds_to_win(rounds: int) -> int:
    """The timed rounds of `rounds` a candidate must be faster in to win the
    trial: all but one, or all of them where there are fewer than 3."""
    return rounds if rounds < 3 else rounds - 1


class MeasuredHorovodStep:
    """A Horovod training step that runs the fastest of its `candidates`,
    measured on the first calls: `loss = step(inputs, labels)`.

    `candidates` maps a name to a `Candidate`; the first is the reference (Horovod's
    own fusion, as the job was started) and always takes part. Every call is one
    real SGD step; the candidates compute the same step:
    - call 1 computes the gradients once and averages them every candidate's
      way; a candidate whose average differs from the reference's (beyond
      `rtol` of the largest value) or raises is dropped. The step applies the
      reference's average;
    - the next calls run each candidate once untimed (to build it: the
      candidates share the reference's compiled gradients, and only a packed
      one compiles a compute part of its own), then
      `rounds` rounds of one timed call each, the order rotating by one each
      round. After the first round a candidate over `_DROP_SLOWER_THAN` times the
      fastest is dropped;
    - then the ranks average their per-round times (`hvd.allreduce`), so every
      rank reaches the same verdict: the fastest of the candidates that beat
      the reference in all rounds but at most one (`rounds_to_win`) by a median
      at least `_MIN_GAIN` below its own; else the reference. The other
      candidates' steps are then released;
    - a winner other than the reference is confirmed in `confirm_rounds` more
      rounds of the two alone, paired (each round one call of each, the order
      alternating): it runs from then on only if it is faster in every one of
      them, by the times the ranks agreed on; else the reference runs. These
      rounds are a second sample of the same comparison, so a winner that the
      trial's noise made is caught (4 of 18 jobs here, 3 of them winners of
      5 rounds of 5).

    Each candidate's collectives are named under its name (`HorovodStep`), so
    Horovod's response cache never confuses two candidates' tensors.

    `measurements()` gives each candidate's time, the confirmation and the
    choice. Call `hvd.init()` first; the variables are broadcast from rank 0.
    """

    def __init__(
        self,
        loss_fn: Callable[[Any, Any], Any],
        variables: Sequence[Any],
        candidates: Mapping[str, Candidate],
        learning_rate: float = 0.01,
        rounds: int = 5,
        rtol: float = 1e-5,
        confirm_rounds: int = 3,
    ):
        import horovod.tensorflow as hvd

        if not candidates:
            raise ValueError("at least one candidate is needed")
        self._hvd = hvd
        self.names = list(candidates)
        self.steps: dict[str, HorovodStep] = {}
        for name, candidate in candidates.items():
            reference = self.steps.get(self.names[0])
            self.steps[name] = HorovodStep(
                loss_fn,
                variables,
                candidate.buckets,
                learning_rate,
                packed=candidate.packed,
                broadcast=reference is None,
                name=name,
                gradients=reference.gradients if reference else None,
            )
        self.rounds, self.rtol, self.confirm_rounds = rounds, rtol, confirm_rounds
        self.dropped: dict[str, str] = {}
        self.times_s: dict[str, list[float]] = {name: [] for name in self.names}
        self.confirm_s: dict[str, list[float]] = {}  # the confirmation's times, by name
        self.confirmation: dict = {}  # what the confirmation measured and decided
        self._winner: str | None = None  # the trial's winner, while it is confirmed
        self.chosen: str | None = None
        self.agreed_s: dict[str, float] = {}  # the medians the ranks agreed on
        self.faster_rounds: dict[str, int] = {}  # rounds each beat the reference in
        self._queue: list[tuple[str, bool]] = []  # (candidate, timed) for the next calls
        self._round = -1
        self._calls = 0

    def __call__(self, inputs, labels):
        self._calls += 1
        if self._calls == 1:
            return self._checked_step(inputs, labels)
        if self.chosen is not None:
            return self.steps[self.chosen](inputs, labels)
        if not self._queue:
            self._next_round()
            if self.chosen is not None:
                return self.steps[self.chosen](inputs, labels)
        name, timed = self._queue.pop(0)
        start = time.perf_counter()
        loss = self.steps[name](inputs, labels)
        loss.numpy()
        if timed:
            times = self.confirm_s if self._winner is not None else self.times_s
            times.setdefault(name, []).append(time.perf_counter() - start)
        return loss

    def _live(self) -> list[str]:
        return [name for name in self.names if name not in self.dropped]

    def _checked_step(self, inputs, labels):
        """Call 1: every candidate's average of the same gradients against the
        reference's; the step applies the reference's."""
        reference = self.steps[self.names[0]]
        loss, gradients = reference.gradients(inputs, labels)
        expected = [np.asarray(r) for r in reference.reduce_gradients(gradients)]
        scale = max(float(np.max(np.abs(e))) for e in expected) or 1.0
        differs = []
        for name in self.names[1:]:
            try:
                reduced = self.steps[name].reduce_gradients(gradients)
                equal = all(
                    np.allclose(np.asarray(r), e, rtol=0.0, atol=self.rtol * scale)
                    for r, e in zip(reduced, expected, strict=True)
                )
            except Exception as error:  # noqa: BLE001 - any failure drops the candidate
                equal = False
                self.dropped[name] = f"raised {type(error).__name__}: {error}"[:200]
            differs.append(0.0 if equal else 1.0)
        if differs:
            agreed = self._agree(differs, self._hvd.Max, "disco_check")
            for name, flag in zip(self.names[1:], np.asarray(agreed), strict=True):
                if flag > 0 and name not in self.dropped:
                    self.dropped[name] = "its average differs from Horovod's own"
        reference.apply(expected)
        self._queue = [(name, False) for name in self._live()]
        return loss

    def _next_round(self) -> None:
        """Queue the next timed round, or reach the verdict."""
        if self._winner is not None:
            self._confirm()
            return
        if self._round == 0:
            self._drop_slow()
        self._round += 1
        live = self._live()
        if len(live) == 1:  # every rank dropped the same ones: nothing to time
            self.chosen = live[0]
            self.steps = {self.chosen: self.steps[self.chosen]}
            return
        if self._round >= self.rounds:
            self._choose()
            return
        shift = self._round % len(live)
        self._queue = [(name, True) for name in live[shift:] + live[:shift]]

    def _agreed_times(self) -> dict[str, list[float]]:
        """Each live candidate's time in every timed round so far, averaged over
        the ranks (a candidate's rounds are the same calls on every rank)."""
        live = [name for name in self._live() if self.times_s[name]]
        rounds = min(len(self.times_s[name]) for name in live)
        times = np.array([self.times_s[name][:rounds] for name in live])
        averaged = self._agree(times, self._hvd.Average, f"disco_times_{self._round}")
        return {name: [float(t) for t in row] for name, row in zip(live, averaged, strict=True)}

    def _agreed_medians(self) -> dict[str, float]:
        return {name: statistics.median(t) for name, t in self._agreed_times().items()}

    def _agree(self, values, op, name: str) -> np.ndarray:
        """`values` reduced over the ranks with `op`: the same array on every rank."""
        import tensorflow as tf

        reduced = self._hvd.allreduce(tf.constant(np.asarray(values, np.float64)), op=op, name=name)
        return np.asarray(reduced)

    def _drop_slow(self) -> None:
        medians = self._agreed_medians()
        fastest = min(medians.values())
        for name, seconds in medians.items():
            if name != self.names[0] and seconds > _DROP_SLOWER_THAN * fastest:
                self.dropped[name] = f"{seconds / fastest:.1f}x the fastest in the first round"

    def _choose(self) -> None:
        """The verdict, from the times every rank agreed on: a candidate
        replaces the reference only when it was faster in every timed round and
        its median is at least `_MIN_GAIN` below the reference's; the fastest
        such one runs."""
        times = self._agreed_times()
        medians = {name: statistics.median(t) for name, t in times.items()}
        self.agreed_s = medians
        reference = self.names[0]
        self.faster_rounds = {
            name: sum(t < r for t, r in zip(times[name], times[reference], strict=True))
            for name in times
            if name != reference
        }
        needed = rounds_to_win(len(times[reference]))
        clearly_faster = [
            name
            for name, faster in self.faster_rounds.items()
            if faster >= needed and medians[name] <= (1.0 - _MIN_GAIN) * medians[reference]
        ]
        winner = min(clearly_faster, key=medians.__getitem__, default=reference)
        if winner == reference or self.confirm_rounds < 1:
            self._run(winner)
            return
        self._winner = winner
        self.steps = {name: self.steps[name] for name in (winner, reference)}
        pairs = [(winner, reference), (reference, winner)]
        self._queue = [
            (name, True) for index in range(self.confirm_rounds) for name in pairs[index % 2]
        ]

    def _confirm(self) -> None:
        """The confirmation's verdict (the class docstring), from the times the
        ranks agreed on."""
        winner, reference = self._winner, self.names[0]
        rounds = min(len(self.confirm_s[winner]), len(self.confirm_s[reference]))
        times = [self.confirm_s[name][:rounds] for name in (winner, reference)]
        agreed = self._agree(times, self._hvd.Average, "disco_confirm")
        winner_s, reference_s = (float(statistics.median(row)) for row in agreed)
        faster = sum(bool(w < r) for w, r in zip(agreed[0], agreed[1], strict=True))
        kept = faster == rounds
        self.confirmation = {
            "candidate": winner,
            "rounds": rounds,
            "faster_rounds": faster,
            "candidate_s": winner_s,
            "reference_s": reference_s,
            "confirmed": kept,
        }
        self._winner = None
        self._run(winner if kept else reference)

    def _run(self, name: str) -> None:
        """Run `name` from now on, release the other steps, and say so."""
        self.chosen = name
        self.steps = {name: self.steps[name]}
        if self._hvd.rank() == 0:
            medians = self.agreed_s
            times_ms = ", ".join(f"{n} {t * 1e3:.2f} ms" for n, t in medians.items())
            dropped = "".join(f"; {n} dropped: {why}" for n, why in self.dropped.items())
            confirmed = ""
            if self.confirmation:
                c = self.confirmation
                confirmed = (
                    f"; confirmation: {c['candidate']} {c['candidate_s'] * 1e3:.2f} ms against "
                    f"{c['reference_s'] * 1e3:.2f} ms over {c['rounds']} rounds"
                )
            verdict = f"disco-xla: Horovod step runs {name} ({times_ms}{dropped}{confirmed})"
            print(verdict, file=sys.stderr)

    def measurements(self) -> dict:
        """Each candidate's median time over the ranks (seconds), why any was
        dropped, which one runs (None while the trial goes on), and the calls
        so far (each one SGD step)."""
        return {
            "chosen": self.chosen,
            "measured_s": dict(self.agreed_s),
            "faster_rounds": dict(self.faster_rounds),
            "confirmation": dict(self.confirmation),
            "dropped": dict(self.dropped),
            "rounds": self.rounds,
            "calls": self._calls,
        }


def horovod_candidates(
    plan_buckets: Sequence[Sequence[int]], variables: Sequence[Any]
) -> dict[str, Candidate]:
    """What `MeasuredHorovodStep` chooses from for a plan: Horovod's own fusion
    (the reference), the buckets its legacy setting (64 MB) makes of gradients
    that arrive together, sent grouped (the `horovod-legacy` baseline's buckets
    in this runtime; its 5 ms cycle is not reproduced), and the plan's buckets,
    grouped and packed. A bucketing equal to one listed before it is left out."""
    sizes = [int(v.shape.num_elements()) * v.dtype.size for v in variables]
    legacy = fusion_buckets(sizes, FUSION_SETTINGS["legacy"].threshold_bytes)
    plan = tuple(tuple(b) for b in plan_buckets)
    listed = {
        "horovod": Candidate(),
        "horovod-legacy": Candidate(tuple(tuple(b) for b in legacy)),
        "plan": Candidate(plan),
        "plan-packed": Candidate(plan, packed=True),
    }
    candidates: dict[str, Candidate] = {}
    for name, candidate in listed.items():
        if candidate not in candidates.values():
            candidates[name] = candidate
    return candidates
