"""docs/omni/quickstart.md as a user meets it: its complete example runs as written, and its
options table names every argument of OmniStrategy with its default."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_omni import OmniStrategy

PAGE = Path(__file__).resolve().parents[2] / "docs" / "omni" / "quickstart.md"


def _section(heading: str) -> str:
    text = PAGE.read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_the_complete_example_runs_as_written(tmp_path: Path) -> None:
    blocks = re.findall(r"^```python\n(.*?)^```", _section("A complete example"), re.S | re.M)
    script = tmp_path / "quickstart.py"
    script.write_text(blocks[0])
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE")}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    loss = re.search(r"loss after 30 steps: ([0-9.]+)", done.stdout)
    assert loss, done.stdout[-3000:]
    # the caption is a function of the rows: a model that trained beats the uniform guess
    assert float(loss.group(1)) < 2.0


def _table_rows() -> dict[str, str]:
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \|", _section("Options"), re.M)
    return {name: default.strip() for name, default in rows}


def test_the_options_table_names_every_argument() -> None:
    params = {name: p for name, p in inspect.signature(OmniStrategy.__init__).parameters.items()
              if name != "self" and p.kind is not p.VAR_KEYWORD}
    rows = _table_rows()
    assert list(rows) == list(params), "the table's rows, in the signature's order"
    for name, p in params.items():
        default = p.default
        if isinstance(default, bool | int | float | str):
            shown = rows[name].strip("`").strip('"')
            assert shown == str(default), (name, rows[name], default)


@pytest.mark.parametrize("name", ["timeout", "encoder_cost"])
def test_structured_defaults_are_the_signatures(name: str) -> None:
    default = inspect.signature(OmniStrategy.__init__).parameters[name].default
    shown = _table_rows()[name]
    if name == "timeout":
        assert shown == f"{int(default.total_seconds() // 60)} min"
    else:
        assert shown == f"`{default}`"
