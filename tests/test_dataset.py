"""Profile dataset: schema checks, dedupe on load, and appends that survive kill -9."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pandas as pd
import pytest

from predictor.data import dataset
from predictor.data.dataset import DatasetError
from tests.dataset_rows import iteration_row


def test_append_load_dedupes_by_config_id(tmp_path):
    dataset.append(tmp_path, "iterations", [iteration_row("a", 1.0), iteration_row("b", 2.0)])
    dataset.append(tmp_path, "iterations", [iteration_row("a", 3.0)])
    data = dataset.load(tmp_path)
    assert sorted(data["config_id"]) == ["a", "b"]
    assert data.set_index("config_id").loc["a", "iter_time_s"] == 3.0  # last write wins
    dataset.compact(tmp_path, "iterations")
    assert len(dataset.parts(tmp_path, "iterations")) == 1
    assert len(dataset.load(tmp_path)) == 2


def test_schema_errors_name_the_problem(tmp_path):
    with pytest.raises(DatasetError, match="lacks columns .*iter_time_s"):
        dataset.append(tmp_path, "iterations", [{"config_id": "a"}])
    bad = iteration_row("a", 1.0) | {"status": "weird"}
    with pytest.raises(DatasetError, match="unknown status"):
        dataset.append(tmp_path, "iterations", [bad])
    with pytest.raises(DatasetError, match="unknown table"):
        dataset.load(tmp_path, "nope")
    (tmp_path / "iterations").mkdir(exist_ok=True)
    (tmp_path / "iterations" / "part-0-torn.parquet").write_bytes(b"PAR1 torn")
    with pytest.raises(DatasetError, match="not a readable parquet"):
        dataset.load(tmp_path)


def test_kill_9_during_appends_never_leaves_a_torn_part(tmp_path):
    writer = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.getcwd()!r})
        from predictor.data import dataset
        from tests.dataset_rows import iteration_row
        rows = [iteration_row(f"id{{i}}", float(i)) for i in range(20000)]  # big parts: the kill lands mid-write
        print("ready", flush=True)
        i = 0
        while True:
            dataset.append({str(tmp_path)!r}, "iterations", [dict(r, config_id=f"{{i}}-{{r['config_id']}}") for r in rows])
            i += 1
    """)
    proc = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 120
    while not dataset.parts(tmp_path, "iterations") and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # well inside the next part's write (each takes longer than this)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    files = dataset.parts(tmp_path, "iterations")
    assert files, "the writer should have finished at least one part before the kill"
    for path in files:
        assert len(pd.read_parquet(path)) == 20000
    assert len(dataset.load(tmp_path)) == 20000 * len(files)
