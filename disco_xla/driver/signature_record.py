"""What one argument signature of a wrapped step runs (`SignatureRecord`), and
why (`RecordState`): the record `disco_xla.jit` and `disco_xla.tf_function`
keep per signature, which their trial fills (`trial.Trial`)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class RecordState(enum.Enum):
    """What a signature runs, and why (`SignatureRecord.state`)."""

    CALLED_ONCE = "called once"  # the original; a step is optimised on its second call
    PENDING = "pending"  # the original, while the trial has not decided
    OPTIMIZED = "optimized"  # the rewritten program, checked equal
    ORIGINAL_FASTER = "original faster"  # the original, measured as fast or faster here
    FALLBACK = "fallback"  # the original, because something failed or differed: it warns
    NOT_DATA_PARALLEL = "not data-parallel"  # the original: nothing to optimise


@dataclass
class SignatureRecord:
    """What one argument signature of a step runs (`state`), what the user is
    told of it (`status`), and what its trial found."""

    status: str  # 'optimized ...', 'not data-parallel', or 'original: <reason>'
    state: RecordState = RecordState.PENDING
    run: Callable | None = None  # the rewritten program, when the state is OPTIMIZED
    plan: Any = None
    timing: tuple[float, float] | None = None  # (original, rewritten) median seconds per step
    comparison: Any = None  # the `OutputComparison` of the program timed against the original
    candidates: dict[str, dict] = field(default_factory=dict)  # see WrappedStep.measurements

    def set(self, state: RecordState, status: str) -> None:
        self.state, self.status = state, status

    def fall_back(self, why: str) -> None:
        """Run the original because of `why` (a failure or a difference)."""
        self.run = None
        self.set(RecordState.FALLBACK, "original: " + why)


def fallback_record(why: str, record_type: type = SignatureRecord) -> SignatureRecord:
    """A record that runs the original because of `why`."""
    record = record_type("")
    record.fall_back(why)
    return record
