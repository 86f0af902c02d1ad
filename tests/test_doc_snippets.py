"""The Python examples users copy from README.md, docs/getting-started.md and docs/guides/ run
as written, each in a fresh interpreter in an empty directory.

A block that needs what its page says the user already has (their module, a checkpoint an
earlier step wrote) names a set-up script on the line right before its fence,
``<!-- snippet-setup: tests/doc_snippets/NAME.py -->``, which runs first in the same directory
and writes those files. A block that cannot run on one CPU machine says why instead,
``<!-- snippet: not run: REASON -->``; a few at most. Neither comment renders on the site or
on GitHub."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = (ROOT / "README.md", ROOT / "docs" / "getting-started.md",
         *sorted((ROOT / "docs" / "guides").glob("*.md")))
SETUPS = ROOT / "tests" / "doc_snippets"
MAX_NOT_RUN = 2
TIMEOUT_S = 300

FENCE = re.compile(r"^```python\s*$")
ANY_PYTHON_FENCE = re.compile(r"^\s*[`~]{3,}\s*\{?\.?py(thon)?\b", re.I)
SETUP = re.compile(r"^<!-- snippet-setup: (\S+) -->$")
NOT_RUN = re.compile(r"^<!-- snippet: not run: (.*?) ?-->$")


@dataclass(frozen=True)
class Snippet:
    """One ```python block: where it is, its code, and what its marker line asks."""

    page: str
    line: int  # the fence's line, 1-based
    code: str
    setup: Path | None = None
    not_run: str | None = None

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def python_blocks(page: str, text: str) -> list[Snippet]:
    """Every ```python block of ``text``, with the marker on the line before its fence; a line
    there that starts like a marker but is neither form is an error, not a silent skip."""
    lines = text.splitlines()
    found = []
    i = 0
    while i < len(lines):
        if not FENCE.match(lines[i]):
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            raise ValueError(f"{page}:{i + 1}: a ```python block without its closing fence")
        before = lines[i - 1].strip() if i else ""
        setup = SETUP.match(before)
        not_run = NOT_RUN.match(before)
        if before.startswith("<!-- snippet") and not (setup or not_run):
            raise ValueError(f"{page}:{i}: expected '<!-- snippet-setup: PATH -->' or "
                             f"'<!-- snippet: not run: REASON -->', got {before!r}")
        found.append(Snippet(page, i + 1, "\n".join(lines[i + 1:end]) + "\n",
                             setup=ROOT / setup.group(1) if setup else None,
                             not_run=not_run.group(1) if not_run else None))
        i = end + 1
    return found


def _scan() -> tuple[list[Snippet], list[str]]:
    snippets, scanned = [], []
    for path in PAGES:
        page = path.relative_to(ROOT).as_posix()
        snippets += python_blocks(page, path.read_text(encoding="utf-8"))
        scanned.append(page)
    return snippets, scanned


SNIPPETS, SCANNED = _scan()


def test_every_page_is_scanned_and_the_set_is_not_empty() -> None:
    assert len(PAGES) >= 3 and (ROOT / "docs" / "guides" / "pretrained.md") in PAGES
    assert SCANNED == [p.relative_to(ROOT).as_posix() for p in PAGES]
    assert SNIPPETS, "no ```python block found in any page"
    for path in PAGES:  # every python fence, however written, was taken as a block
        page = path.relative_to(ROOT).as_posix()
        fences = [n + 1 for n, line in enumerate(path.read_text(encoding="utf-8").splitlines())
                  if ANY_PYTHON_FENCE.match(line)]
        assert fences == [s.line for s in SNIPPETS if s.page == page], page


def test_markers_name_what_exists_and_few_blocks_are_skipped() -> None:
    not_run = [s for s in SNIPPETS if s.not_run is not None]
    for s in not_run:
        assert s.not_run.strip(), f"{s.id}: a block not run must say why"
    assert len(not_run) <= MAX_NOT_RUN, [s.id for s in not_run]
    for s in SNIPPETS:
        if s.setup is not None:
            assert s.setup.parent == SETUPS and s.setup.is_file(), (s.id, s.setup)


def test_markers_are_read_and_a_malformed_one_is_refused() -> None:
    page = ("<!-- snippet-setup: tests/doc_snippets/omni_checkpoint.py -->\n```python\na = 1\n```\n"
            "<!-- snippet: not run: needs 4 GPUs -->\n```python\nb = 2\n```\n"
            "```bash\nls\n```\n```python\nc = 3\n```\n")
    first, second, third = python_blocks("page.md", page)
    assert (first.line, first.code, first.setup) == (2, "a = 1\n", SETUPS / "omni_checkpoint.py")
    assert (second.line, second.not_run, second.setup) == (6, "needs 4 GPUs", None)
    assert (third.line, third.setup, third.not_run) == (12, None, None)
    with pytest.raises(ValueError, match="page.md:1: expected"):
        python_blocks("page.md", "<!-- snippet: skip -->\n```python\npass\n```\n")


def _run(script: Path, cwd: Path, what: str) -> None:
    """Runs ``script`` in a process group of its own, ended with it: a rank Lightning launched
    from a script that failed or timed out would otherwise wait out its collective's timeout."""
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE")}
    proc = subprocess.Popen([sys.executable, str(script)], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{what} ran past {TIMEOUT_S} s\n--- stdout\n{out[-3000:]}\n--- stderr\n"
                    f"{err[-3000:]}")
    finally:
        with contextlib.suppress(ProcessLookupError):  # none left: the usual case
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, (f"{what} exited {proc.returncode}\n--- stdout\n{out[-3000:]}"
                                  f"\n--- stderr\n{err[-3000:]}")


@pytest.mark.parametrize("snippet", [
    pytest.param(s, id=s.id,
                 marks=[] if s.not_run is None else [pytest.mark.skip(reason=s.not_run)])
    for s in SNIPPETS])
def test_the_block_runs_as_written(snippet: Snippet, tmp_path: Path) -> None:
    if snippet.setup is not None:
        _run(snippet.setup, tmp_path, f"set-up {snippet.setup.name} of {snippet.id}")
    script = tmp_path / "snippet.py"
    script.write_text(snippet.code, encoding="utf-8")
    _run(script, tmp_path, snippet.id)
