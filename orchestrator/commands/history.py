"""`scaledl history`: the prediction error over time, from the revalidation history database."""

from __future__ import annotations

import argparse
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from orchestrator.cli import UsageError

HELP = "print the prediction error over time (table) and plot it (PNG) from a revalidation history"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--history", required=True, metavar="sqlite:///PATH", help="the history database")
    parser.add_argument("--plot", default=None, metavar="PNG",
                        help="where to write the plot (default: beside the database, NAME-error.png)")
    parser.add_argument("--window", type=int, default=20, help="rows in the rolling error (default 20)")
    parser.add_argument("--threshold", type=float, default=None, help="draw the alert threshold on the plot")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from orchestrator.revalidation.history import History, HistoryError, history_path

    try:
        path = history_path(args.history)
        if not path.exists():
            raise FileNotFoundError(f"no history database at {path}; `scaledl revalidate --history ...` creates it")
        history = History(path)
    except HistoryError as err:
        raise UsageError(str(err)) from None
    with history:
        per_round = history.error_by_round()
        rolling = history.rolling_error(args.window)
    console = Console()
    table = Table(title=f"prediction error per revalidation round ({path})")
    for col in ("round", "finished (UTC)", "device", "family", "ok/runs", "mean |error|"):
        table.add_column(col)
    for r in per_round:
        err = "-" if r["mean_abs_error"] is None else f"{100 * r['mean_abs_error']:.1f}%"
        table.add_row(str(r["round_id"]), _utc(r["finished"]), r["device_fingerprint"], r["family"],
                      f"{r['ok']}/{r['rows']}", err)
    console.print(table)
    summary = Table(title=f"rolling mean |error| over the last {args.window} runs")
    for col in ("device", "family", "runs", "mean |error|"):
        summary.add_column(col)
    for (device, family), (err, n) in sorted(rolling.items()):
        summary.add_row(device, family, str(n), f"{100 * err:.1f}%")
    console.print(summary)
    if not per_round:
        console.print("no revalidation rounds yet: nothing to plot")
        return 0
    out = Path(args.plot) if args.plot else path.with_name(f"{path.stem}-error.png")
    _plot(per_round, out, args.threshold)
    console.print(f"plot: {out}")
    return 0


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _plot(per_round: list, out: Path, threshold: float | None) -> None:
    """Mean |error| per round, one line per (device, family); written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[tuple[str, str], list[tuple[datetime, float]]] = {}
    for r in per_round:
        if r["mean_abs_error"] is not None:
            key = (r["device_fingerprint"], r["family"])
            series.setdefault(key, []).append((datetime.fromtimestamp(r["finished"], timezone.utc),
                                               100 * r["mean_abs_error"]))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for (device, family), points in sorted(series.items()):
        ax.plot(*zip(*points), "-o", ms=4, label=f"{family} on {device}")
    if threshold is not None:
        ax.axhline(100 * threshold, color="#d62728", ls="--", lw=1, label=f"alert threshold {100 * threshold:g}%")
    ax.set_xlabel("round finished (UTC)")
    ax.set_ylabel("mean |relative time error| (%)")
    ax.set_title("ScaleDL prediction error over time")
    ax.legend(fontsize=8)
    fig.autofmt_xdate()
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".png")
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
        os.replace(tmp, out)
    finally:
        plt.close(fig)
        Path(tmp).unlink(missing_ok=True)
