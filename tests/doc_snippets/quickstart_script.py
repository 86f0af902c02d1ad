"""Set-up for a page that imports the quickstart's module as the user's own: writes
docs/omni/quickstart.md's complete example, as the page printed it, to quickstart.py in the
working directory (the page tells the user to save it under that name)."""

from __future__ import annotations

import re
from pathlib import Path

QUICKSTART = Path(__file__).resolve().parents[2] / "docs" / "omni" / "quickstart.md"


def complete_example() -> str:
    """The first ```python block under the page's "A complete example" heading."""
    text = QUICKSTART.read_text(encoding="utf-8")
    section = text[text.index("\n## A complete example\n"):]
    return re.search(r"^```python\n(.*?)^```", section, re.S | re.M).group(1)


def write_quickstart(cwd: Path) -> Path:
    """quickstart.py in ``cwd``, left as it is if there (a launched rank re-runs the set-up)."""
    path = cwd / "quickstart.py"
    if not path.exists():
        path.write_text(complete_example(), encoding="utf-8")
    return path


if __name__ == "__main__":
    write_quickstart(Path.cwd())
