"""The Lightning versions OmniStrategy declares are the ones `make test` runs it on."""

import re
from pathlib import Path

import lightning

ROOT = Path(__file__).resolve().parents[2]


def _declared() -> tuple[str, str]:
    text = (ROOT / "pyproject.toml").read_text()
    low, high = re.search(r'"lightning>=([\d.]+),<([\d.]+)"', text).groups()
    return low, high


def test_make_test_runs_the_oldest_declared_lightning():
    low, _ = _declared()
    oldest = re.search(r"LIGHTNING_OLDEST := ([\d.]+)", (ROOT / "Makefile").read_text()).group(1)
    assert tuple(int(x) for x in oldest.split(".")[:2]) == tuple(
        int(x) for x in low.split(".")[:2]), (oldest, low)


def test_the_running_lightning_is_declared():
    low, high = _declared()
    version = tuple(int(x) for x in re.findall(r"\d+", lightning.__version__)[:2])
    assert tuple(int(x) for x in low.split(".")[:2]) <= version < tuple(
        int(x) for x in high.split(".")[:2]), lightning.__version__
    print("lightning", lightning.__version__)
