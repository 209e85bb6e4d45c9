"""A plan cache on disk: sqlite, keyed by module fingerprint + profile + options.

Searching takes seconds to minutes; a hit must cost milliseconds, so that a
training script pays for the search once per model and machine. The cache lives
in `~/.cache/disco_xla/plans.sqlite` (or `$XDG_CACHE_HOME/disco_xla`, or a
directory the caller names). Several processes may read and write it at once:
sqlite's own locking serialises the writers, and the write-ahead log lets readers
go on meanwhile. Switching a new file to the write-ahead log is the one step that
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
from pathlib import Path

from disco_xla.plan import Plan

CACHE_SCHEMA = 1
_BUSY_TIMEOUT_S = 30.0


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

    def __len__(self) -> int:
        try:
            connection = self._connect()
            try:
                return connection.execute("SELECT COUNT(*) FROM plans").fetchone()[0]
            finally:
                connection.close()
        except (sqlite3.Error, OSError):
            return 0
