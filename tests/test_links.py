"""Every relative link and image in README.md and docs/ points at a file or folder that exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def broken(page: Path) -> list[str]:
    found = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # a web address or an anchor on the same page
        path = (page.parent / target.split("#")[0]).resolve()
        if not path.exists():
            found.append(target)
    return found


def test_every_relative_link_and_image_resolves():
    bad = {str(page.relative_to(ROOT)): links for page in pages() if (links := broken(page))}
    assert bad == {}


def test_the_checker_sees_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[ok](page.md) ![gone](missing.png) [web](https://example.com) [here](#top) [part](page.md#x)")
    assert broken(page) == ["missing.png"]
