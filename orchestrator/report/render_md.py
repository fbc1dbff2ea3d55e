"""report.md: the report's sections (`document.sections`) as Markdown."""

from __future__ import annotations

from orchestrator.report.document import Bullets, Code, Section, Table, sections
from orchestrator.report.model import Report


def _table(t: Table) -> list[str]:
    return (["| " + " | ".join(t.header) + " |", "|" + "---|" * len(t.header)]
            + ["| " + " | ".join(row) + " |" for row in t.rows])


def _section(s: Section) -> list[str]:
    lines = [f"## {s.title}", ""] if s.title else []
    for block in s.blocks:
        if isinstance(block, Table):
            lines += _table(block)
        elif isinstance(block, Bullets):
            lines += [f"- {item}" for item in block.items]
        elif isinstance(block, Code):
            lines += [block.caption, "", "```", block.text.rstrip("\n"), "```"]
        else:
            lines.append(block)
        lines.append("")
    return lines


def render_md(report: Report) -> str:
    lines = [f"# ScaleDL plan report: {report.spec_path}", ""]
    for s in sections(report):
        lines += _section(s)
    return "\n".join(lines).rstrip("\n") + "\n"
