"""The words a user reads are the user's: no tracker numbers and no work jargon.

Where: the docs (`docs/**/*.md`), README.md, the recipes' comments, and the comments and
docstrings of `lightning_omni`, `lightning_unilab` and `lightning_omnilab`. Code (fenced blocks,
inline code spans, link targets) is not prose and is skipped, so a flag such as `--rounds` or a
file name may still be shown.

The rule, word by word:

- issue references, everywhere: "issue 61", "issues 28", "issue #61", a bare "#61";
- "door" / "doors", everywhere: a public function or command is an *entry point*;
- "screens", "screened", "screening" in the docs, README and recipes (an experiment is a run, an
  ablation or a measurement); the planner's closed-form screen keeps its name in the code;
- "round" as a unit of work ("this round", "the round before", "an earlier round"); a benchmark's
  interleaved rounds, a round trip and rounding are fine;
- "row" / "rows" only as jargon for an experiment ("the eighth row", "the done-when row",
  "issue 29's row"); a table's rows and a tensor's rows are fine.
"""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("lightning_omni", "lightning_unilab", "lightning_omnilab")

ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth"
            "|done-when|tracking|fall-penalty")
EVERYWHERE = {
    "issue reference": re.compile(r"\bissues?\s*#?\d+\b|(?<![\w&/#])#\d+\b", re.IGNORECASE),
    "door": re.compile(r"\bdoors?\b", re.IGNORECASE),
    "round as a unit of work": re.compile(
        r"\b(?:this|an? earlier|a later|the previous|the next|earlier|later|previous)"
        r" rounds?\b|\brounds? before\b", re.IGNORECASE),
    "row as jargon": re.compile(rf"\b(?:{ORDINALS}) rows?\b|\bissue\s*\d*'s (?:\w+ )?rows?\b",
                                re.IGNORECASE),
}
PROSE_ONLY = {"screen": re.compile(r"\bscreen(?:s|ed|ing)\b", re.IGNORECASE)}
BANNED = {**EVERYWHERE, **PROSE_ONLY}

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+\1")
LINK_TARGET = re.compile(r"\]\([^)]*\)")
HTML_COMMENT = re.compile(r"<!--.*?-->")


def prose_of_markdown(text: str) -> list[tuple[int, str]]:
    """(line number, prose) of a markdown text: fenced blocks dropped, code spans and link
    targets blanked."""
    out, in_fence = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        line = HTML_COMMENT.sub(" ", LINK_TARGET.sub("]", INLINE_CODE.sub(" ", line)))
        out.append((number, line))
    return out


def prose_of_yaml(text: str) -> list[tuple[int, str]]:
    """The comments of a YAML file (a '#' outside quotes starts one; the recipes quote none)."""
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        if "#" in line:
            out.append((number, INLINE_CODE.sub(" ", line[line.index("#") + 1:])))
    return out


def prose_of_python(text: str) -> list[tuple[int, str]]:
    """Comments and docstrings of a Python source, ``code`` spans blanked."""
    out = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            out.append((token.start[0], INLINE_CODE.sub(" ", token.string)))
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc and node.body:
                start = node.body[0].lineno
                for offset, line in enumerate(doc.splitlines()):
                    out.append((start + offset, INLINE_CODE.sub(" ", line)))
    return out


def hits_in(prose: list[tuple[int, str]], rules: dict[str, re.Pattern] = BANNED
            ) -> list[tuple[int, str, str]]:
    """(line, rule, the words that broke it) for every banned use in the prose."""
    found = []
    for number, line in prose:
        for rule, pattern in rules.items():
            for match in pattern.finditer(line):
                found.append((number, rule, match.group(0)))
    return found


def sources() -> list[tuple[Path, list[tuple[int, str]], dict[str, re.Pattern]]]:
    """(file, its prose, the rules it is held to) for every file the rule covers."""
    files = [(p, prose_of_markdown, BANNED) for p in sorted((ROOT / "docs").rglob("*.md"))]
    files.append((ROOT / "README.md", prose_of_markdown, BANNED))
    files += [(p, prose_of_yaml, BANNED) for p in sorted((ROOT / "recipes").rglob("*.yaml"))]
    for package in PACKAGES:
        files += [(p, prose_of_python, EVERYWHERE) for p in sorted((ROOT / package).rglob("*.py"))]
    return [(path, extract(path.read_text(encoding="utf-8")), rules)
            for path, extract, rules in files]


def test_no_tracker_numbers_or_jargon_in_what_users_read():
    report = [f"{path.relative_to(ROOT)}:{line}: {rule}: {words!r}"
              for path, prose, rules in sources() for line, rule, words in hits_in(prose, rules)]
    assert report == [], "\n".join(report)


def test_the_rules_catch_what_they_should():
    def flagged(line: str) -> set[str]:
        return {rule for _, rule, _ in hits_in([(1, line)])}

    assert flagged("as issue 29 asks") == {"issue reference"}
    assert flagged("fixed in #61.") == {"issue reference"}
    assert flagged("every public door") == {"door"}
    assert flagged("five screens on seed 0") == {"screen"}
    assert flagged("measured this round") == {"round as a unit of work"}
    assert flagged("as the round before showed") == {"round as a unit of work"}
    assert flagged("the eighth row of the work") == {"row as jargon"}
    assert flagged("issue 29's eighth row") == {"issue reference", "row as jargon"}


def test_the_rules_leave_ordinary_words_alone():
    ok = ["a round-trip per call", "round-robin passes", "the rows of the weight matrix",
          "the table's first two columns", "an encoder's padding rows", "colour #fff",
          "best of 3 interleaved rounds", "sums round differently", "a checkpoint round trip",
          "its first   rows and zeros"]
    assert [line for line in ok if hits_in([(1, line)])] == []
    assert prose_of_markdown("see `--rounds 9` and [x](issue-29.md)\n```\nissue 3\n```\n") == [
        (1, "see   and [x]")]
