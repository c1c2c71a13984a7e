"""Every published figure is its results file's (specmemo/bench/figures.py): the README's headline and the docs'
figure tables are rendered from the JSON they cite, with the host, ISA, date and commit; a page that differs fails."""

import json

import pytest

from specmemo.bench import figures


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
