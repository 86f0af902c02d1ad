"""Our adapters against each RL library's default env, on the same machine in the same run.

For each library the same task (HalfCheetah-v5, 16 envs), the same random actions or the same
PPO settings, two envs:

- CleanRL (gymnasium vector API): ``gym.make_vec(..., vectorization_mode="sync")`` (gymnasium's
  SyncVectorEnv, what CleanRL builds) against ``PoolVectorEnv``, both under CleanRL's
  ppo_continuous_action wrapper stack; env steps/s with random actions.
- Stable-Baselines3: ``make_vec_env("HalfCheetah-v5", 16)`` (a DummyVecEnv of Monitor-wrapped
  gymnasium envs) against ``SB3VecEnv``: env steps/s, and the wall time of PPO.learn.
- rsl_rl: rsl_rl ships no env of its own (Isaac Lab is its usual one); the baseline is the
  adapter a user writes without us, an rsl_rl VecEnv over gymnasium's SyncVectorEnv, against
  ``RslRlVecEnv``: env steps/s, and the wall time of OnPolicyRunner.learn.

Each pair runs interleaved, best of the rounds. Learning runs are short (a few thousand steps)
and include the library's own update time, which is the same for both envs.

    python benchmarks/integrations_speed.py [--quick] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from lightning_unilab.envs.gym import PoolVectorEnv
from lightning_unilab.integrations import RslRlVecEnv, SB3VecEnv

sys.path.insert(0, str(Path(__file__).parent))
from task_bench import _quiet_stdout  # noqa: E402 - MuJoCo's compiler warnings off the table

TASK = "HalfCheetah-v5"
NUM_ENVS = 16


def cleanrl_stack(envs: gym.vector.VectorEnv) -> gym.vector.VectorEnv:
    """ppo_continuous_action's wrappers, in its order."""
    from gymnasium.wrappers import vector as vw

    envs = vw.RecordEpisodeStatistics(envs)
    envs = vw.ClipAction(envs)
    envs = vw.NormalizeObservation(envs)
    envs = vw.TransformObservation(envs, lambda obs: np.clip(obs, -10, 10))
    envs = vw.NormalizeReward(envs, gamma=0.99)
    return vw.TransformReward(envs, lambda r: np.clip(r, -10, 10))


def steps_per_s(step: Callable[[np.ndarray], object], actions: list[np.ndarray]) -> float:
    t0 = time.perf_counter()
    for a in actions:
        step(a)
    return len(actions) * NUM_ENVS / (time.perf_counter() - t0)


