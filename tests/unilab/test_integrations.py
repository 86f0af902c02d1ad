"""SB3 and rsl_rl train on the adapters: short real runs of each library's PPO."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_unilab.integrations import RslRlVecEnv, SB3VecEnv


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_sb3_ppo_trains() -> None:
    from stable_baselines3 import PPO

    env = SB3VecEnv("InvertedPendulum-v5", 8, num_threads=1)
    model = PPO("MlpPolicy", env, n_steps=64, batch_size=128, n_epochs=2, seed=0, device="cpu")
    model.learn(2048)
    returns = [info["r"] for info in model.ep_info_buffer]
    assert model.num_timesteps >= 2048 and len(returns) > 10
    assert np.isfinite(returns).all()
    env.close()


def test_sb3_infos_follow_its_contract() -> None:
    env = SB3VecEnv("Hopper-v5", 3, num_threads=1, params={"max_episode_steps": 2})
    env.seed(7)
    obs = env.reset()
    assert obs.shape == (3, 11)
    env.step_async(np.zeros((3, 3), np.float32))
    obs, rewards, dones, infos = env.step_wait()
    assert not dones.any() and infos == [{}, {}, {}] and rewards.dtype == np.float32
    env.step_async(np.zeros((3, 3), np.float32))
    obs, rewards, dones, infos = env.step_wait()
    assert dones.all()
    for info in infos:
        assert info["TimeLimit.truncated"] and info["episode"]["l"] == 2
        assert info["terminal_observation"].shape == (11,) and info["status"] == 0
    assert env.get_attr("render_mode") == [None] * 3
    with pytest.raises(NotImplementedError, match="env_method"):
        env.env_method("reset")


def test_rsl_rl_ppo_trains(tmp_path: Path) -> None:
    from rsl_rl.runners import OnPolicyRunner

    cfg = {
        "num_steps_per_env": 16, "save_interval": 100,
        "obs_groups": {"actor": ["policy"], "critic": ["policy"]},
        "algorithm": {"class_name": "PPO", "num_learning_epochs": 2, "num_mini_batches": 2},
        "actor": {"class_name": "MLPModel", "hidden_dims": [32, 32],
                  "distribution_cfg": {"class_name": "GaussianDistribution", "init_std": 1.0}},
        "critic": {"class_name": "MLPModel", "hidden_dims": [32, 32]},
    }
    env = RslRlVecEnv("Hopper-v5", 16, num_threads=1)
    runner = OnPolicyRunner(env, cfg, log_dir=str(tmp_path), device="cpu")
    runner.learn(12, init_at_random_ep_len=True)  # 12 x 16 x 16 = 3072 steps
    returns = list(runner.logger.rewbuffer)
    assert len(returns) > 5 and np.isfinite(returns).all()
    env.close()


def test_rsl_rl_contract() -> None:
    env = RslRlVecEnv("Hopper-v5", 4, num_threads=1, params={"max_episode_steps": 10})
    obs = env.get_observations()
    assert obs["policy"].shape == (4, 11) and obs["policy"].dtype == torch.float32
    env.episode_length_buf = torch.tensor([0, 3, 8, 9])
    assert env.episode_length_buf.tolist() == [0, 3, 8, 9]
    _, rewards, dones, extras = env.step(torch.full((4, 3), 5.0))  # clipped to [-1, 1]
    assert dones.tolist() == [0, 0, 0, 1]  # env 3 reached its time limit
    assert extras["time_outs"].tolist() == [False, False, False, True]
    assert env.episode_length_buf.tolist() == [1, 4, 9, 0]
    assert rewards.dtype == torch.float32 and extras["log"]["/unstable_fraction"] == 0.0
    with pytest.raises(ValueError, match="episode_length_buf"):
        env.episode_length_buf = torch.zeros(3)
