"""benchmarks/rl_breakdown.py: its timers sum each piece within a cycle and report medians in
ms; the table reads what the JSON holds."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from unilab_models import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bd():
    return load_benchmark("rl_breakdown")


class _Work:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def run(self, scale: float = 1.0) -> float:
        time.sleep(self.seconds * scale)
        return scale


def test_clock_sums_a_piece_within_a_cycle_and_keeps_cycles_apart(bd) -> None:
    clock, work = bd.Clock(), _Work(0.01)
    clock.wrap(work, "run", "work")
    assert work.run(2.0) == 2.0  # the wrapped call returns what the call returns
    work.run()
    clock.close_cycle(cycle=0.5)
    work.run()
    clock.close_cycle(cycle=0.7)
    first, second = clock.cycles
    assert 0.03 <= first["work"] < 0.06 and 0.01 <= second["work"] < 0.03
    assert first["cycle"] == 0.5 and second["cycle"] == 0.7


def test_clock_counts_a_nested_call_of_the_same_piece_once(bd) -> None:
    clock, inner = bd.Clock(), _Work(0.01)

    class Outer:
        def run(self) -> None:
            inner.run()
            inner.run()

    outer = Outer()
    clock.wrap(inner, "run", "logging")
    clock.wrap(outer, "run", "logging")
    outer.run()
    clock.close_cycle()
    assert 0.02 <= clock.cycles[0]["logging"] < 0.035  # not 0.04: the inner calls once


def test_medians_are_in_milliseconds_and_count_a_missing_piece_as_zero(bd) -> None:
    row = bd.medians([{"a": 0.001, "b": 0.004}, {"a": 0.003}, {"a": 0.002, "b": 0.002}])
    assert row == pytest.approx({"a": 2.0, "b": 2.0})  # b: median of 4, 0, 2 ms


def test_table_puts_each_measured_row_in_its_column(bd) -> None:
    ours = {"cycles_ms": {"cycle": 800.0, "forward": 100.0}, "env_steps_per_s": 5000.0}
    result = {"ours": {"sync": ours, "async": {**ours, "env_steps_per_s": 7000.0}},
              "rsl_rl": {"cycles_ms": {"cycle": 600.0, "update": 300.0},
                         "env_steps_per_s": 6000.0},
              "collect_split_ms": {"collect.physics": 90.0}}
    lines = bd.table(result).splitlines()
    assert "| cycle | 800.0 | 800.0 | 600.0 |" in lines
    assert "| collect.physics | 90.0 | 90.0 |  |" in lines
    assert "| update |  |  | 300.0 |" in lines
    assert lines[-1] == "| env steps/s | 5000 | 7000 | 6000 |"
