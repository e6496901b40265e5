"""The README, the CHANGELOG and docs/ link only to files and headings that exist, and cite no
path outside the repository."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_links_resolve(page: Path) -> None:
    for target, anchor in LINK.findall(page.read_text(encoding="utf-8")):
        if target.startswith(("http://", "https://")):
            continue
        dest = (page.parent / target).resolve() if target else page
        assert dest.exists(), f"{page.name} links to {target}, which does not exist"
        assert REPO in dest.parents or dest == REPO, f"{page.name} links outside: {target}"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), f"{page.name}: no heading #{anchor} in {dest.name}"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_no_path_outside_the_repository(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    for outside in ("../shared", "design.md", "/work/", "/tmp/"):
        assert outside not in text, f"{page.name} cites {outside}"
