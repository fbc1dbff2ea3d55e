"""The profile dataset: parquet tables of real measurements, appended atomically.

Layout of a dataset directory (one folder per table, any number of part files each):

    DIR/iterations/part-*.parquet   one row per measured configuration (whole iteration)
    DIR/layers/part-*.parquet       one row per (configuration, layer-graph node)
    DIR/noise/part-*.parquet        repeated measurements of already measured configs (bench/noise.py)

Every append writes one new part file under a temporary name and `os.replace`s it into
place, so a killed writer (even kill -9) leaves either the whole part or nothing, never a
torn file. `compact` merges a table's parts into one file the same way (shipping a few
files instead of thousands). Loading concatenates the parts, checks the schema and keeps
the last row per key, so a part written twice (a crash between compaction steps, a resumed
run) never duplicates data.

Columns (ITERATION_COLUMNS / LAYER_COLUMNS below are the contract; extra columns are kept):
- key: config_id (16 hex chars, `ProfileConfig.config_id`): same model, batch and plan.
- the configuration: family, spec_json (the ModelSpec), batch (global), plan (canonical
  `Plan` string) and its dp/tp/pp/mbs/zero/schedule, layers/hidden/heads/tokens.
- iterations: status (ok | error | timeout | oom), error text, iter_time_s (median of the
  measured steps, max over ranks), iter_time_min_s/iter_time_max_s, steps,
  peak_mem_bytes (max over ranks of the peak resident/allocated memory during the run),
  peak_mem_delta_bytes (peak minus the memory before the model was built), mem_kind
  (rss or cuda), design (doptimal | random | full | noise).
- layers: node, kind, group, count (repeats in the model), in_shape (JSON), fwd_s, bwd_s
  (medians, seconds), fwd_spread/bwd_spread ((max − min)/median of the repeats), repeats.
- provenance on every row: device (fingerprint), torch_version, threads, measured_at (UTC ISO).
"""

from __future__ import annotations

import os
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from predictor.measure.machine import cpu_model_name

TABLES = ("iterations", "layers", "noise")
PROVENANCE = ("device", "torch_version", "threads", "measured_at")
CONFIG_COLUMNS = ("config_id", "family", "spec_json", "batch", "plan", "dp", "tp", "pp", "mbs", "zero", "schedule",
                  "layers", "hidden", "heads", "tokens")
ITERATION_COLUMNS = CONFIG_COLUMNS + ("design", "status", "error", "iter_time_s", "iter_time_min_s", "iter_time_max_s",
                                      "steps", "peak_mem_bytes", "peak_mem_delta_bytes", "mem_kind") + PROVENANCE
LAYER_COLUMNS = ("config_id", "family", "node", "kind", "group", "count", "in_shape", "fwd_s", "bwd_s",
                 "fwd_spread", "bwd_spread", "repeats") + PROVENANCE
REQUIRED = {"iterations": ITERATION_COLUMNS, "layers": LAYER_COLUMNS, "noise": ITERATION_COLUMNS}
KEYS = {"iterations": ["config_id"], "layers": ["config_id", "node"], "noise": ["config_id", "measured_at", "iter_time_s"]}  # repeats can share a second
STATUSES = ("ok", "error", "timeout", "oom")


class DatasetError(ValueError):
    """A dataset directory or row set that does not follow the schema; says which file and column."""


def device_fingerprint(device: str = "cpu") -> str:
    """A short, stable name of the hardware a row was measured on (e.g. 'cpu:Intel Xeon ...:2c', 'cuda:NVIDIA H200')."""
    if device.startswith("cuda"):
        import torch

        return f"cuda:{torch.cuda.get_device_name(torch.device(device))}"
    return f"cpu:{cpu_model_name()}:{os.cpu_count()}c"


def provenance(device: str = "cpu", threads: int = 1) -> dict[str, object]:
    import torch

    return {"device": device_fingerprint(device), "torch_version": torch.__version__, "threads": threads,
            "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def _check(table: str, frame: pd.DataFrame, where: str) -> None:
    if table not in REQUIRED:
        raise DatasetError(f"unknown table {table!r}; tables are {', '.join(TABLES)}")
    missing = [c for c in REQUIRED[table] if c not in frame.columns]
    if missing:
        raise DatasetError(f"{where}: table {table!r} lacks columns {', '.join(missing)}")
    if "status" in frame.columns:
        bad = sorted(set(frame["status"]) - set(STATUSES))
        if bad:
            raise DatasetError(f"{where}: unknown status values {bad}; allowed: {', '.join(STATUSES)}")


def _write_atomic(frame: pd.DataFrame, path: Path) -> None:
    tmp = path.with_name(f".tmp-{uuid.uuid4().hex}-{path.name}")
    try:
        frame.to_parquet(tmp, index=False, compression="zstd")
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def append(root: str | Path, table: str, rows: list[dict] | pd.DataFrame) -> Path | None:
    """Write `rows` as one new part file of `table`, atomically; returns its path (None when no rows)."""
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
    if frame.empty:
        return None
    _check(table, frame, "append")
    folder = Path(root) / table
    folder.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%f")
    path = folder / f"part-{stamp}-{uuid.uuid4().hex[:8]}.parquet"
    _write_atomic(frame, path)
    return path


def parts(root: str | Path, table: str) -> list[Path]:
    """The part files of a table, oldest first (temporary files of killed writers are ignored)."""
    return sorted((Path(root) / table).glob("part-*.parquet"))


def load(root: str | Path, table: str = "iterations") -> pd.DataFrame:
    """All rows of `table`, schema-checked, the last row per key kept (empty frame when none)."""
    if table not in REQUIRED:
        raise DatasetError(f"unknown table {table!r}; tables are {', '.join(TABLES)}")
    files = parts(root, table)
    if not files:
        return pd.DataFrame(columns=list(REQUIRED[table]))
    frames = []
    for path in files:
        try:
            frame = pd.read_parquet(path)
        except Exception as err:  # pyarrow raises several types for corrupt files
            raise DatasetError(f"{path}: not a readable parquet file ({err}); delete it and re-run with --resume") from None
        _check(table, frame, str(path))
        frames.append(frame)
    data = pd.concat(frames, ignore_index=True)
    return data.drop_duplicates(subset=KEYS[table], keep="last").reset_index(drop=True)


def measured_ids(root: str | Path) -> set[str]:
    """Config ids that already have a whole-iteration row (what --resume skips)."""
    return set(load(root, "iterations")["config_id"])


def compact(root: str | Path, table: str) -> Path | None:
    """Merge a table's parts into one deduplicated part; old parts are removed only after it is in place."""
    old = parts(root, table)
    if len(old) <= 1:
        return old[0] if old else None
    merged = load(root, table)
    path = append(root, table, merged)
    for p in old:
        p.unlink(missing_ok=True)
    return path


def snapshot(src: str | Path, dst: str | Path) -> dict[str, int]:
    """Copy every table of `src` into `dst` as one deduplicated part each (what gets shipped/committed).

    Safe while a profiler still appends to `src`: it only reads there. Each table of `dst`
    becomes `part-snapshot.parquet`, replaced atomically; returns the rows per table.
    """
    counts: dict[str, int] = {}
    for table in TABLES:
        data = load(src, table)
        if data.empty:
            continue
        folder = Path(dst) / table
        folder.mkdir(parents=True, exist_ok=True)
        _check(table, data, str(src))
        _write_atomic(data, folder / "part-snapshot.parquet")
        for other in parts(dst, table):
            if other.name != "part-snapshot.parquet":
                other.unlink()
        counts[table] = len(data)
    return counts
