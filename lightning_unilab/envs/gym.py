"""PoolVectorEnv: a ``gymnasium.vector.VectorEnv`` over :class:`TaskVectorEnv`.

Code written for gymnasium's vector envs runs on the pool unchanged: spaces,
``metadata["autoreset_mode"]``, the ``(obs, reward, terminated, truncated, info)`` step,
``reset(seed=int | list, options=...)``, gymnasium's vector wrappers (``RecordEpisodeStatistics``,
``ClipAction``, ``NormalizeObservation``, ``NormalizeReward``, ``RecordVideo``), ``gym.make_vec``
through the ``omnilab/`` namespace (:mod:`lightning_unilab.envs.registration`):

    envs = PoolVectorEnv("HalfCheetah-v5", num_envs=64)          # NEXT_STEP, as gymnasium
    envs = gym.make_vec("omnilab/HalfCheetah-v5", num_envs=64)   # the same, registered
    envs = PoolVectorEnv("g1-walk-flat", 1024, autoreset="same_step")

As ``SyncVectorEnv``: ``reset`` and ``step`` return fresh arrays (``copy=False``: the env's
buffers, overwritten by the next call). Info follows gymnasium's vector convention, a ``_key``
boolean mask beside each key:

- the task's named terms (gymnasium's ``x_position``, ``x_velocity``, ``reward_forward``,
  ``reward_ctrl`` ...; at reset the position terms, as gymnasium's ``reset`` info);
- ``status``: each env's status bits at the end of the step (``describe_status`` names them):
  nonzero on a truncation means MuJoCo warned (the env was rolled back) or the action was bad;
- SAME_STEP mode: ``final_obs`` as a dense ``(num_envs, obs_size)`` array where gymnasium has an
  object array (``info["final_obs"][i]`` reads the same) and ``final_info`` with the ending
  step's terms; rows of finished envs in the step's own terms also describe the ending step;
- ``critic_obs`` for tasks with one;
- ``episode`` ({"r", "l"}) only with ``record_episode_statistics=True``: by default gymnasium's
  ``RecordEpisodeStatistics`` wrapper adds it, and refuses a key that is already there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv

from lightning_omnilab.validate import ArgumentTypeError, boolean, fail, one_of, positive_int
from lightning_unilab.envs.tasks.base import NumpyTask
from lightning_unilab.envs.vector_env import TaskVectorEnv

__all__ = ["PoolVectorEnv"]

_MODES = {"same_step": AutoresetMode.SAME_STEP, "next_step": AutoresetMode.NEXT_STEP}
_OPTIONS = ("reset_mask", "initial_state")


class PoolVectorEnv(VectorEnv):
    """num_envs copies of a task on a BatchEnvPool, as a gymnasium vector env.

    Args:
        task: as for TaskVectorEnv.
        num_envs: as for TaskVectorEnv.
        num_threads: as for TaskVectorEnv.
        params: as for TaskVectorEnv.
        randomization: as for TaskVectorEnv.
        nonfinite: as for TaskVectorEnv.
        copy: as for TaskVectorEnv.
        autoreset: "next_step" (gymnasium's default) or "same_step", or an AutoresetMode.
        max_episode_steps: the time limit (a task parameter of the gymnasium tasks; what
            ``gym.make_vec`` passes from the registered spec).
        record_episode_statistics: fill ``info["episode"]`` from the C++ episode totals, without
            gymnasium's wrapper (do not combine the two).
        render_mode: None or "rgb_array": ``render()`` returns one (height, width, 3) uint8 frame
            per env of ``render_envs`` (needs an OpenGL backend: see lightning_unilab.envs.render).
        render_envs: ids of the envs that ``render()`` draws; default env 0.
        render_size: (width, height) of the frames.
        camera: a camera name or id of the model, or None for a camera tracking body 1.
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"]}

    def __init__(
        self,
        task: str | NumpyTask | type[NumpyTask] | Mapping[str, Any],
        num_envs: int,
        num_threads: int | None = None,
        *,
        autoreset: str | AutoresetMode = "next_step",
        params: Mapping[str, float] | None = None,
        randomization: Any = None,
        nonfinite: str = "raise",
        copy: bool = True,
        max_episode_steps: int | None = None,
        record_episode_statistics: bool = False,
        render_mode: str | None = None,
        render_envs: Sequence[int] = (0,),
        render_size: tuple[int, int] = (480, 480),
        camera: str | int | None = None,
    ) -> None:
        self.closed = True  # until constructed
        if isinstance(autoreset, AutoresetMode):
            mode = {v: k for k, v in _MODES.items()}.get(autoreset, str(autoreset.value))
        else:
            mode = autoreset
        if mode not in _MODES:  # (an enum member or its name: not one_of's rule)
            fail("autoreset", f"one of {sorted(_MODES)}", autoreset)
        one_of("render_mode", render_mode, (None, "rgb_array"))
        boolean("record_episode_statistics", record_episode_statistics)
        if isinstance(render_size, str) or not isinstance(render_size, Sequence) or \
                len(render_size) != 2:
            fail("render_size", "(width, height)", render_size, ArgumentTypeError)
        for size in render_size:
            positive_int("render_size", size)
        if max_episode_steps is not None:
            params = {**(params or {}), "max_episode_steps": max_episode_steps}
        self.env = TaskVectorEnv(task, num_envs, num_threads, autoreset=mode, params=params,
                                 randomization=randomization, nonfinite=nonfinite, copy=copy)
        spec = self.env.spec
        self.num_envs = self.env.num_envs
        self.record_episode_statistics = record_episode_statistics
        dt = float(self.env.model.opt.timestep) * spec.frame_skip
        self.metadata = {**self.metadata, "autoreset_mode": _MODES[mode],
                         "render_fps": round(1.0 / dt)}
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (spec.obs_size,),
                                                       np.float64)
        # float32 as gymnasium's MuJoCo envs; float64 actions are taken as they are
        self.single_action_space = gym.spaces.Box(spec.action_low.astype(np.float32),
                                                  spec.action_high.astype(np.float32),
                                                  dtype=np.float32)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space,
                                                              self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.render_mode = render_mode
        try:
            self._render_ids = np.asarray(self.env.pool.select(np.sort(np.asarray(render_envs))))
        except (TypeError, ValueError, IndexError) as err:  # the pool's message says "ids"
            self.env.close()
            raise type(err)(f"render_envs: {err}") from err
        self._render_size = render_size
        self._camera = camera
        self._renderer = None
        self.closed = False

    # ------------------------------------------------------------------ gymnasium API

    def reset(self, *, seed: int | Sequence[int] | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset all envs, or those of ``options["reset_mask"]``.

        seed: an int (env i's start states then depend on seed and i only) or one int per reset
        env. options: ``reset_mask`` (bool, one per env) and ``initial_state`` (mjSTATE_
        INTEGRATION rows, one per reset env or one for all: start states instead of sampled
        ones; see ``envs.pool.state``).
        """
        self._check_open()
        options = dict(options or {})
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise ValueError(f"options: unknown key(s) {unknown}; this env takes {_OPTIONS}")
        mask = np.ones(self.num_envs, bool)
        ids = None
        if "reset_mask" in options:
            mask = np.asarray(options["reset_mask"])
            if mask.dtype != np.bool_ or mask.shape != (self.num_envs,):
                raise ValueError(f"options['reset_mask']: expected a bool array of shape "
                                 f"({self.num_envs},), got {mask.dtype} {mask.shape}")
            ids = np.flatnonzero(mask)
        obs, raw = self.env.reset(seed=seed, ids=ids, initial_state=options.get("initial_state"))
        if seed is not None:  # valid: TaskVectorEnv checked it
            first = seed if isinstance(seed, int | np.integer) else next(iter(seed), None)
            if first is not None:
                self._np_random, self._np_random_seed = seeding.np_random(int(first))
        info: dict[str, Any] = {}
        for key, value in raw.items():
            info[key] = value
            info[f"_{key}"] = mask.copy()
        return obs, info

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                          dict[str, Any]]:
        self._check_open()
        obs, reward, terminated, truncated, raw = self.env.step(np.asarray(actions))
        done = raw["done"]
        info: dict[str, Any] = {}
        every = np.ones(self.num_envs, bool)
        terms = ["critic_obs", *self.env.spec.info_names, "status"]
        for key in terms:
            if key in raw:
                info[key] = raw[key]
                info[f"_{key}"] = every.copy()
        if not done.any():
            return obs, reward, terminated, truncated, info
        if self.record_episode_statistics:
            info["episode"] = {"r": np.where(done, raw["episode_return"], 0.0),
                               "l": np.where(done, raw["episode_length"], 0)}
            info["_episode"] = done.copy()
        if "final_obs" in raw:
            info["final_obs"] = raw["final_obs"]
            info["_final_obs"] = done.copy()
            if "final_critic_obs" in raw:
                info["final_critic_obs"] = raw["final_critic_obs"]
                info["_final_critic_obs"] = done.copy()
            final: dict[str, Any] = {}
            for key in terms[1:]:
                if key in raw:
                    final[key] = raw[key]
                    final[f"_{key}"] = done.copy()
            info["final_info"] = final
            info["_final_info"] = done.copy()
        return obs, reward, terminated, truncated, info

    def render(self) -> tuple[np.ndarray, ...] | None:
        """Frames of the envs in ``render_envs`` at their current states (rgb_array mode)."""
        self._check_open()
        if self.render_mode is None:
            gym.logger.warn("render: this env was made without render_mode; pass "
                            "render_mode='rgb_array'")
            return None
        if self._renderer is None:
            from lightning_unilab.envs.render import EnvRenderer

            width, height = self._render_size
            self._renderer = EnvRenderer(self.env.model, width, height, self._camera)
        return tuple(self._renderer.render(self.env.pool.state[self._render_ids]))

    def close_extras(self, **kwargs: Any) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        self.env.close()

    # ------------------------------------------------------------------ extras

    @property
    def pool(self):  # noqa: ANN201 - BatchEnvPool; avoids importing it for a type
        """The BatchEnvPool underneath (model fields, status, state)."""
        return self.env.pool

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("this PoolVectorEnv is closed")
