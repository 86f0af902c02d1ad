"""benchmarks/learning_curves.py: the curve bookkeeping on hand-made episodes, and the JSON
schema of a seconds-long run of APPO and SB3 PPO on InvertedPendulum-v5."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from unilab_models import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lc():
    return load_benchmark("learning_curves")


def test_curve_means_the_latest_episodes_and_times_the_threshold(lc) -> None:
    curve = lc.Curve(threshold=10.0, window=3)
    curve.add(2.0, 1, 100)  # [2]
    curve.add(4.0 + 6.0, 2, 200)  # [2, 4, 6] -> 4
    curve.add(30.0, 1, 300)  # the oldest drops once 3 newer remain: [4, 6, 30] -> 40/3
    curve.add(0.0, 0, 400)  # no episode ended: no point
    curve.add(float("nan"), 1, 500)  # ignored
    assert [p[1:] for p in curve.points] == [[100, 2.0], [200, 4.0], [300, round(40 / 3, 3)]]
    assert curve.time_to_threshold == curve.points[2][0]  # first mean >= 10
    assert curve.episodes == 4
    batch = lc.Curve(threshold=None, window=3)
    batch.add(1.0, 1, 1)
    batch.add(64 * 5.0, 64, 2)  # episodes ending together count together
    assert batch.points[-1][2] == 5.0 and batch.time_to_threshold is None


def test_median_counts_unreached_runs_as_infinite(lc) -> None:
    assert lc._median([3.0, None, 1.0]) == 3.0
    assert lc._median([3.0, None, None]) is None
    assert lc._median([2.0, 4.0]) == 3.0
    runs = [{"algo": "appo", "time_to_threshold_s": 10.0, "final_return": 1.0, "env_steps": 10,
             "wall_s": 1.0},
            {"algo": "sync_ppo", "time_to_threshold_s": 15.0, "final_return": 1.0,
             "env_steps": 10, "wall_s": 1.0}]
    table = lc.summarize(runs)
    assert table["sync_ppo"]["appo_speedup"] == 1.5 and table["appo"]["appo_speedup"] == 1.0


def test_tail_mean_and_worst_of_the_seeds(lc) -> None:
    points = [[1.0, 10, 5.0], [20.0, 20, 7.0], [29.0, 30, 9.0]]
    assert lc._tail_mean(points, 15.0) == 8.0
    assert lc._tail_mean(points, 30.0) is None
    runs = [{"algo": "appo", "time_to_threshold_s": None, "final_return": 1.0, "env_steps": 10,
             "wall_s": 1.0, "max_return": m, "mean_return_last_30s": t, "error": e,
             "lr_at_floor_fraction": f, "first_update_kl": k}
            for m, t, e, f, k in ((1000.0, 990.0, None, 0.0, 0.01),
                                  (400.0, 120.0, "APPO loss is not finite", 0.5, None))]
    row = lc.summarize(runs)["appo"]
    assert (row["min_max_return"], row["min_mean_return_last_30s"], row["errors"]) == \
        (400.0, 120.0, 1)
    assert row["max_lr_at_floor_fraction"] == 0.5 and row["max_first_update_kl"] == 0.01


def test_bad_arguments_are_named(lc, capsys) -> None:
    for argv, word in ((["--algos", "appo,a2c"], "--algos"), (["--budget-s", "0"], "--budget-s"),
                       (["--seeds", "0"], "--seeds"), (["--set", "lr=3"], "--set"),
                       (["--set", "trainer.max_steps=3"], "--set")):
        with pytest.raises(SystemExit):
            lc.main([*argv, "--out", "x.json"])
        assert word in capsys.readouterr().err


def test_seconds_long_run_writes_the_schema(lc, tmp_path: Path) -> None:
    out = tmp_path / "curves.json"
    assert lc.main(["--task", "InvertedPendulum-v5", "--budget-s", "5", "--seeds", "1",
                    "--algos", "appo,sb3_ppo", "--out", str(out), "--no-plot",
                    "--set", "model.desired_kl=0.02"]) == 0
    doc = json.loads(out.read_text())
    assert [(r["algo"], r["seed"]) for r in doc["runs"]] == [("appo", 0), ("sb3_ppo", 0)]
    for run in doc["runs"]:
        assert set(run) >= {"algo", "seed", "curve", "time_to_threshold_s"}
        if run["algo"] == "appo":  # SB3's first 2048-step rollout may not end in 5 s
            assert run["curve"], "pendulum episodes end within seconds"
            assert run["overrides"] == ["model.desired_kl=0.02"] and run["desired_kl"] == 0.02
            assert 0 <= run["first_update_kl"] <= 2 * 0.02  # the trust region's bound
            assert 0.0 <= run["lr_at_floor_fraction"] <= 1.0 and run["error"] is None
        walls = [p[0] for p in run["curve"]]
        steps = [p[1] for p in run["curve"]]
        assert walls == sorted(walls) and steps == sorted(steps)
        assert all(len(p) == 3 and math.isfinite(p[2]) for p in run["curve"])
        assert not walls or (walls[-1] <= run["wall_s"] and run["env_steps"] >= steps[-1])
        ttt = run["time_to_threshold_s"]
        assert ttt is None or ttt in walls
    assert set(doc["summary"]) == {"appo", "sb3_ppo"}
    assert doc["config"]["threshold"] == 950.0


def test_running_mean_over_a_window(lc) -> None:
    assert lc._running_mean([2.0, 4.0, 6.0, 8.0], 2) == [2.0, 3.0, 5.0, 7.0]
    assert lc._running_mean([1.0, 2.0, 3.0], 5) == [1.0, 1.5, 2.0]


def test_plot_run_reads_a_tensorboard_log(lc, tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "log"))
    for step in range(5):
        writer.add_scalar("rollout/episode_length", 10.0 * step, step)
        writer.add_scalar("step_info/reward_tracking_lin_vel", 0.1 * step, step)
    writer.close()
    series = lc.plot_run(str(tmp_path / "log"), tmp_path / "run.png")
    assert list(series) == ["rollout/episode_length", "step_info/reward_tracking_lin_vel"]
    assert [p[1] for p in series["rollout/episode_length"]] == [0.0, 10.0, 20.0, 30.0, 40.0]
    assert (tmp_path / "run.png").stat().st_size > 0
    with pytest.raises(ValueError, match="no scalars"):
        lc.plot_run(str(tmp_path / "log"), tmp_path / "none.png", tags=("x/y",))


def test_a_class_path_task_keeps_the_recipes_init_args(lc) -> None:
    own = {"class_path": "examples.go1_joystick.Go1Joystick", "init_args": {"action_scale": 0.2}}
    recipe = {"data": {"task": own}}
    assert lc._recipe_task("examples.go1_joystick.Go1Joystick", recipe) is own
    assert lc._recipe_task("Ant-v5", recipe) == "Ant-v5"  # another task: as given
    assert lc._recipe_task("Ant-v5", {"data": {"task": "Ant-v5"}}) == "Ant-v5"


def test_recipe_evaluation_settings_are_read(lc) -> None:
    g1 = lc.load_recipe("g1-walk-flat")
    assert g1["evaluation"] == {"max_steps": 1000, "task_params": {"resample_steps": 250}}
    assert "randomization" in g1["data"]  # rsl_rl's env gets it as the data module does


def test_evaluate_runs_the_recipes_episode_on_each_final_policy(lc, tmp_path: Path) -> None:
    out, ev = tmp_path / "curves.json", tmp_path / "eval"
    assert lc.main(["--task", "InvertedPendulum-v5", "--budget-s", "3", "--seeds", "1",
                    "--algos", "sync_ppo,rsl_rl_ppo", "--out", str(out), "--no-plot",
                    "--evaluate", str(ev), "--evaluate-episodes", "2"]) == 0
    runs = json.loads(out.read_text())["runs"]
    max_steps = lc.load_recipe("InvertedPendulum-v5")["evaluation"].get("max_steps")
    for run in runs:
        record = run["evaluation"]
        episode = json.loads((ev / f"{run['algo']}_seed0" / "episode.json").read_text())
        assert record["return"] == episode["return"] and record["length"] == episode["length"]
        assert 1 <= episode["length"] <= (max_steps or 1000)
        assert record["return"] == pytest.approx(sum(episode["rewards"]))
        # the start seeds from the recipe's: the first is the single episode's
        seeds = json.loads((ev / f"{run['algo']}_seed0" / "episodes.json").read_text())
        assert [r["seed"] for r in seeds["rows"]] == [0, 1] and record["seeds"]["episodes"] == 2
        assert seeds["rows"][0]["return"] == pytest.approx(episode["return"])
    with pytest.raises(SystemExit):
        lc.main(["--task", "InvertedPendulum-v5", "--algos", "sb3_ppo", "--evaluate", str(ev),
                 "--out", str(out)])


def test_rsl_rl_rollout_length_is_set_apart_from_the_recipe(lc, tmp_path: Path) -> None:
    out = tmp_path / "curves.json"
    recipe_horizon = lc.load_recipe("InvertedPendulum-v5")["data"]["horizon"]
    assert recipe_horizon != 8
    assert lc.main(["--task", "InvertedPendulum-v5", "--budget-s", "1.5", "--seeds", "1",
                    "--algos", "rsl_rl_ppo", "--out", str(out), "--no-plot",
                    "--set", "rsl_rl.num_steps_per_env=8"]) == 0
    run = json.loads(out.read_text())["runs"][0]
    assert run["horizon"] == 8  # recorded from the config rsl_rl's runner was given
    with pytest.raises(RuntimeError, match="num_steps_per_env or a key"):  # from its worker
        lc.main(["--task", "InvertedPendulum-v5", "--budget-s", "1", "--seeds", "1",
                 "--algos", "rsl_rl_ppo", "--out", str(out), "--no-plot",
                 "--set", "rsl_rl.horizon=8"])
