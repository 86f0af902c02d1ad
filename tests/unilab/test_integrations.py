"""SB3 and rsl_rl train on the adapters: short real runs of each library's PPO."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDict

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


def test_rsl_rl_actor_runs_our_evaluation_episode(tmp_path: Path) -> None:
    from rsl_rl.runners import OnPolicyRunner

    from lightning_unilab.envs.vector_env import TaskVectorEnv
    from lightning_unilab.evaluate import evaluate_policy
    from lightning_unilab.integrations import RslRlActor

    cfg = {
        "num_steps_per_env": 8, "save_interval": 100,
        "obs_groups": {"actor": ["policy"], "critic": ["policy"]},
        "algorithm": {"class_name": "PPO", "num_learning_epochs": 1, "num_mini_batches": 1},
        "actor": {"class_name": "MLPModel", "hidden_dims": [16], "obs_normalization": True,
                  "distribution_cfg": {"class_name": "GaussianDistribution", "init_std": 1.0}},
        "critic": {"class_name": "MLPModel", "hidden_dims": [16]},
    }
    env = RslRlVecEnv("Hopper-v5", 8, num_threads=1)
    runner = OnPolicyRunner(env, cfg, log_dir=None, device="cpu")
    runner.learn(2)  # moves the weights and the normalizer off their start
    model = runner.get_inference_policy()
    with torch.no_grad():  # large output weights: some actions fall outside [-1, 1]
        model.mlp[-1].weight.mul_(50.0)
    actor = RslRlActor(model, env)
    summary = evaluate_policy(actor, "Hopper-v5", tmp_path, seed=3, max_steps=20, video=False)
    # the same episode by hand: rsl_rl's deterministic output, clipped, on a fresh env
    hand = TaskVectorEnv("Hopper-v5", 1, 1, seed=3)
    obs, _ = hand.reset(seed=3)
    total, clipped = 0.0, 0
    for _ in range(summary["length"]):
        with torch.no_grad():
            out = model(TensorDict({"policy": torch.as_tensor(obs, dtype=torch.float32)},
                                   batch_size=[1])).numpy().astype(np.float64)
        clipped += int((np.abs(out) > 1.0).any())
        obs, reward, term, trunc, _ = hand.step(np.clip(out, -1.0, 1.0))
        total += float(reward[0])
        if term[0] or trunc[0]:
            break
    hand.close()
    env.close()
    assert clipped > 0
    assert summary["return"] == pytest.approx(total, rel=1e-5)
    with pytest.raises(ValueError, match="deterministic"):
        actor.act(torch.zeros(1, 11), deterministic=False)
    with pytest.raises(TypeError, match="env"):
        RslRlActor(model, hand)
    other = RslRlVecEnv("Hopper-v5", 1, num_threads=1)
    with pytest.raises(ValueError, match="model"):
        RslRlActor(torch.nn.Linear(11, 3), other)
    other.close()


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
