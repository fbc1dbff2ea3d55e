"""The user's documents point where they say: every relative link of README.md and docs/ names a file or folder of
this repository, and none prints a path of one machine (a home, a checkout, a cache)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# A path that only exists on one machine: a home folder or a checkout's (a command's example output folder under /tmp
# and the documented cache under ~/.cache are any machine's).
MACHINE_PATH = re.compile(r"(?<![\w.~/-])/(?:work|root|home|Users|mnt|scratch)/[\w.-]+")


def _relative_links(doc: Path) -> list[str]:
    return [target for target in LINK.findall(doc.read_text())
            if not re.match(r"[a-z][a-z0-9+.-]*:", target) and not target.startswith("#")]


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_relative_link_names_a_file_of_the_repository(doc: Path) -> None:
    broken = [t for t in _relative_links(doc) if not (doc.parent / t.split("#", 1)[0]).exists()]
    assert not broken, f"{doc.relative_to(ROOT)} links to missing files: {broken}"


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda d: str(d.relative_to(ROOT)))
def test_no_document_prints_a_path_of_one_machine(doc: Path) -> None:
    found = MACHINE_PATH.findall(doc.read_text())
    assert not found, f"{doc.relative_to(ROOT)} names paths of one machine: {sorted(set(found))}"


def test_the_checks_catch_a_broken_link_and_a_machine_path(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("[ok](doc.md) [gone](missing.py#L3) [web](https://pytorch.org) [anchor](#top) "
                   "measured in /work/main/bench and /root/.cache/x")
    assert [t for t in _relative_links(doc) if not (doc.parent / t.split("#", 1)[0]).exists()] == ["missing.py#L3"]
    assert MACHINE_PATH.findall(doc.read_text()) == ["/work/main", "/root/.cache"]
