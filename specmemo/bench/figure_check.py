"""Tables laid out by hand, checked against the files they cite. A measured table on a docs page is one of:

- a rendered figure (`<!-- figure: NAME -->`, specmemo/bench/figures.py): its text is its file's;
- a bench's own report (a `report.md` or `table.md` written beside its results JSON);
- a checked table: `<!-- figure-in: PATH [PATH ...] -->` on the line above it, every number in it found in those
  files (rounded as the table shows it, in the unit it shows: MiB, %, ms, s);
- a dated record: `<!-- record: YYYY-MM-DD, why it has no file -->` above it: measured once, its output not kept,
  not re-run since. A record is history; a claim the project makes today is one of the three above.

`measured_tables` finds the tables that need one (two or more decimal numbers in them), `unchecked` names those
that have none, and `missing_numbers` a checked table's numbers its files lack.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("README.md", "docs")
FIGURE_IN = re.compile(r"<!-- figure-in: (.+?) -->")
RECORD = re.compile(r"<!-- record: \d{4}-\d{2}-\d{2}\b.*-->")
NUMBER = re.compile(r"(?<![\w.\-/])-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w.])|(?<![\w.\-/])-?\d+(?:\.\d+)?(?![\w/])")
DECIMAL = re.compile(r"(?<![\w.–])\d+\.\d+(?![\w.–])")
# a file's number shown in another unit: as is, percent, ms from s, s from ms, MiB from bytes, GB and MB from bytes
SCALES = (1.0, 100.0, 1000.0, 1e-3, 2.0**-20, 2.0**-30, 1e-6, 1e-9)


@dataclass(frozen=True)
class Table:
    page: Path
    line: int  # of its first row, from 1
    text: str
    marker: str  # the line above it ('' when none)


def _pages(root: Path) -> list[Path]:
    found: list[Path] = []
    for name in PAGES:
        path = root / name
        found += sorted(path.rglob("*.md")) if path.is_dir() else [path] if path.exists() else []
    return found


def bench_report(page: Path) -> bool:
    """A report a bench wrote beside its results JSON (compare's report.md, bench front's table.md)."""
    return page.name in ("report.md", "table.md") and any(page.parent.glob("*.json"))


def measured_tables(root: Path = ROOT) -> list[Table]:
    """Every table outside a rendered figure whose cells hold two or more decimal numbers."""
    tables: list[Table] = []
    for page in _pages(root):
        if bench_report(page):
            continue
        lines = page.read_text().splitlines()
        inside, i = False, 0
        while i < len(lines):
            inside = (inside or lines[i].startswith("<!-- figure:")) and not lines[i].startswith("<!-- /figure")
            if not lines[i].startswith("|") or inside:
                i += 1
                continue
            end = i
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            text = "\n".join(lines[i:end])
            above = next((line for line in reversed(lines[:i]) if line.strip()), "")
            if len(DECIMAL.findall(_cells(text))) >= 2:
                tables.append(Table(page, i + 1, text, above.strip()))
            i = end
    return tables


def _cells(text: str) -> str:
    """A table's text without what is not a figure: links' targets, code and the separator row."""
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"`[^`]*`", "", text)
    return "\n".join(line for line in text.splitlines() if not re.fullmatch(r"[|\-: ]+", line))


def numbers(text: str) -> list[str]:
    """The figures a text shows, as written (thousands separators dropped)."""
    return [n.replace(",", "") for n in NUMBER.findall(text)]


def unchecked(root: Path = ROOT) -> list[str]:
    """Measured tables with neither a figure-in nor a record marker above them."""
    return [f"{t.page.relative_to(root)}:{t.line}" for t in measured_tables(root)
            if not (FIGURE_IN.search(t.marker) or RECORD.search(t.marker))]


def _file_numbers(paths: list[Path], page: Path) -> list[float]:
    values: set[float] = set()
    for path in paths:
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in (f for f in files if f.resolve() != page.resolve()):  # a page is not its own source
            values.update(float(n) for n in numbers(file.read_text(errors="replace")))
    return sorted(values)


def _shown(value: float, written: str, scale: float) -> bool:
    digits = len(written.split(".")[1]) if "." in written else 0
    return abs(round(value * scale, digits) - float(written)) < 10.0 ** -(digits + 3)


def missing_numbers(table: Table, root: Path = ROOT) -> list[str]:
    """A checked table's numbers that no file it names holds, in any unit it could show them in. Integers up to
    ten (counts, turn numbers) are not checked."""
    match = FIGURE_IN.search(table.marker)
    if match is None:
        return []
    paths = [(table.page.parent / p).resolve() if p.startswith(".") else root / p for p in match.group(1).split()]
    absent = [str(p) for p in paths if not p.exists()]
    if absent:
        return [f"no such file {p}" for p in absent]
    values = _file_numbers(paths, table.page)
    wanted = [n for n in numbers(_cells(table.text)) if "." in n or abs(float(n)) > 10]
    return [n for n in wanted if not any(_shown(v, n, s) for v in values for s in SCALES)]