def interleaved(runs: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """Best of rounds for each run; the order flips each round."""
    got: dict[str, list[float]] = {k: [] for k in runs}
    order = list(runs)
    for _ in range(rounds):
        for name in order:
            got[name].append(runs[name]())
        order.reverse()
    return {k: max(v) for k, v in got.items()}


def fastest(runs: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """Shortest wall time of each run (seconds), interleaved."""
    got: dict[str, list[float]] = {k: [] for k in runs}
    order = list(runs)
    for _ in range(rounds):
        for name in order:
            t0 = time.perf_counter()
            runs[name]()
            got[name].append(time.perf_counter() - t0)
        order.reverse()
    return {k: min(v) for k, v in got.items()}


class GymRslRlVecEnv:
    """The baseline rsl_rl adapter: an rsl_rl VecEnv over gymnasium's SyncVectorEnv."""

    def __init__(self, num_envs: int) -> None:
        from tensordict import TensorDict

        self._td = TensorDict
        self.envs = gym.make_vec(TASK, num_envs, vectorization_mode="sync",
                                 vector_kwargs={"autoreset_mode":
                                                gym.vector.AutoresetMode.SAME_STEP})
        self.num_envs, self.num_actions = num_envs, 6
        self.max_episode_length = 1000
        self.episode_length_buf = torch.zeros(num_envs, dtype=torch.long)
        self.device, self.cfg = torch.device("cpu"), {}
        obs, _ = self.envs.reset(seed=0)
        self.obs = self._group(obs)

    def _group(self, obs: np.ndarray):
        return self._td({"policy": torch.as_tensor(obs, dtype=torch.float32)},
                        batch_size=[self.num_envs])

    def get_observations(self):
        return self.obs

    def step(self, actions: torch.Tensor):
        acts = np.clip(actions.numpy().astype(np.float32), -1, 1)
        obs, reward, term, trunc, _ = self.envs.step(acts)
        self.obs = self._group(obs)
        dones = torch.as_tensor(term | trunc).long()
        return self.obs, torch.as_tensor(reward, dtype=torch.float32), dones, {
            "time_outs": torch.as_tensor(trunc & ~term)}


def measure(quick: bool) -> dict:
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(1)
    steps = 200 if quick else 1000
    rounds = 2 if quick else 3
    rng = np.random.default_rng(0)
    actions = [rng.uniform(-1, 1, (NUM_ENVS, 6)).astype(np.float32) for _ in range(steps)]
    threads = len(os.sched_getaffinity(0))
    result: dict = {"task": TASK, "num_envs": NUM_ENVS, "num_threads": threads,
                    "mode": "quick" if quick else "full"}

    # CleanRL: gymnasium vector API with its wrapper stack
    with _quiet_stdout():
        gym_envs = cleanrl_stack(gym.make_vec(TASK, NUM_ENVS, vectorization_mode="sync"))
    with _quiet_stdout():  # the XML's deprecated attribute: MuJoCo warns at every load
        pool_envs = cleanrl_stack(PoolVectorEnv(TASK, NUM_ENVS, threads))
    gym_envs.reset(seed=0)
    pool_envs.reset(seed=0)
    rates = interleaved({"gymnasium_sync": lambda: steps_per_s(gym_envs.step, actions),
                         "pool": lambda: steps_per_s(pool_envs.step, actions)}, rounds)
    result["cleanrl"] = {**{f"{k}_env_steps_per_s": v for k, v in rates.items()},
                         "speedup": rates["pool"] / rates["gymnasium_sync"]}

    # SB3: DummyVecEnv of gymnasium envs (make_vec_env) against SB3VecEnv
    with _quiet_stdout():
        dummy = make_vec_env(TASK, NUM_ENVS, seed=0)
    with _quiet_stdout():
        ours = SB3VecEnv(TASK, NUM_ENVS, threads)
    dummy.reset()
    ours.reset()
    rates = interleaved({"dummy_vec_env": lambda: steps_per_s(dummy.step, actions),
                         "pool": lambda: steps_per_s(ours.step, actions)}, rounds)
    total = 2048 if quick else 8192

    def sb3_learn(env) -> None:
        PPO("MlpPolicy", env, n_steps=128, batch_size=256, n_epochs=2, seed=0,
            device="cpu").learn(total)

    times = fastest({"dummy_vec_env": lambda: sb3_learn(dummy),
                     "pool": lambda: sb3_learn(ours)}, 1 if quick else 2)
    result["sb3"] = {**{f"{k}_env_steps_per_s": v for k, v in rates.items()},
                     "speedup": rates["pool"] / rates["dummy_vec_env"],
                     **{f"{k}_ppo_learn_s": v for k, v in times.items()},
                     "ppo_steps": total,
                     "ppo_speedup": times["dummy_vec_env"] / times["pool"]}

    # rsl_rl: a plain adapter over SyncVectorEnv against RslRlVecEnv
    from rsl_rl.runners import OnPolicyRunner

    with _quiet_stdout():
        base = GymRslRlVecEnv(NUM_ENVS)
        rsl = RslRlVecEnv(TASK, NUM_ENVS, threads)
    torch_actions = [torch.as_tensor(a) for a in actions]
    rates = interleaved({"gymnasium_sync": lambda: steps_per_s(base.step, torch_actions),
                         "pool": lambda: steps_per_s(rsl.step, torch_actions)}, rounds)
    iterations = 4 if quick else 16
    cfg = {"num_steps_per_env": 32, "save_interval": 10_000,
           "obs_groups": {"actor": ["policy"], "critic": ["policy"]},
           "algorithm": {"class_name": "PPO", "num_learning_epochs": 2, "num_mini_batches": 2},
           "actor": {"class_name": "MLPModel", "hidden_dims": [64, 64],
                     "distribution_cfg": {"class_name": "GaussianDistribution",
                                          "init_std": 1.0}},
           "critic": {"class_name": "MLPModel", "hidden_dims": [64, 64]}}

    def rsl_learn(env) -> None:
        import contextlib
        import copy
        import io

        with contextlib.redirect_stdout(io.StringIO()):  # rsl_rl prints its models
            OnPolicyRunner(env, copy.deepcopy(cfg), log_dir=None).learn(iterations)

    times = fastest({"gymnasium_sync": lambda: rsl_learn(base),
                     "pool": lambda: rsl_learn(rsl)}, 1 if quick else 2)
    result["rsl_rl"] = {**{f"{k}_env_steps_per_s": v for k, v in rates.items()},
                        "speedup": rates["pool"] / rates["gymnasium_sync"],
                        **{f"{k}_ppo_learn_s": v for k, v in times.items()},
                        "ppo_steps": iterations * 32 * NUM_ENVS,
                        "ppo_speedup": times["gymnasium_sync"] / times["pool"]}
    return result


def print_table(r: dict) -> None:
    print(f"\n{r['task']}, {r['num_envs']} envs, {r['num_threads']} pool threads "
          f"({r['mode']} mode)")
    print(f"{'library':10s} {'default env':>16s} {'ours':>12s} {'speedup':>8s}   "
          f"{'PPO default':>11s} {'PPO ours':>9s} {'speedup':>8s}")
    for lib, base in (("cleanrl", "gymnasium_sync"), ("sb3", "dummy_vec_env"),
                      ("rsl_rl", "gymnasium_sync")):
        x = r[lib]
        line = (f"{lib:10s} {x[base + '_env_steps_per_s']:12,.0f} /s "
                f"{x['pool_env_steps_per_s']:9,.0f} /s {x['speedup']:7.2f}x")
        if "ppo_speedup" in x:
            line += (f"   {x[base + '_ppo_learn_s']:9.2f} s {x['pool_ppo_learn_s']:7.2f} s "
                     f"{x['ppo_speedup']:7.2f}x")
        print(line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps, under 60 s")
    parser.add_argument("--out", type=Path, help="write the results as JSON")
    args = parser.parse_args(argv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # gymnasium's MJCF deprecation notice
        result = measure(args.quick)
    print_table(result)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(args.out.suffix + ".tmp")
        tmp.write_text(json.dumps(result, indent=2))
        tmp.replace(args.out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
