"""docs/layout.md's map of the package is generated from the tree: each folder with its package docstring, each
module with the first sentence of its own. The test regenerates it and compares, so the map cannot fall behind
the code; `python tests/test_layout.py --write` rewrites it after a module is added, moved or redescribed."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "layout.md"
BEGIN = "<!-- the map below is generated: python tests/test_layout.py --write -->"
END = "<!-- end of the generated map -->"


def first_sentence(path: Path) -> str:
    """The docstring's first sentence, on one line ("" without a docstring)."""
    text = " ".join((ast.get_docstring(ast.parse(path.read_text())) or "").split("\n\n")[0].split())
    match = re.match(r"(.+?[.?!])(\s|$)", text)
    return (match.group(1) if match else text).replace("|", "\\|")


def package_map(root: Path = ROOT / "specmemo") -> str:
    """A section per folder (its __init__'s first sentence), a table row per module."""
    sections = []
    for folder in sorted([root, *(p.parent for p in root.rglob("__init__.py") if p.parent != root)]):
        init = folder / "__init__.py"
        rows = [f"| `{p.name}` | {first_sentence(p)} |" for p in sorted(folder.glob("*.py")) if p.name != "__init__.py"]
        where = folder.relative_to(ROOT).as_posix()
        sections.append("\n".join([f"### `{where}/`", "", first_sentence(init) if init.is_file() else "", "",
                                   "| module | what it holds |", "|---|---|", *rows]))
    return "\n\n".join(sections)


def regenerated(text: str) -> str:
    head, rest = text.split(BEGIN, 1)
    return f"{head}{BEGIN}\n\n{package_map()}\n\n{END}{rest.split(END, 1)[1]}"


def test_every_module_has_a_docstring():
    missing = [str(p.relative_to(ROOT)) for p in (ROOT / "specmemo").rglob("*.py")
               if p.name not in ("__init__.py", "__main__.py") and not first_sentence(p)]
    assert missing == []


def test_the_layout_doc_is_the_tree_as_it_is():
    text = DOC.read_text()
    assert text == regenerated(text), "docs/layout.md is behind the tree: python tests/test_layout.py --write"


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        DOC.write_text(regenerated(DOC.read_text()))
        print(f"wrote {DOC}")
