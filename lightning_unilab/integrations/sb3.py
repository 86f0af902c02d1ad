"""SB3VecEnv: a Stable-Baselines3 ``VecEnv`` over :class:`TaskVectorEnv`.

    from stable_baselines3 import PPO
    from lightning_unilab.integrations.sb3 import SB3VecEnv
    model = PPO("MlpPolicy", SB3VecEnv("HalfCheetah-v5", num_envs=16), n_steps=128)
    model.learn(100_000)

SB3's own contract: same-step auto-reset (the returned obs of a finished env is its next
episode's first), one info dict per env, ``terminal_observation`` and ``TimeLimit.truncated``
in the dicts of finished envs. Those dicts also carry ``episode`` ({"r", "l", "t"}, as
``VecMonitor``: SB3's ``ep_info_buffer`` and its rollout/ep_rew_mean log read it, so do not
wrap this env in ``VecMonitor`` too) and ``status`` (the env's status bits: nonzero when MuJoCo
warned or the action was bad). The one Python loop per step builds the list of dicts SB3 asks
for; it touches only finished envs beyond creating empty dicts.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.vec_env.base_vec_env import (
    VecEnv,
    VecEnvIndices,
    VecEnvObs,
    VecEnvStepReturn,
)

from lightning_unilab.envs.tasks.base import NumpyTask
from lightning_unilab.envs.vector_env import TaskVectorEnv

__all__ = ["SB3VecEnv"]


class SB3VecEnv(VecEnv):
    """num_envs copies of a task as an SB3 VecEnv.

    Args:
        task: as for TaskVectorEnv.
        num_envs: as for TaskVectorEnv.
        num_threads: as for TaskVectorEnv.
        **kwargs: more TaskVectorEnv arguments (params, randomization, nonfinite, seed).
    """

    def __init__(self, task: str | NumpyTask, num_envs: int, num_threads: int | None = None,
                 **kwargs: Any) -> None:
        if "autoreset" in kwargs:
            raise ValueError("autoreset: SB3 VecEnvs reset in the same step; it is fixed here")
        self.env = TaskVectorEnv(task, num_envs, num_threads, autoreset="same_step", **kwargs)
        spec = self.env.spec
        self.render_mode = None
        observation_space = gym.spaces.Box(-np.inf, np.inf, (spec.obs_size,), np.float64)
        action_space = gym.spaces.Box(spec.action_low.astype(np.float32),
                                      spec.action_high.astype(np.float32), dtype=np.float32)
        super().__init__(self.env.num_envs, observation_space, action_space)
        self._actions: np.ndarray | None = None
        self._start = time.time()

    def reset(self) -> VecEnvObs:
        seeds = self._seeds
        seed = None if all(s is None for s in seeds) else [int(s or 0) for s in seeds]
        obs, _ = self.env.reset(seed=seed)
        self.reset_infos = [{} for _ in range(self.num_envs)]
        self._reset_seeds()
        self._reset_options()
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = np.asarray(actions)

    def step_wait(self) -> VecEnvStepReturn:
        if self._actions is None:
            raise RuntimeError("step_wait: call step_async(actions) first")
        obs, reward, terminated, truncated, info = self.env.step(self._actions)
        self._actions = None
        done = terminated | truncated
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        elapsed = round(time.time() - self._start, 6)
        for i in np.flatnonzero(done).tolist():
            infos[i]["terminal_observation"] = info["final_obs"][i]
            infos[i]["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
            infos[i]["episode"] = {"r": float(info["episode_return"][i]),
                                   "l": int(info["episode_length"][i]), "t": elapsed}
            infos[i]["status"] = int(info["status"][i])
        return obs, reward.astype(np.float32), done, infos

    def close(self) -> None:
        self.env.close()

    def _indices(self, indices: VecEnvIndices) -> list[int]:
        if indices is None:
            return list(range(self.num_envs))
        if isinstance(indices, int | np.integer):
            return [int(indices)]
        return list(indices)

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """An attribute of the adapter or of its TaskVectorEnv, once per selected env."""
        owner = self if attr_name in self.__dict__ else self.env
        value = getattr(owner, attr_name)
        return [value for _ in self._indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        setattr(self, attr_name, value)

    def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None,
                   **method_kwargs: Any) -> list[Any]:
        raise NotImplementedError(
            f"env_method({method_name!r}): the envs are rows of one TaskVectorEnv, not objects "
            "with methods; use sb3_env.env (the TaskVectorEnv) directly")

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper],
                       indices: VecEnvIndices = None) -> list[bool]:
        return [False for _ in self._indices(indices)]

    def get_images(self) -> Sequence[np.ndarray | None]:
        return [None for _ in range(self.num_envs)]
