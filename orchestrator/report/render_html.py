"""report.html: the report's sections (`document.sections`, the same as report.md's) with their inline Markdown
rendered, the plan table sortable and filterable, and the figures. It loads nothing from the network: plotly is
inlined once, the breakdowns are base64 PNGs."""

from __future__ import annotations

import base64
import html
import re

from orchestrator.report import plots
from orchestrator.report.document import Bullets, Code, Section, Table, sections
from orchestrator.report.model import Report
from orchestrator.report.points import cost_axes, point_text

_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*(.+?)\*\*")


def inline(text: str) -> str:
    """Inline Markdown as HTML: `code` and **bold**, everything else escaped."""
    return _BOLD.sub(r"<strong>\1</strong>", _CODE.sub(r"<code>\1</code>", html.escape(text, quote=False)))


def _table(t: Table, table_id: str = "") -> str:
    e = html.escape
    return (f"<table{f' id={table_id!r}' if table_id else ''}><thead><tr>" + "".join(f"<th>{e(h)}</th>" for h in t.header)
            + "</tr></thead><tbody>"
            + "".join("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in row) + "</tr>" for row in t.rows)
            + "</tbody></table>")


# The plan table's behaviour: a click on a column header sorts by it (numbers as numbers, again: the other way), and
# the filter box keeps the rows holding every word typed.
_TABLE_SCRIPT = """<script>
(function () {
  const table = document.getElementById("plans"), body = table.tBodies[0];
  const value = (row, i) => { const t = row.cells[i].textContent.trim(), n = parseFloat(t.replace(/,/g, ""));
                              return isNaN(n) ? t : n; };
  table.tHead.querySelectorAll("th").forEach((th, i) => th.addEventListener("click", () => {
    const up = th.dataset.order !== "up";
    table.tHead.querySelectorAll("th").forEach(h => delete h.dataset.order);
    th.dataset.order = up ? "up" : "down";
    Array.from(body.rows).sort((a, b) => { const x = value(a, i), y = value(b, i);
      return (typeof x === typeof y ? (x > y) - (x < y) : typeof x === "number" ? -1 : 1) * (up ? 1 : -1); })
      .forEach(r => body.appendChild(r));
  }));
  document.getElementById("filter").addEventListener("input", ev => {
    const words = ev.target.value.toLowerCase().split(/ +/).filter(Boolean);
    Array.from(body.rows).forEach(r => { const text = r.textContent.toLowerCase();
                                         r.hidden = !words.every(w => text.includes(w)); });
  });
})();
</script>"""


def _plans_table(t: Table, total: int) -> str:
    return (f"<p>The {len(t.rows)} best of {total} plans that fit; click a column to sort, type to filter (every "
            "word must appear); <code>=</code>: its interval overlaps the winner's.</p>"
            '<input id="filter" type="search" placeholder="filter, e.g. tp=8 64">'
            f'<div class="scroll">{_table(t, "plans")}</div>{_TABLE_SCRIPT}')


def _section(s: Section, report: Report) -> str:
    parts = [f"<h2>{inline(s.title)}</h2>"] if s.title else []
    for block in s.blocks:
        if isinstance(block, Table):
            parts.append(_plans_table(block, report.ranked_total) if block.plans else _table(block))
        elif isinstance(block, Bullets):
            parts.append("<ul>" + "".join(f"<li>{inline(i)}</li>" for i in block.items) + "</ul>")
        elif isinstance(block, Code):
            parts.append(f"<h3>{inline(block.caption)}</h3><pre>{html.escape(block.text)}</pre>")
        else:
            parts.append(f"<p>{inline(block)}</p>")
    return "".join(parts)


def figures(report: Report) -> str:
    """The report's plots as HTML: the interactive time-memory and time-cost plots (plotly's library inlined in the
    first), then the breakdowns of the top plans as PNGs."""
    top, pts, limit = report.shown, report.points, report.device.memory_limit_gib
    best = (top[0].peak_memory_gib, top[0].iter_time_s, f"best: {top[0].plan}") if top else None
    parts = [plots.time_vs_memory(pts.feasible, pts.infeasible, pts.front, limit, best)]
    if top:
        x, y, xlabel, ylabel = cost_axes(report.ranking.goal, report.ranking.price_per_gpu_hour)
        values = {"iter_time_s": lambda r: r.iter_time_s, "gpu_hours_per_iteration": lambda r: r.gpu_hours_per_iteration,
                  "days_to_train": lambda r: r.costs.days_to_train, "cost_usd_to_train": lambda r: r.costs.cost_usd_to_train}
        front = [(values[x](r), values[y](r), f"{r.plan}<br>" + point_text(
            r.costs.nodes, r.costs.gpus, r.iter_time_s, r.costs.days_to_train, r.costs.cost_usd_to_train))
                 for r in report.pareto]
        parts.append(plots.time_vs_cost(pts.by_size, front, xlabel, ylabel))
        labels = [plots.bar_label(r.plan) for r in top]
        pngs = {"time breakdown": plots.time_breakdown(labels, [r.prediction.breakdown for r in top]),
                "memory breakdown": plots.memory_breakdown(labels, [r.prediction.memory_breakdown for r in top], limit)}
        parts += [f'<h2>{name}</h2><img alt="{name}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
                  for name, png in pngs.items()]
    return "".join(parts)


_STYLE = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto}td,th{padding:2px 8px;border-bottom:1px solid #ddd}"
          "#plans th{cursor:pointer;background:#f4f4f4;position:sticky;top:0}#plans th[data-order=up]::after{content:' \\25B2'}"
          "#plans th[data-order=down]::after{content:' \\25BC'}#plans td:nth-child(2){font-family:monospace;font-size:85%;"
          "max-width:26em;overflow-wrap:anywhere}#filter{width:40em;margin:0 0 8px}.scroll{max-height:32em;overflow:auto}"
          "pre{background:#f4f4f4;padding:8px;white-space:pre-wrap}code{background:#f4f4f4;padding:0 2px}")


def render_html(report: Report) -> str:
    body = [f"<h1>ScaleDL plan report: {html.escape(report.spec_path)}</h1>"]
    for s in sections(report, plan_rows=len(report.ranked)):
        body.append(_section(s, report))
        if s.key == ("front" if report.pareto else "why"):
            body.append(figures(report))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>ScaleDL plan report</title><style>{_STYLE}"
            f"</style></head><body>{''.join(body)}</body></html>")
