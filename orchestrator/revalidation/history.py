"""The prediction history: a versioned SQLite database of predictions and their re-measurements.

Why SQLite: one file a cron job, a long-lived `ray job` and a user's `scaledl history` can
share without a server. WAL mode lets readers see the last committed state while a
revalidation round writes, and every round is written in one transaction, so a process
killed mid-write (even by SIGKILL) leaves either the whole round or none of it.

The schema is versioned (`schema_version`) and upgraded in place by `MIGRATIONS` on open;
a new column or table is a new migration, never an edit of an old one.
"""

from __future__ import annotations

import json
import math
import random
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

# Migration i (1-based) upgrades a database from version i-1 to version i.
MIGRATIONS: tuple[str, ...] = (
    # v1: predictions that were handed to users, and measurements of them.
    """
    CREATE TABLE predictions (
        id INTEGER PRIMARY KEY,
        created REAL NOT NULL,
        spec_json TEXT NOT NULL,
        plan TEXT NOT NULL,
        device TEXT NOT NULL,
        predictor TEXT NOT NULL,
        predicted_time_s REAL NOT NULL,
        predicted_memory_gib REAL NOT NULL
    );
    CREATE TABLE measurements (
        id INTEGER PRIMARY KEY,
        time REAL NOT NULL,
        prediction_id INTEGER REFERENCES predictions(id),
        plan TEXT NOT NULL,
        predicted_time_s REAL NOT NULL,
        measured_time_s REAL,
        error REAL
    );
    """,
    # v2: model family, device fingerprint, predictor version, memory and status per row;
    # usage counts (to sample the most-used predictions); rounds grouping one revalidation run.
    """
    ALTER TABLE predictions ADD COLUMN family TEXT NOT NULL DEFAULT '';
    ALTER TABLE predictions ADD COLUMN predictor_version TEXT NOT NULL DEFAULT '';
    ALTER TABLE predictions ADD COLUMN uses INTEGER NOT NULL DEFAULT 1;
    ALTER TABLE predictions ADD COLUMN last_used REAL;
    UPDATE predictions SET last_used = created;
    UPDATE predictions SET family = COALESCE(json_extract(spec_json, '$.model.family'), '');
    CREATE UNIQUE INDEX predictions_key ON predictions(spec_json, plan, device, predictor, predictor_version);
    CREATE TABLE rounds (
        id INTEGER PRIMARY KEY,
        started REAL NOT NULL,
        finished REAL NOT NULL,
        device_fingerprint TEXT NOT NULL,
        predictor_version TEXT NOT NULL,
        planned INTEGER NOT NULL
    );
    ALTER TABLE measurements ADD COLUMN round_id INTEGER REFERENCES rounds(id);
    ALTER TABLE measurements ADD COLUMN family TEXT NOT NULL DEFAULT '';
    ALTER TABLE measurements ADD COLUMN device_fingerprint TEXT NOT NULL DEFAULT '';
    ALTER TABLE measurements ADD COLUMN predictor_version TEXT NOT NULL DEFAULT '';
    ALTER TABLE measurements ADD COLUMN predicted_memory_gib REAL;
    ALTER TABLE measurements ADD COLUMN measured_memory_gib REAL;
    ALTER TABLE measurements ADD COLUMN status TEXT NOT NULL DEFAULT 'ok';
    ALTER TABLE measurements ADD COLUMN detail TEXT NOT NULL DEFAULT '';
    CREATE INDEX measurements_by_time ON measurements(device_fingerprint, family, time);
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


class HistoryError(ValueError):
    """A history location or database that cannot be used; the message says why and what to do."""


def history_path(url: str) -> Path:
    """`sqlite:///PATH` (or a plain path) → the database file path."""
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        # sqlite:////abs/path keeps its leading slash; sqlite:///rel/path is relative, as in SQLAlchemy.
        return Path(path)
    if "://" in url:
        raise HistoryError(f"--history must be sqlite:///PATH (or a file path), got {url!r}")
    return Path(url)


@dataclass(frozen=True)
class StoredPrediction:
    """A prediction given to a user, as stored: what to re-measure and what was promised."""

    id: int
    spec: dict[str, Any]
    plan: str
    device: str
    family: str
    predictor: str
    predictor_version: str
    predicted_time_s: float
    predicted_memory_gib: float
    uses: int


@dataclass(frozen=True)
class MeasurementRow:
    """One re-measurement of a stored prediction; `measured_*` are None when the run failed (`status`)."""

    prediction_id: int | None
    plan: str
    family: str
    device_fingerprint: str
    predictor_version: str
    predicted_time_s: float
    predicted_memory_gib: float | None
    measured_time_s: float | None
    measured_memory_gib: float | None
    status: str = "ok"  # ok | oom | error | timeout
    detail: str = ""

    @property
    def error(self) -> float | None:
        """Signed relative error of the predicted time: (predicted - measured) / measured."""
        if self.measured_time_s is None or self.measured_time_s <= 0:
            return None
        return (self.predicted_time_s - self.measured_time_s) / self.measured_time_s


def migrate(conn: sqlite3.Connection, target: int = SCHEMA_VERSION) -> int:
    """Bring the schema to `target`, one migration per transaction; returns the version reached."""
    if not 0 <= target <= SCHEMA_VERSION:
        raise HistoryError(f"schema version {target} does not exist; this ScaleDL knows 0..{SCHEMA_VERSION}")
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    row = conn.execute("SELECT version FROM schema_version").fetchone()
    version = row[0] if row else 0
    if version > SCHEMA_VERSION:
        raise HistoryError(f"history database has schema v{version}, newer than this ScaleDL (v{SCHEMA_VERSION}); upgrade ScaleDL")
    while version < target:
        # One transaction per migration: a crash mid-upgrade leaves the previous version intact.
        try:
            conn.executescript(
                "BEGIN IMMEDIATE;" + MIGRATIONS[version] + "DELETE FROM schema_version;"
                f"INSERT INTO schema_version (version) VALUES ({version + 1}); COMMIT;"
            )
        except sqlite3.Error as err:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise HistoryError(f"cannot upgrade the history database from v{version} to v{version + 1}: {err}") from err
        version += 1
    return version


def connect(path: str | Path, target: int = SCHEMA_VERSION) -> sqlite3.Connection:
    """Open (creating if needed) a history database in WAL mode, migrated to `target`."""
    path = Path(path)
    if not path.parent.exists():
        raise HistoryError(f"directory {path.parent} of the history database does not exist; create it first")
    conn = sqlite3.connect(path, timeout=30.0, isolation_level=None)  # autocommit: transactions are explicit
    conn.row_factory = sqlite3.Row
    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if mode.lower() != "wal":
        raise HistoryError(f"{path}: cannot switch the database to WAL mode (got {mode}); is it on a network filesystem?")
    conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a crash loses at most the last commit, never consistency
    conn.execute("PRAGMA foreign_keys=ON")
    migrate(conn, target)
    return conn


class History:
    """Read and write the history database at `path` (see the module docstring)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.conn = connect(self.path)

    @classmethod
    def open(cls, url: str) -> "History":
        return cls(history_path(url))

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "History":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """All-or-nothing: BEGIN IMMEDIATE takes the write lock up front so two writers never deadlock."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    # --- predictions -------------------------------------------------------------------------

    def record_predictions(
        self,
        spec: dict[str, Any],
        device: str,
        predictor: str,
        predictor_version: str,
        items: Iterable[tuple[str, float, float]],
        now: float | None = None,
    ) -> list[int]:
        """Store (plan, predicted time s, predicted memory GiB) answers; a repeat bumps `uses`. Returns ids."""
        now = time.time() if now is None else now
        spec_json = json.dumps(spec, sort_keys=True)
        family = str(spec.get("model", {}).get("family") or "")
        ids = []
        with self.transaction() as c:
            for plan, t, mem in items:
                _check_positive("predicted time", t)
                c.execute(
                    """INSERT INTO predictions (created, spec_json, plan, device, predictor, predictor_version,
                           family, predicted_time_s, predicted_memory_gib, uses, last_used)
                       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?)
                       ON CONFLICT (spec_json, plan, device, predictor, predictor_version) DO UPDATE SET
                           uses = uses + 1, last_used = excluded.last_used,
                           predicted_time_s = excluded.predicted_time_s,
                           predicted_memory_gib = excluded.predicted_memory_gib""",
                    (now, spec_json, plan, device, predictor, predictor_version, family, t, mem, now),
                )
                ids.append(c.execute(
                    "SELECT id FROM predictions WHERE spec_json=? AND plan=? AND device=? AND predictor=? AND predictor_version=?",
                    (spec_json, plan, device, predictor, predictor_version),
                ).fetchone()[0])
        return ids

    def predictions(self, ids: Sequence[int] | None = None) -> list[StoredPrediction]:
        if ids is None:
            rows = self.conn.execute("SELECT * FROM predictions ORDER BY id").fetchall()
        else:
            marks = ",".join("?" * len(ids))
            by_id = {r["id"]: r for r in self.conn.execute(f"SELECT * FROM predictions WHERE id IN ({marks})", list(ids))}
            rows = [by_id[i] for i in ids if i in by_id]
        return [_stored(r) for r in rows]

    def sample(self, n: int, rng: random.Random | None = None, device: str | None = None) -> list[StoredPrediction]:
        """Up to `n` distinct predictions (of `device` when given): about a third most recent, a third most
        used, the rest at random.

        Recent ones catch a new predictor's mistakes, most-used ones are what users rely on, and
        random ones keep the long tail honest.
        """
        if n < 1:
            raise HistoryError(f"--sample must be at least 1, got {n}")
        rng = rng or random.Random()
        def ids(order: str) -> list[int]:
            where, args = ("WHERE device = ?", (device,)) if device is not None else ("", ())
            return [pid for (pid,) in self.conn.execute(f"SELECT id FROM predictions {where} ORDER BY {order}", args)]

        chosen: list[int] = []

        def take(candidates: list[int], k: int) -> None:
            for pid in candidates:
                if k <= 0:
                    return
                if pid not in chosen:
                    chosen.append(pid)
                    k -= 1

        recent = -(-n // 3)  # a third, rounded up: n=1 takes the newest, n=2 one newest and one most used
        take(ids("last_used DESC, id DESC"), recent)
        take(ids("uses DESC, last_used DESC, id DESC"), (n - recent + 1) // 2)
        rest = [pid for pid in ids("id") if pid not in chosen]
        rng.shuffle(rest)
        take(rest, n - len(chosen))
        return self.predictions(chosen[:n])

    # --- measurements ------------------------------------------------------------------------

    def record_round(
        self,
        rows: Sequence[MeasurementRow],
        device_fingerprint: str,
        predictor_version: str,
        started: float,
        finished: float | None = None,
        on_row: Any = None,
    ) -> int:
        """Write one revalidation round and all its rows in one transaction; returns the round id.

        `on_row(i)` is called after each row is written (inside the transaction); tests use it to
        kill the process mid-round.
        """
        finished = time.time() if finished is None else finished
        with self.transaction() as c:
            round_id = c.execute(
                "INSERT INTO rounds (started, finished, device_fingerprint, predictor_version, planned) VALUES (?, ?, ?, ?, ?)",
                (started, finished, device_fingerprint, predictor_version, len(rows)),
            ).lastrowid
            for i, r in enumerate(rows):
                c.execute(
                    """INSERT INTO measurements (time, round_id, prediction_id, plan, family, device_fingerprint,
                           predictor_version, predicted_time_s, measured_time_s, error, predicted_memory_gib,
                           measured_memory_gib, status, detail)
                       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                    (finished, round_id, r.prediction_id, r.plan, r.family, r.device_fingerprint, r.predictor_version,
                     r.predicted_time_s, r.measured_time_s, r.error, r.predicted_memory_gib, r.measured_memory_gib,
                     r.status, r.detail[-2000:]),
                )
                if on_row is not None:
                    on_row(i)
        assert round_id is not None
        return round_id

    def rounds(self) -> list[sqlite3.Row]:
        return self.conn.execute(
            """SELECT r.id, r.started, r.finished, r.device_fingerprint, r.predictor_version, r.planned,
                      COUNT(m.id) AS rows, SUM(m.status = 'ok') AS ok,
                      AVG(ABS(m.error)) AS mean_abs_error, MAX(ABS(m.error)) AS max_abs_error
               FROM rounds r LEFT JOIN measurements m ON m.round_id = r.id
               GROUP BY r.id ORDER BY r.id"""
        ).fetchall()

    def error_by_round(self) -> list[sqlite3.Row]:
        """Per round and (device fingerprint, family): when, how many rows ran, mean |relative time error|."""
        return self.conn.execute(
            """SELECT r.id AS round_id, r.finished, m.device_fingerprint, m.family, COUNT(m.id) AS rows,
                      SUM(m.status = 'ok') AS ok, AVG(ABS(m.error)) AS mean_abs_error
               FROM rounds r JOIN measurements m ON m.round_id = r.id
               GROUP BY r.id, m.device_fingerprint, m.family ORDER BY r.id, m.device_fingerprint, m.family"""
        ).fetchall()

    def measurements(self, round_id: int | None = None) -> list[sqlite3.Row]:
        if round_id is None:
            return self.conn.execute("SELECT * FROM measurements ORDER BY id").fetchall()
        return self.conn.execute("SELECT * FROM measurements WHERE round_id = ? ORDER BY id", (round_id,)).fetchall()

    def rolling_error(self, window: int = 20) -> dict[tuple[str, str], tuple[float, int]]:
        """Mean |relative time error| over the last `window` successful rows per (device fingerprint, family).

        Returns {(device, family): (mean_abs_error, rows used)}.
        """
        out: dict[tuple[str, str], tuple[float, int]] = {}
        keys = self.conn.execute(
            "SELECT DISTINCT device_fingerprint, family FROM measurements WHERE status = 'ok' AND error IS NOT NULL"
        ).fetchall()
        for device, family in keys:
            errors = [abs(e) for (e,) in self.conn.execute(
                """SELECT error FROM measurements WHERE device_fingerprint = ? AND family = ? AND status = 'ok'
                   AND error IS NOT NULL ORDER BY time DESC, id DESC LIMIT ?""",
                (device, family, window),
            )]
            out[(device, family)] = (math.fsum(errors) / len(errors), len(errors))
        return out


def _check_positive(what: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise HistoryError(f"{what} must be a positive finite number, got {value!r}")


def _stored(r: sqlite3.Row) -> StoredPrediction:
    return StoredPrediction(
        id=r["id"], spec=json.loads(r["spec_json"]), plan=r["plan"], device=r["device"], family=r["family"],
        predictor=r["predictor"], predictor_version=r["predictor_version"], predicted_time_s=r["predicted_time_s"],
        predicted_memory_gib=r["predicted_memory_gib"], uses=r["uses"],
    )
