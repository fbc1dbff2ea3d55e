"""report.html in a real headless browser (Chromium, where installed): it renders its plots offline, logs no
console error, and its plan table sorts and filters."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from orchestrator.report import TrainingGoal, write_report
from tests.gpt3_search import TOKENS, sized_build

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this machine (apt-get install chromium)")

# Collects page errors (script errors and resources that fail to load) from the first moment on.
_TRAP = "<script>window.__errors=[];addEventListener('error',e=>__errors.push(String(e.message||e.target.src||e.target.href)),true);</script>"
# Once loaded: sort by iteration time both ways, filter, count what the plots drew, and write it into the page.
_PROBE = """<script>
addEventListener('load', () => {
  const heads = Array.from(document.querySelectorAll('#plans th')), col = name => heads.findIndex(h => h.textContent === name);
  const shown = i => Array.from(document.querySelectorAll('#plans tbody tr')).filter(r => !r.hidden).map(r => r.cells[i].textContent);
  const out = {};
  heads[col('iter s')].click(); out.up = shown(col('iter s'));
  heads[col('iter s')].click(); out.down = shown(col('iter s'));
  heads[col('$ to train')].click(); out.cost = shown(col('$ to train'));
  const box = document.getElementById('filter'); box.value = 'TP=4, zero=1'; box.dispatchEvent(new Event('input'));
  out.filtered = shown(col('plan')); out.rows = document.querySelectorAll('#plans tbody tr').length;
  out.plots = document.querySelectorAll('.js-plotly-plot .main-svg').length;
  out.points = document.querySelectorAll('.js-plotly-plot .scatterlayer .point').length;
  out.errors = window.__errors;
  const pre = document.createElement('pre'); pre.id = 'probe'; pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
});
</script>"""


def browse(page: Path, *extra: str) -> subprocess.CompletedProcess:
    """Chromium, headless, offline (every host name fails to resolve), on a file."""
    return subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", f"--user-data-dir={page.parent / 'profile'}",
                           "--enable-logging=stderr", "--v=0", "--host-resolver-rules=MAP * ~NOTFOUND",
                           "--virtual-time-budget=15000", "--window-size=1300,2600", *extra, page.as_uri()],
                          capture_output=True, text=True, timeout=180)


def test_the_report_renders_offline_and_its_table_sorts_and_filters(tmp_path) -> None:
    accuracy = {"mape_pct": 9.6, "rows": 109, "source": "vTrain",
                "residual_quantiles": {"coverage": 0.8, "low": -0.07, "high": 0.24, "rows": 109}}
    report = sized_build(accuracy=accuracy, by="cost", goal=TrainingGoal(train_tokens=TOKENS))
    write_report(report, tmp_path)
    page = (tmp_path / "report.html").read_text()
    probed = tmp_path / "probed.html"
    probed.write_text(page.replace("<head>", "<head>" + _TRAP, 1).replace("</body>", _PROBE + "</body>"))
    run = browse(probed, "--dump-dom")
    assert run.returncode == 0, run.stderr[-2000:]
    console = [ln for ln in run.stderr.splitlines() if ":CONSOLE" in ln]
    assert console == [], console  # the report logs nothing, and nothing failed
    out = json.loads(re.search(r'<pre id="probe">(.*?)</pre>', run.stdout, re.S).group(1).replace("&quot;", '"'))
    assert out["errors"] == [] and out["plots"] >= 2 and out["points"] > 100
    up = [float(v) for v in out["up"]]
    assert len(up) == out["rows"] == len(report.ranked) and up == sorted(up) and [float(v) for v in out["down"]] == sorted(up, reverse=True)
    cost = [float(v.replace(",", "")) for v in out["cost"]]
    assert cost == sorted(cost)
    assert 0 < len(out["filtered"]) < out["rows"] and all("tp=4," in p and "zero=1" in p for p in out["filtered"])
    shot = browse(tmp_path / "report.html", f"--screenshot={tmp_path / 'report.png'}")
    assert shot.returncode == 0 and (tmp_path / "report.png").stat().st_size > 50_000
