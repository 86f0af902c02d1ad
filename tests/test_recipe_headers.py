"""Every recipe says what it is in a short header: at most 8 comment lines at the top, naming the
command that runs it (its own path) and a page of docs/ to read more."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").rglob("*.yaml"))
MAX_HEADER_LINES = 8


def leading_comment_block(text: str) -> list[str]:
    """The comment lines before the first line that is not a comment (blank lines end it too)."""
    block = []
    for line in text.splitlines():
        if not line.lstrip().startswith("#"):
            break
        block.append(line)
    return block


def header_problems(text: str, relpath: str) -> list[str]:
    """What is wrong with a recipe's header; empty when it is fine."""
    header = leading_comment_block(text)
    problems = []
    if not header:
        problems.append("no leading comment block")
    if len(header) > MAX_HEADER_LINES:
        problems.append(f"{len(header)} header lines, at most {MAX_HEADER_LINES}")
    joined = "\n".join(header)
    if relpath not in joined:
        problems.append(f"the header does not show the command that runs {relpath}")
    if "docs/" not in joined:
        problems.append("the header names no page under docs/")
    return problems


def test_there_are_recipes():
    assert len(RECIPES) >= 10


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(ROOT)))
def test_recipe_header(path: Path):
    relpath = str(path.relative_to(ROOT))
    assert header_problems(path.read_text(), relpath) == []


def test_a_nine_line_header_is_refused():
    body = "seed_everything: 0\n"
    good = "".join(f"# line {i} of recipes/x.yaml, docs/x.md\n" for i in range(8)) + body
    bad = "# one line too many\n" + good
    assert header_problems(good, "recipes/x.yaml") == []
    assert header_problems(bad, "recipes/x.yaml") == ["9 header lines, at most 8"]


def test_a_header_without_command_or_docs_is_refused():
    problems = header_problems("# trains something\nseed_everything: 0\n", "recipes/x.yaml")
    assert len(problems) == 2
    no_header = header_problems("seed_everything: 0\n", "recipes/x.yaml")
    assert no_header[0] == "no leading comment block"
