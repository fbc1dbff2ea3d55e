"""Rows of the profile dataset for the dataset tests, importable by the writer process they kill."""

from __future__ import annotations

from predictor.data.dataset import ITERATION_COLUMNS


def iteration_row(config_id: str, t: float) -> dict:
    """A valid row of the profile dataset's iterations table, timed `t` seconds."""
    row = {c: 0 for c in ITERATION_COLUMNS}
    row.update(config_id=config_id, family="bert", spec_json="{}", plan="dp=1", schedule="1f1b", design="doptimal",
               status="ok", error="", iter_time_s=t, mem_kind="rss", device="cpu:test", torch_version="x",
               measured_at="2026-01-01T00:00:00+00:00")
    return row
