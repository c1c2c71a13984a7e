"""Every published figure is its results file's (specmemo/bench/figures.py): the README's headline and the docs'
figure tables are rendered from the JSON they cite, with the host, ISA, date and commit; a page that differs fails."""

import json

import pytest

from specmemo.bench import figure_check, figures


@pytest.mark.parametrize("page", sorted({f.page for f in figures.FIGURES}))
def test_every_published_figure_is_its_results_file(page):
    assert figures.write_page(page, write=False) == [], f"{page} differs from its results: run `make figures`"


def test_a_figure_names_its_host_and_a_changed_number_shows(tmp_path):
    figure = figures.FIGURES[0]
    data = json.loads((figures.ROOT / figure.source).read_text())
    text = figures.rendered(figure)
    assert data["machine"]["isa"] in text and data["machine"]["commit"] in text and "ONNX Runtime" in text
    (tmp_path / "results.json").write_text(json.dumps({**data, "engines": {
        **data["engines"], "llama.cpp": {**data["engines"]["llama.cpp"], "load_s": 0.5}}}))
    (tmp_path / "page.md").write_text(f"<!-- figure: {figure.name} -->\n{text}<!-- /figure -->\n")
    moved = figures.Figure("page.md", figure.name, "results.json", figure.render)
    original, figures.FIGURES = figures.FIGURES, (moved,)
    try:
        assert figures.write_page("page.md", tmp_path, write=False) == [figure.name]
        assert figures.write_page("page.md", tmp_path, write=True) == [figure.name]
        assert "**0.5**" in (tmp_path / "page.md").read_text()
    finally:
        figures.FIGURES = original


def test_every_measured_table_is_rendered_checked_or_a_dated_record():
    assert figure_check.unchecked() == [], (
        "a measured table needs `<!-- figure-in: FILE -->` (its numbers in FILE) or `<!-- record: DATE, ... -->` "
        "above it (specmemo/bench/figure_check.py)")


CHECKED = [t for t in figure_check.measured_tables() if figure_check.FIGURE_IN.search(t.marker)]


@pytest.mark.parametrize("table", CHECKED, ids=lambda t: f"{t.page.name}:{t.line}")
def test_a_checked_table_shows_only_its_files_numbers(table):
    assert figure_check.missing_numbers(table) == [], f"{table.page}:{table.line} shows numbers its files lack"


def test_a_checked_table_fails_on_a_number_its_file_lacks(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"tok_s": 12.345, "peak_rss": 300 * 2**20, "share": 0.5172}))
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    good = "| run | tok/s | MiB | share |\n|---|---|---|---|\n| a | 12.3 | 300 | 51.7% |\n"
    page.write_text(f"<!-- figure-in: run.json -->\n{good}")
    [table] = figure_check.measured_tables(tmp_path)
    assert figure_check.missing_numbers(table, tmp_path) == []
    page.write_text(f"<!-- figure-in: run.json -->\n{good.replace('12.3', '12.9')}")
    [table] = figure_check.measured_tables(tmp_path)
    assert figure_check.missing_numbers(table, tmp_path) == ["12.9"]
    page.write_text(good)
    assert figure_check.unchecked(tmp_path) == ["docs/page.md:1"]
    page.write_text(f"<!-- record: 2026-11-25, its output was not kept -->\n{good}")
    assert figure_check.unchecked(tmp_path) == []
