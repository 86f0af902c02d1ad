"""PoolVectorEnv: a ``gymnasium.vector.VectorEnv`` over :class:`TaskVectorEnv`.

Code written for gymnasium's vector envs (spaces, ``metadata["autoreset_mode"]``, the
``(obs, reward, terminated, truncated, info)`` step, ``options["reset_mask"]``) runs on the pool
unchanged:

    envs = PoolVectorEnv("Ant-v5", num_envs=64)                 # NEXT_STEP, as gymnasium
    envs = PoolVectorEnv("g1-walk-flat", 1024, autoreset="same_step")

Info follows gymnasium's vector convention (a ``_key`` boolean mask beside each key):
``episode`` ({"r", "l"}, as RecordEpisodeStatistics) for episodes that ended in the step;
in SAME_STEP mode ``final_obs`` as a dense (num_envs, obs_size) array where gymnasium has an
object array (``info["final_obs"][i]`` reads the same); ``critic_obs`` for tasks with one.
The returned arrays are the env's buffers, overwritten by the next step, as the single-step
envpool-style contract allows; copy what you keep.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from lightning_unilab.tasks.base import NumpyTask
from lightning_unilab.vector_env import TaskVectorEnv

__all__ = ["PoolVectorEnv"]

_MODES = {"same_step": AutoresetMode.SAME_STEP, "next_step": AutoresetMode.NEXT_STEP}


class PoolVectorEnv(VectorEnv):
    """num_envs copies of a task on a BatchEnvPool, as a gymnasium vector env.

    Args:
        task, num_envs, num_threads, params, randomization, nonfinite: as for TaskVectorEnv.
        autoreset: "next_step" (gymnasium's default) or "same_step", or an AutoresetMode.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        task: str | NumpyTask,
        num_envs: int,
        num_threads: int | None = None,
        *,
        autoreset: str | AutoresetMode = "next_step",
        params: Mapping[str, float] | None = None,
        randomization: Any = None,
        nonfinite: str = "raise",
    ) -> None:
        if isinstance(autoreset, AutoresetMode):
            mode = {v: k for k, v in _MODES.items()}.get(autoreset, str(autoreset.value))
        else:
            mode = autoreset
        if mode not in _MODES:
            raise ValueError(f"autoreset: expected one of {sorted(_MODES)}, got {autoreset!r}")
        self.env = TaskVectorEnv(task, num_envs, num_threads, autoreset=mode, params=params,
                                 randomization=randomization, nonfinite=nonfinite)
        spec = self.env.spec
        self.num_envs = self.env.num_envs
        self.metadata = {**self.metadata, "autoreset_mode": _MODES[mode]}
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (spec.obs_size,),
                                                       np.float64)
        # float32 as gymnasium's MuJoCo envs; float64 actions are taken as they are
        self.single_action_space = gym.spaces.Box(spec.action_low.astype(np.float32),
                                                  spec.action_high.astype(np.float32),
                                                  dtype=np.float32)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space,
                                                              self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.render_mode = None
        self.closed = False

    def reset(self, *, seed: int | list[int] | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset all envs, or those of ``options["reset_mask"]``; seed: an int (env i's start
        states then depend on seed and i only)."""
        if isinstance(seed, list | tuple):
            raise ValueError("seed: this vector env takes one int seed (each env derives its "
                             "own stream from it)")
        ids = None
        if options and "reset_mask" in options:
            mask = np.asarray(options["reset_mask"])
            if mask.dtype != np.bool_ or mask.shape != (self.num_envs,):
                raise ValueError(f"options['reset_mask']: expected a bool array of shape "
                                 f"({self.num_envs},), got {mask.dtype} {mask.shape}")
            ids = np.flatnonzero(mask)
        if seed is not None:
            self._np_random_seed = seed
        obs, info = self.env.reset(seed=seed, ids=ids)
        return obs, dict(info)

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                          dict[str, Any]]:
        obs, reward, terminated, truncated, raw = self.env.step(np.asarray(actions))
        done = raw["done"]
        info: dict[str, Any] = {}
        if "critic_obs" in raw:
            info["critic_obs"] = raw["critic_obs"]
            info["_critic_obs"] = np.ones(self.num_envs, bool)
        if done.any():
            info["episode"] = {"r": np.where(done, raw["episode_return"], 0.0),
                               "l": np.where(done, raw["episode_length"], 0)}
            info["_episode"] = done.copy()
            if "final_obs" in raw:
                info["final_obs"] = raw["final_obs"]
                info["_final_obs"] = done.copy()
                if "final_critic_obs" in raw:
                    info["final_critic_obs"] = raw["final_critic_obs"]
                    info["_final_critic_obs"] = done.copy()
        return obs, reward, terminated, truncated, info

    def close_extras(self, **kwargs: Any) -> None:
        self.env.close()

    @property
    def pool(self):  # noqa: ANN201 - BatchEnvPool; avoids importing it for a type
        """The BatchEnvPool underneath (model fields, status, state)."""
        return self.env.pool
