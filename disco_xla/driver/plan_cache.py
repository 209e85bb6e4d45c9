"""A plan cache on disk: sqlite, keyed by module fingerprint + profile + options.

Searching takes seconds to minutes; a hit must cost milliseconds, so that a
training script pays for the search once per model and machine. The cache lives
in `~/.cache/disco_xla/plans.sqlite` (or `$XDG_CACHE_HOME/disco_xla`, or a
directory the caller names). Several processes may read and write it at once:
sqlite's own locking serialises the writers, and the write-ahead log lets readers
go on meanwhile. Beside each plan the cache keeps its candidates (the plans
measured against it: the search's next best, the best baseline) with their
simulated times, and, once a first call has timed them on this machine, which
one ran fastest and every candidate's measured time (`CandidateRecord`). It
also keeps the kernel times measured on each machine (`add_kernel_times`, by
structural hash), which the next search there reads before any cost model, and
the step times of the programs each first call measured (`add_step_times`), from
which the next search learns what a collective costs inside a step there, and,
for each traced step whose choice was measured, the key of its plan
(`put_traced_step`), so that a later process knows from the traced step alone,
before anything is captured, that a choice is recorded for it.
Switching a new file to the write-ahead log is the one step that
sqlite does not wait for (it fails at once with "database is locked" when another
process is doing the same), so creating the file is serialised by a lock file
beside it. A cache that cannot be read is never fatal: it only costs a search.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from disco_xla.plan import Plan
from disco_xla.simulator.step_time_fit import StepTime

CACHE_SCHEMA = 4
_BUSY_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class CandidateRecord:
    """The candidates of a cached plan, and what measuring them found.

    `plans` maps each label to its plan ('plan' is the search's best; the
    others are 'candidate-N', the search's N-th best, and 'baseline:NAME');
    `simulated_s` their simulated step times. `chosen` is the label that ran
    fastest and computed the same as the original when measured ('original'
    when none was faster; None: not measured yet), and `measured_s` every
    timed program's median step time, the original's under 'original'.
    `messages` and `tuple_tensors` count each plan's program's collectives
    and the tensors after the first of its tuple all-reduces per step
    (`step_time_fit.message_counts`); `message_s` and `tuple_element_s` are
    what its simulated times charge for each (`ClusterProfile.collective_message_s`,
    `tuple_all_reduce_element_s`)."""

    plans: dict[str, Plan]
    simulated_s: dict[str, float] = field(default_factory=dict)
    chosen: str | None = None
    measured_s: dict[str, float] = field(default_factory=dict)
    messages: dict[str, int] = field(default_factory=dict)
    message_s: float = 0.0
    workers: int = 0  # the devices the module's step runs on (0: not known)
    tuple_tensors: dict[str, int] = field(default_factory=dict)
    tuple_element_s: float = 0.0

    def step_times(self) -> list[StepTime]:
        """The measured programs whose message counts and simulated time are
        known (the plans', and XLA's own as 'original'), each simulated with no
        cost for a collective or a tuple tensor."""
        known = sorted(set(self.measured_s) & set(self.simulated_s) & set(self.messages))
        if "plan" not in self.plans:
            return []

        def program(label: str) -> str:
            if label not in self.plans:
                return label
            return hashlib.sha256(self.plans[label].to_json().encode()).hexdigest()[:16]

        return [
            StepTime(
                module=self.plans["plan"].fingerprint,
                program=program(label),
                messages=self.messages[label],
                simulated_s=self.simulated_s[label]
                - self.message_s * self.messages[label]
                - self.tuple_element_s * self.tuple_tensors.get(label, 0),
                measured_s=self.measured_s[label],
                tuple_tensors=self.tuple_tensors.get(label, 0),
            )
            for label in known
            if label in self.plans or label == "original"
        ]

    def to_json(self) -> str:
        return json.dumps(
            {
                "plans": {label: json.loads(plan.to_json()) for label, plan in self.plans.items()},
                "simulated_s": self.simulated_s,
                "chosen": self.chosen,
                "measured_s": self.measured_s,
                "messages": self.messages,
                "message_s": self.message_s,
                "workers": self.workers,
                "tuple_tensors": self.tuple_tensors,
                "tuple_element_s": self.tuple_element_s,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str, source: str) -> CandidateRecord:
        data = json.loads(text)
        plans = {
            label: Plan.from_json(json.dumps(plan), source) for label, plan in data["plans"].items()
        }
        return cls(
            plans,
            {k: float(v) for k, v in data.get("simulated_s", {}).items()},
            data.get("chosen"),
            {k: float(v) for k, v in data.get("measured_s", {}).items()},
            {k: int(v) for k, v in data.get("messages", {}).items()},
            float(data.get("message_s", 0.0)),
            int(data.get("workers", 0)),
            {k: int(v) for k, v in data.get("tuple_tensors", {}).items()},
            float(data.get("tuple_element_s", 0.0)),
        )


def default_cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "disco_xla"


def cache_key(fingerprint: str, profile: object, options: dict) -> str:
    """The key of a plan: the module it is for, the full profile it was found on
    (its values, not only its name), and every option that changes the search."""
    text = json.dumps(
        {"schema": CACHE_SCHEMA, "module": fingerprint, "profile": repr(profile), **options},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(text.encode()).hexdigest()


def machine_key(profile: object) -> str:
    """The key under which kernel times measured on a machine are kept: its
    full profile (the values, not only the name)."""
    return hashlib.sha256(repr(profile).encode()).hexdigest()


def times_digest(times_s: dict[str, float]) -> str:
    """A short digest of a kernel-time table, for cache keys: a search that
    reads other measured times may find another plan."""
    text = json.dumps(sorted(times_s.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class PlanCache:
    """Plans by key, in one sqlite file shared by all processes on the machine."""

    def __init__(self, directory: str | os.PathLike | None = None):
        self.directory = Path(directory) if directory else default_cache_dir()
        self.path = self.directory / "plans.sqlite"
        self._created = False

    def _create(self) -> None:
        """Make the file a write-ahead-log database with the plans table, once,
        holding an exclusive lock on `plans.lock` so that no two processes do it
        at the same time. The journal mode is stored in the file, so every later
        connection uses it without asking."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / "plans.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            connection = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_S)
            try:
                if connection.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    connection.execute("PRAGMA journal_mode=WAL")
                connection.execute(
                    "CREATE TABLE IF NOT EXISTS plans (key TEXT PRIMARY KEY, plan TEXT NOT NULL, "
                    "module TEXT NOT NULL, created REAL NOT NULL DEFAULT (julianday('now')))"
                )
                connection.execute(
                    "CREATE TABLE IF NOT EXISTS candidates (key TEXT PRIMARY KEY, "
                    "record TEXT NOT NULL)"
                )
                connection.execute(
                    "CREATE TABLE IF NOT EXISTS kernel_times (machine TEXT NOT NULL, "
                    "kernel TEXT NOT NULL, seconds REAL NOT NULL, samples INTEGER NOT NULL, "
                    "PRIMARY KEY (machine, kernel))"
                )
                columns = [row[1] for row in connection.execute("PRAGMA table_info(step_times)")]
                if columns and "tuple_tensors" not in columns:
                    # Kept before a tuple's tensors were counted apart from its
                    # collective: their counts mean something else, so they go.
                    connection.execute("DROP TABLE step_times")
                connection.execute(
                    "CREATE TABLE IF NOT EXISTS step_times (machine TEXT NOT NULL, "
                    "workers INTEGER NOT NULL, module TEXT NOT NULL, program TEXT NOT NULL, "
                    "messages INTEGER NOT NULL, simulated_s REAL NOT NULL, "
                    "measured_s REAL NOT NULL, tuple_tensors INTEGER NOT NULL, "
                    "PRIMARY KEY (machine, workers, module, program))"
                )
                connection.execute(
                    "CREATE TABLE IF NOT EXISTS traced_steps (step TEXT PRIMARY KEY, "
                    "key TEXT NOT NULL)"
                )
                connection.commit()
            finally:
                connection.close()
        self._created = True

    def _connect(self) -> sqlite3.Connection:
        if not self._created:
            self._create()
        return sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_S)

    def get(self, key: str) -> Plan | None:
        """The cached plan, or None if there is none (or the cache is unreadable)."""
        try:
            connection = self._connect()
            try:
                row = connection.execute("SELECT plan FROM plans WHERE key = ?", (key,)).fetchone()
            finally:
                connection.close()
        except (sqlite3.Error, OSError):
            return None
        if row is None:
            return None
        try:
            return Plan.from_json(row[0], source=str(self.path))
        except Exception:  # noqa: BLE001 - a damaged entry is a miss
            return None

    def put(self, key: str, plan: Plan) -> bool:
        """Store `plan`; returns False (and stores nothing) if the cache is unwritable."""
        try:
            connection = self._connect()
            try:
                with connection:
                    connection.execute(
                        "INSERT OR REPLACE INTO plans (key, plan, module) VALUES (?, ?, ?)",
                        (key, plan.to_json(), plan.module_name),
                    )
            finally:
                connection.close()
        except (sqlite3.Error, OSError):
            return False
        return True

    def get_candidates(self, key: str) -> CandidateRecord | None:
        """The candidates stored beside the plan of `key` (None when there are
        none, or the cache is unreadable or the entry damaged)."""
        try:
            connection = self._connect()
            try:
                row = connection.execute(
                    "SELECT record FROM candidates WHERE key = ?", (key,)
                ).fetchone()
            finally:
                connection.close()
            return None if row is None else CandidateRecord.from_json(row[0], str(self.path))
        except Exception:  # noqa: BLE001 - an unreadable cache or a damaged entry is a miss
            return None

    def put_candidates(self, key: str, record: CandidateRecord) -> bool:
        """Store (or replace) the candidates of `key`; False if the cache is unwritable."""
        try:
            connection = self._connect()
            try:
                with connection:
                    connection.execute(
                        "INSERT OR REPLACE INTO candidates (key, record) VALUES (?, ?)",
                        (key, record.to_json()),
                    )
            finally:
                connection.close()
        except (sqlite3.Error, OSError):
            return False
        return True

    def add_kernel_times(self, machine: str, times_s: dict[str, float]) -> bool:
        """Add measured kernel times (structural hash -> seconds) for `machine`
        (`machine_key`): a kernel measured before keeps the mean of all its
        measurements. False (nothing stored) if the cache is unwritable."""
        try:
            connection = self._connect()
            try:
                with connection:
                    connection.executemany(
                        "INSERT INTO kernel_times (machine, kernel, seconds, samples) "
                        "VALUES (?, ?, ?, 1) ON CONFLICT (machine, kernel) DO UPDATE SET "
                        "seconds = (seconds * samples + excluded.seconds) / (samples + 1), "
                        "samples = samples + 1",
                        [(machine, kernel, float(s)) for kernel, s in sorted(times_s.items())],
                    )
            finally:
                connection.close()
        except (sqlite3.Error, OSError):
            return False
        return True

    def kernel_times(self, machine: str) -> dict[str, float]:
        """Every kernel time measured on `machine`, by structural hash ({} when
        none, or the cache is unreadable)."""
        try:
            connection = self._connect()
            try:
                rows = connection.execute(
                    "SELECT kernel, seconds FROM kernel_times WHERE machine = ?", (machine,)
                ).fetchall()
            finally:
                connection.close()
        except (sqlite3.Error, OSError):
            return {}
        return {kernel: float(seconds) for kernel, seconds in rows}

    def add_step_times(self, machine: str, workers: int, times: list[StepTime]) -> bool:
        """Keep the measured step times of one module's programs (`times`, all
        of one module) on `machine`
        (`machine_key`) with `workers` devices, unless that module has some
        there already: the first measured run of each module is what later
        searches learn from, so that a module's own re-measurement does not
        move what was learned (and the plans cached with it). False if nothing
        was stored."""
        if not times:
            return False
        try:
            connection = self._connect()
            try:
                with connection:
                    known = connection.execute(
                        "SELECT 1 FROM step_times WHERE machine = ? AND workers = ? "
                        "AND module = ? LIMIT 1",
                        (machine, workers, times[0].module),
                    ).fetchone()
                    if known:
                        return False
                    connection.executemany(
                        "INSERT OR IGNORE INTO step_times VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        [
                            (
                                machine,
                                workers,
                                t.module,
                                t.program,
                                t.messages,
                                t.simulated_s,
                                t.measured_s,
                                t.tuple_tensors,
                            )
                            for t in times
                        ],
                    )
            finally:
                connection.close()
        except (sqlite3.Error, OSError):
            return False
        return True

    def step_times(self, machine: str, workers: int) -> list[StepTime]:
        """Every step time kept for `machine` with `workers` devices ([] when
        none, or the cache is unreadable)."""
        try:
            connection = self._connect()
            try:
                rows = connection.execute(
                    "SELECT module, program, messages, simulated_s, measured_s, tuple_tensors "
                    "FROM step_times WHERE machine = ? AND workers = ? ORDER BY module, program",
                    (machine, workers),
                ).fetchall()
            finally:
                connection.close()
        except (sqlite3.Error, OSError):
            return []
        return [
            StepTime(m, p, int(n), float(sim), float(meas), int(tensors))
            for m, p, n, sim, meas, tensors in rows
        ]

    def put_traced_step(self, step: str, key: str) -> bool:
        """Record that the traced step `step` (`jax_trial.traced_step_key`) has
        its plan and measured choice under `key`; False if unwritable."""
        try:
            connection = self._connect()
            try:
                with connection:
                    connection.execute(
                        "INSERT OR REPLACE INTO traced_steps (step, key) VALUES (?, ?)",
                        (step, key),
                    )
            finally:
                connection.close()
        except (sqlite3.Error, OSError):
            return False
        return True

    def has_traced_steps(self) -> bool:
        """Whether any traced step is recorded (False on an unreadable cache)."""
        if not self.path.exists():
            return False
        try:
            connection = self._connect()
            try:
                row = connection.execute("SELECT 1 FROM traced_steps LIMIT 1").fetchone()
                return row is not None
            finally:
                connection.close()
        except (sqlite3.Error, OSError):
            return False

    def traced_step_choice(self, step: str) -> str | None:
        """The measured choice recorded for the traced step `step` (a candidate's
        label or 'original'), or None."""
        record = self.traced_step_record(step)
        return record.chosen if record is not None else None

    def traced_step_record(self, step: str) -> CandidateRecord | None:
        """The candidates' record of the traced step `step`, or None."""
        try:
            connection = self._connect()
            try:
                row = connection.execute(
                    "SELECT key FROM traced_steps WHERE step = ?", (step,)
                ).fetchone()
            finally:
                connection.close()
        except (sqlite3.Error, OSError):
            return None
        return self.get_candidates(row[0]) if row is not None else None

    def __len__(self) -> int:
        try:
            connection = self._connect()
            try:
                return connection.execute("SELECT COUNT(*) FROM plans").fetchone()[0]
            finally:
                connection.close()
        except (sqlite3.Error, OSError):
            return 0
