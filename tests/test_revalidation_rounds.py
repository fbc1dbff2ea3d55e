"""Revalidation for real: stored predictions re-measured on a 2-node Ray cluster, rounds in SQLite, drift alerts.

The predictions come from the real analytical predictor; the "deliberately wrong" one is the
same predictor on this CPU with its FLOP/s and memory bandwidth scaled by 10x, so it promises
iterations ~10x faster than they are.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.revalidation.history import History
from orchestrator.revalidation.rounds import RoundReport, drift_alerts, parse_every, print_round
from predictor.plan import Plan
from tests.stored_predictions import PLANS, store


def test_durations() -> None:
    assert parse_every("6h") == 21600 and parse_every("30m") == 1800 and parse_every("90") == 90
    with pytest.raises(ValueError, match="--every"):
        parse_every("soon")


def test_bad_arguments_are_clean_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["revalidate", "--history", "postgres://x/y", "--once"]) == 2
    assert main(["revalidate", "--history", f"sqlite:///{tmp_path}/h.db", "--sample", "0"]) == 2
    assert main(["history", "--history", f"sqlite:///{tmp_path}/none.db"]) == 2
    err = capsys.readouterr().err
    assert "sqlite:///PATH" in err and "--sample must be at least 1" in err and "no history database" in err


@pytest.mark.slow
def test_rounds_history_and_the_drift_alert(two_nodes, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    url = f"sqlite:///{tmp_path}/history.db"
    with History.open(url) as h:
        store(h, "gpt2", 1.0, "analytical-honest")
    args = ["revalidate", "--history", url, "--once", "--sample", "1", "--steps", "2", "--warmup", "1",
            "--threshold", "0.5", "--dataset", str(tmp_path / "profile")]
    codes = [main(args), main(args)]

    with History.open(url) as h:
        rounds = h.rounds()
        assert [(r["planned"], r["rows"], r["ok"]) for r in rounds] == [(1, 1, 1), (1, 1, 1)]
        rows = h.measurements()
        assert [r["plan"] for r in rows] == [str(Plan.parse(PLANS[-1]))] * 2  # the most recent prediction first
        assert all(r["measured_time_s"] > 0 and r["device_fingerprint"].startswith("cpu:") for r in rows)
        (honest_error, n), = [v for (dev, fam), v in h.rolling_error().items() if fam == "gpt2"]
        assert n == 2
        assert codes == [1 if e > 0.5 else 0 for e in _rolling_after_each_round(rows)]
        for _ in range(2):  # asked twice: the bert predictions are both the most recent and the most used
            store(h, "bert", 10.0, "analytical-10x-wrong")
    capsys.readouterr()

    assert main(args[:4] + ["--sample", "2"] + args[6:]) == 1  # the two recent bert predictions
    out, err = capsys.readouterr()
    assert "DRIFT ALERT: bert on cpu:" in err
    with History.open(url) as h:
        rolling = {fam: e for (dev, fam), (e, n) in h.rolling_error().items()}
        assert rolling["bert"] > 0.5 and rolling["bert"] > rolling["gpt2"]
        assert h.rounds()[-1]["rows"] == 2 and {r["family"] for r in h.measurements(h.rounds()[-1]["id"])} == {"bert"}

    png = tmp_path / "error.png"
    assert main(["history", "--history", url, "--plot", str(png), "--threshold", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "bert" in out and "gpt2" in out and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from predictor.data import dataset

    assert len(dataset.load(tmp_path / "profile")) == 3  # gpt2 (re-measured twice: deduped by config) + 2 bert


def _rolling_after_each_round(rows: list) -> list[float]:
    """Mean |error| of all gpt2 rows up to the end of each round (window 20 holds them all)."""
    out = []
    for round_id in sorted({r["round_id"] for r in rows}):
        errors = [abs(r["error"]) for r in rows if r["round_id"] <= round_id]
        out.append(sum(errors) / len(errors))
    return out


@pytest.mark.slow
def test_every_keeps_running_rounds_while_readers_watch(two_nodes, tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    url = f"sqlite:///{tmp_path}/history.db"
    with History.open(url) as h:
        store(h, "gpt2", 1.0, "analytical-honest")
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "revalidate", "--history", url, "--every", "1s",
                             "--sample", "1", "--steps", "1", "--warmup", "1", "--address", two_nodes.address],
                            cwd=Path(__file__).resolve().parents[1], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        with History.open(url) as reader:  # a reader open the whole time never blocks the job
            while len(reader.rounds()) < 2 and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(1)
            assert proc.poll() is None, "the --every job exited"
            assert len(reader.rounds()) >= 2
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)


def test_the_drift_alert_names_this_devices_families_over_the_threshold(capsys: pytest.CaptureFixture) -> None:
    """What the slow end-to-end test checks after real rounds, on a rolling-error table: only this cluster's device,
    only above the threshold, on stderr with the remedy, and a round that raises one has drifted (exit status 1)."""
    rolling = {("cpu:a", "bert"): (0.9, 2), ("cpu:a", "gpt2"): (0.1, 2), ("cuda:h100", "bert"): (0.8, 5)}
    alerts = drift_alerts(rolling, "cpu:a", threshold=0.5)
    assert [(a.device, a.family, a.rows) for a in alerts] == [("cpu:a", "bert", 2)]
    report = RoundReport(1, [], rolling, alerts)
    assert report.drifted and not RoundReport(1, [], rolling, drift_alerts(rolling, "cpu:a", 0.95)).drifted
    print_round(report, threshold=0.5)
    err = capsys.readouterr().err
    assert "DRIFT ALERT: bert on cpu:a: rolling mean |error| 90.0% over 2 runs passes the 50% threshold" in err
    assert "--retrain" in err and "gpt2" not in err
