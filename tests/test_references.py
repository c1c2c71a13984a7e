"""Docs and comments name real code: every `module.name` written in docs/ and README.md, and every
module.name in a comment or docstring of our code, where module is one of ours, names something that module
defines (a function, class, constant, field or attribute). Renamed or removed code leaves no stale pointer."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("specmemo/runtime", "specmemo/export", "specmemo", "specmemo/bench", "specmemo/cli", "specmemo/serve",
            "specmemo/device_profiles", "specmemo/runtime/drafters")
REFERENCE = re.compile(r"\b([a-z][a-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)\b")
# file suffixes (decoder.ort, heads.safetensors), and module names that prose also uses for a variable or
# another library's object (a Model called model, an ORT session, vLLM's config, the drafter of a step)
SUFFIXES = {"b", "bin", "data", "example", "gguf", "html", "js", "json", "jsonl", "md", "mjs", "onnx", "ort", "png",
            "py", "safetensors", "toml", "ts", "wasm",
            "txt"}
AMBIGUOUS = {"chat", "config", "drafter", "load", "model", "session", "tokenizer", "vllm"}


@cache
def modules() -> dict[str, list[Path]]:
    """Short module name → its files (a name such as `results` may exist in two packages)."""
    found: dict[str, list[Path]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).glob("*.py"):
            if path.stem != "__init__":
                found.setdefault(path.stem, []).append(path)
    return found


@cache
def defined(path: Path) -> frozenset[str]:
    """Names a module defines at top level, in its classes, and as self attributes."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return frozenset(names)


def stale(text: str) -> set[str]:
    bad = set()
    for module, name in REFERENCE.findall(text):
        paths = modules().get(module)
        if module in AMBIGUOUS or name in SUFFIXES:
            continue
        if paths and not any(name in defined(p) for p in paths):
            bad.add(f"{module}.{name}")
    return bad


def prose_of(path: Path) -> str:
    """A Python file's comments and docstrings."""
    source = path.read_text()
    parts = [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            parts.append(ast.get_docstring(node) or "")
    return "\n".join(parts)


def test_the_checker_sees_a_stale_reference():
    assert stale("see plan.make_plan and arena.window_capacity") == set()
    assert stale("see sizes.window_capacity and plan.no_such_step") == {"sizes.window_capacity", "plan.no_such_step"}


def test_docs_name_only_code_that_exists():
    found = {}
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        backticked = " ".join(re.findall(r"`([^`]+)`", path.read_text()))
        if bad := stale(backticked):
            found[str(path.relative_to(ROOT))] = sorted(bad)
    assert found == {}


def test_comments_and_docstrings_name_only_code_that_exists():
    found = {}
    for package in (*PACKAGES, "tests"):
        for path in sorted((ROOT / package).glob("*.py")):
            if bad := stale(prose_of(path)):
                found[str(path.relative_to(ROOT))] = sorted(bad)
    assert found == {}


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")


def test_every_docs_page_with_sections_opens_with_a_table_of_contents_that_resolves():
    for path in sorted((ROOT / "docs").glob("*.md")):
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        anchors = {slug(h) for h in re.findall(r"^#{2,3} (.+)$", text, re.M)}
        if len(anchors) < 2:
            continue
        first = text.split("\n## ", 1)[0].split("\n### ", 1)[0]  # what comes before the first section
        links = re.findall(r"^\s*- \[[^\]]+\]\(#([^)]+)\)", first, re.M)
        assert links and set(links) <= anchors, (path.name, sorted(set(links) - anchors))


MARKDOWN_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def test_every_relative_link_and_image_in_readme_and_docs_resolves():
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in MARKDOWN_LINK.findall(page.read_text()):
            path = target.split("#", 1)[0]
            if not path or re.match(r"[a-z]+:", path):  # an anchor on the same page, or a URL
                continue
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert broken == []
