"""The history database for real: migrations, WAL readers, all-or-nothing rounds under SIGKILL, sampling."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from orchestrator.revalidation.history import (SCHEMA_VERSION, History, HistoryError, MeasurementRow, connect,
                                               history_path)

SPEC = {"model": {"family": "gpt2", "hidden": 64, "layers": 2, "heads": 2, "seq_len": 32, "vocab": 128},
        "training": {"global_batch": 4}, "cluster": {"device": "cpu", "nodes": 1, "gpus_per_node": 2}}


def _row(pid: int | None, predicted: float, measured: float | None, family: str = "gpt2", device: str = "dev-a",
         status: str = "ok") -> MeasurementRow:
    return MeasurementRow(pid, "dp=2", family, device, "v1", predicted, 0.1, measured, 0.1 if measured else None, status)


def test_history_url_forms(tmp_path: Path) -> None:
    assert history_path("sqlite:///rel/h.db") == Path("rel/h.db")
    assert history_path("sqlite:////abs/h.db") == Path("/abs/h.db")
    assert history_path("plain.db") == Path("plain.db")
    with pytest.raises(HistoryError, match="sqlite:///PATH"):
        history_path("postgres://host/db")
    with pytest.raises(HistoryError, match="does not exist"):
        History(tmp_path / "missing" / "h.db")


def test_upgrades_a_v1_database_keeping_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    conn = connect(path, target=1)
    conn.execute(
        "INSERT INTO predictions (created, spec_json, plan, device, predictor, predicted_time_s, predicted_memory_gib)"
        " VALUES (1.0, ?, 'dp=2', 'cpu', 'analytical', 0.5, 1.5)", (json.dumps(SPEC),))
    conn.execute("INSERT INTO measurements (time, prediction_id, plan, predicted_time_s, measured_time_s, error)"
                 " VALUES (2.0, 1, 'dp=2', 0.5, 0.4, 0.25)")
    conn.close()
    with History(path) as h:
        assert h.conn.execute("SELECT version FROM schema_version").fetchone()[0] == SCHEMA_VERSION == 2
        (p,) = h.predictions()
        assert (p.family, p.uses, p.predicted_time_s, p.spec) == ("gpt2", 1, 0.5, SPEC)
        (m,) = h.measurements()
        assert (m["status"], m["error"], m["round_id"]) == ("ok", 0.25, None)
        assert h.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with pytest.raises(HistoryError, match="newer than this ScaleDL"):
        conn = sqlite3.connect(path)
        conn.execute("UPDATE schema_version SET version = 99")
        conn.commit()
        conn.close()
        History(path)


def test_repeated_predictions_count_uses_and_sampling_mixes_recent_used_random(tmp_path: Path) -> None:
    with History(tmp_path / "h.db") as h:
        ids = [h.record_predictions(SPEC, "cpu", "analytical", "v1", [(f"dp={i}", 0.1 * (i + 1), 1.0)], now=float(i))[0]
               for i in range(9)]
        for _ in range(5):  # the oldest plan is the one users keep asking for
            h.record_predictions(SPEC, "cpu", "analytical", "v1", [("dp=0", 0.1, 1.0)], now=0.5)
        assert h.predictions([ids[0]])[0].uses == 6
        picked = [p.id for p in h.sample(3, random.Random(0))]
        assert len(set(picked)) == 3
        assert picked[0] == ids[8] and picked[1] == ids[0]  # most recent, then most used
        assert [p.id for p in h.sample(2, random.Random(5))] == [ids[8], ids[0]]  # nothing left to chance
        assert sorted(p.id for p in h.sample(100, random.Random(1))) == sorted(ids)
        with pytest.raises(HistoryError, match="positive"):
            h.record_predictions(SPEC, "cpu", "analytical", "v1", [("dp=1", float("nan"), 1.0)])
        with pytest.raises(HistoryError, match="--sample"):
            h.sample(0)


def test_rounds_and_rolling_error_per_device_and_family(tmp_path: Path) -> None:
    with History(tmp_path / "h.db") as h:
        h.record_round([_row(None, 1.1, 1.0), _row(None, 0.8, 1.0), _row(None, 2.0, None, status="oom")], "dev-a", "v1", 0.0)
        h.record_round([_row(None, 1.5, 1.0, family="bert"), _row(None, 1.0, 1.0, device="dev-b")], "dev-a", "v1", 1.0)
        rounds = h.rounds()
        assert [(r["rows"], r["ok"], r["planned"]) for r in rounds] == [(3, 2, 3), (2, 2, 2)]
        assert rounds[0]["mean_abs_error"] == pytest.approx(0.15)
        rolling = h.rolling_error(window=20)
        assert rolling[("dev-a", "gpt2")] == (pytest.approx(0.15), 2)
        assert rolling[("dev-a", "bert")] == (pytest.approx(0.5), 1)
        assert rolling[("dev-b", "gpt2")] == (pytest.approx(0.0), 1)
        assert h.rolling_error(window=1)[("dev-a", "gpt2")][1] == 1


def test_a_reader_never_blocks_the_writer(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    with History(path) as writer:
        writer.record_round([_row(None, 1.0, 1.0)], "dev-a", "v1", 0.0)
        reader = sqlite3.connect(path, timeout=0, isolation_level=None)
        reader.execute("BEGIN")
        assert reader.execute("SELECT COUNT(*) FROM measurements").fetchone()[0] == 1  # holds a read snapshot
        t0 = time.perf_counter()
        writer.record_round([_row(None, 1.0, 1.0)] * 3, "dev-a", "v1", 1.0)
        assert time.perf_counter() - t0 < 1.0
        assert reader.execute("SELECT COUNT(*) FROM measurements").fetchone()[0] == 1  # its snapshot is stable
        reader.execute("COMMIT")
        assert reader.execute("SELECT COUNT(*) FROM measurements").fetchone()[0] == 4
        reader.close()


def test_sigkill_mid_round_leaves_the_database_consistent(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    script = textwrap.dedent(f"""
        import sys, time
        from orchestrator.revalidation.history import History, MeasurementRow
        row = MeasurementRow(None, "dp=2", "gpt2", "dev-a", "v1", 1.0, 0.1, 1.0, 0.1)
        h = History({str(path)!r})
        h.record_round([row] * 4, "dev-a", "v1", 0.0)
        print("committed", flush=True)
        def slow(i):
            print("row", i, flush=True)
            time.sleep(0.2)
        h.record_round([row] * 50, "dev-a", "v1", 1.0, on_row=slow)
        print("finished", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[1])
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line.strip())
        if line.startswith("row 10"):
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL and "committed" in seen and "finished" not in seen
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    with History(path) as h:  # reopening recovers the WAL; the killed round left nothing behind
        assert [(r["planned"], r["rows"]) for r in h.rounds()] == [(4, 4)]
        assert len(h.measurements()) == 4
        h.record_round([_row(None, 1.0, 1.0)], "dev-a", "v1", 2.0)  # and it is writable again
        assert len(h.rounds()) == 2
