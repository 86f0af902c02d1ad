"""g1-walk-flat's parameters have one source, C++'s table; runs without the assets package."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from lightning_unilab import _core
from lightning_unilab.envs.tasks.g1_walk import G1Params, G1WalkFlat, frame_skip


def test_the_numpy_twin_takes_its_names_and_defaults_from_the_cpp_table() -> None:
    table = _core.task_defaults("g1-walk-flat")
    # a parameter added on one side only fails here (and in every G1WalkFlat())
    assert {f.name for f in dataclasses.fields(G1Params)} == set(table)
    assert dataclasses.asdict(G1WalkFlat().p) == table
    assert table["ctrl_dt"] == 0.02 and table["w_torques"] == -1e-5  # the table, not zeros
    assert table["timestep"] == 0.002  # 10 substeps of 2 ms per 20 ms control step


@pytest.mark.parametrize("timestep, substeps", [(0.002, 10), (0.005, 4), (0.02 / 3, 3),
                                                (0.0066667, 3), (0.02, 1)])
def test_frame_skip_is_ctrl_dt_over_timestep(timestep: float, substeps: int) -> None:
    assert frame_skip(0.02, timestep) == substeps


@pytest.mark.parametrize("timestep", [0.003, 0.00667, 0.03, 0.0, -0.005, float("nan")])
def test_frame_skip_refuses_a_step_that_does_not_divide_ctrl_dt(timestep: float) -> None:
    with pytest.raises(ValueError, match=r"g1-walk-flat: (ctrl_dt 0.02 / timestep .* must be a "
                                         r"whole number|timestep must be a positive number)"):
        frame_skip(0.02, timestep)


def test_the_cpp_task_reads_every_parameter_through_the_table() -> None:
    """An inline ``p.Get(name, default)`` would be a second source again."""
    source = (Path(__file__).parents[2] / "cpp/src/tasks/g1_walk.cc").read_text()
    read = re.findall(r'Param\(p, "(\w+)"\)', source)
    assert sorted(read) == sorted(_core.task_defaults("g1-walk-flat"))
    assert source.count(".Get(") == 1  # the one in Param()


def test_overrides_keep_the_other_defaults_and_unknown_names_are_refused() -> None:
    table = _core.task_defaults("g1-walk-flat")
    params = dataclasses.asdict(G1WalkFlat(w_alive=2.0, resample_steps=250).p)
    assert params == {**table, "w_alive": 2.0, "resample_steps": 250}
    with pytest.raises(ValueError, match=r"no parameter\(s\) \['w_alvie'\]; it has: .*'w_alive'"):
        G1WalkFlat(w_alvie=1.0)


def test_tasks_without_a_table_and_unknown_tasks() -> None:
    assert _core.task_defaults("HalfCheetah-v5") == {}  # gymnasium's defaults, kept inline
    with pytest.raises(ValueError, match="unknown task 'g1-walk'; known tasks: .*g1-walk-flat"):
        _core.task_defaults("g1-walk")
