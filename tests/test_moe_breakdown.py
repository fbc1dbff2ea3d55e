"""bench.moe_breakdown: each MoE row's iteration parts add up to its prediction, and errors group by a label."""

import pytest

from bench import common, moe_breakdown

PATH = common.SHARED / "ground_truth" / moe_breakdown.FILE


def row(error: float, system: str) -> moe_breakdown.RowParts:
    return moe_breakdown.RowParts({"system": system}, 1.0, 1.0 + error, {}, {})


def test_errors_group_by_label():
    rows = [row(0.1, "a"), row(-0.3, "a"), row(0.2, "b")]
    assert moe_breakdown.grouped(rows, "system") == {"a": (2, pytest.approx(0.2), pytest.approx(-0.1)),
                                                     "b": (1, pytest.approx(0.2), pytest.approx(0.2))}


@pytest.mark.skipif(not PATH.is_file(), reason="needs the shared ground truth")
def test_every_moe_row_is_broken_down():
    rows = moe_breakdown.moe_rows(PATH)
    assert len(rows) == 17
    for r in rows:
        exposed = sum(v for k, v in r.iteration.items() if not k.startswith("hidden "))
        assert exposed == pytest.approx(r.predicted_s)
        assert set(moe_breakdown.KERNEL_GROUPS) <= set(r.stage) and r.stage["experts"] > 0
        assert r.label["placement"] in ("in one node", "in one NVL72 rack", "over nodes (InfiniBand)")
