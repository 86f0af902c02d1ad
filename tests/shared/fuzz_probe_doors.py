"""Doors that misbehave on purpose: the campaign must count each failure where it belongs."""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fuzz"))

from doors import Door, expect  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _nan(_, data) -> None:
    x = data.draw(st.floats(0.0, 1.0))
    expect(math.isfinite(x * math.nan), "a silent NaN")


def _crash(_, data) -> None:
    if data.draw(st.integers(0, 3)) == 3:
        os.abort()


def _hang(_, data) -> None:
    time.sleep(60)


def _slow(_, data) -> None:
    data.draw(st.integers(0, 10**9))  # more inputs than the box holds (4 values would run out)
    time.sleep(0.2)  # each input well within the hang limit; 1,000 of them outlast the box


def _refuse(_, data) -> None:
    n = data.draw(st.integers(-5, 5))
    if n < 0:
        raise ValueError(f"n: expected >= 0, got {n}")
    if n == 0:
        raise ValueError("something went wrong")  # a refusal that names nothing


def DOORS() -> dict[str, Door]:
    return {d.name: d for d in (
        Door("nan", lambda: None, _nan, (ValueError,)),
        Door("crash", lambda: None, _crash, (ValueError,)),
        Door("hang", lambda: None, _hang, (ValueError,)),
        Door("slow", lambda: None, _slow, (ValueError,)),
        Door("refuse", lambda: None, _refuse, (ValueError,), ("n:",)),
    )}
