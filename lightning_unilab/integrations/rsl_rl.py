"""RslRlVecEnv: an rsl_rl ``VecEnv`` (rsl-rl-lib 5.x) over :class:`TaskVectorEnv`.

    from rsl_rl.runners import OnPolicyRunner
    from lightning_unilab.integrations.rsl_rl import RslRlVecEnv
    env = RslRlVecEnv("g1-walk-flat", num_envs=1024)
    OnPolicyRunner(env, train_cfg, log_dir=None).learn(1500)

rsl_rl's contract, as Isaac Lab's wrapper serves it: torch tensors on ``device``; observations
as a TensorDict of groups, ``"policy"`` (the actor's) and, for tasks with a critic observation,
``"critic"``; same-step auto-reset with ``extras["time_outs"]`` marking truncations (rsl_rl
bootstraps them); ``episode_length_buf`` is the live step counter of each env's episode, and
assigning it (the runner's ``init_at_random_ep_len``) moves the time limits of the envs.
Actions are clipped to the task's bounds (``clip_actions=False`` passes them as they are).
``extras["log"]`` carries the fraction of envs whose step ended with MuJoCo warnings and the
step's mean of each named term of the task (the G1's reward terms, gymnasium's reward parts).

:class:`RslRlActor` gives a trained rsl_rl actor the ``act`` of our ActorCritic, so that
:func:`lightning_unilab.evaluate.evaluate_policy` runs the same evaluation episode on it::

    evaluate_policy(RslRlActor(runner.get_inference_policy(), env), "g1-walk-flat", "build/ev")
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from rsl_rl.env import VecEnv
from tensordict import TensorDict

from lightning_unilab import _core
from lightning_unilab.envs.tasks.base import NumpyTask
from lightning_unilab.envs.vector_env import TaskVectorEnv

__all__ = ["RslRlActor", "RslRlVecEnv"]


class RslRlVecEnv(VecEnv):
    """num_envs copies of a task as an rsl_rl VecEnv.

    Args:
        task: as for TaskVectorEnv.
        num_envs: as for TaskVectorEnv.
        num_threads: as for TaskVectorEnv.
        device: where the returned tensors live (the envs themselves run on the CPU).
        clip_actions: clip actions to the task's bounds before stepping.
        seed: seed of the start states.
        **kwargs: more TaskVectorEnv arguments (params, randomization, nonfinite).
    """

    def __init__(self, task: str | NumpyTask, num_envs: int, num_threads: int | None = None,
                 *, device: str | torch.device = "cpu", clip_actions: bool = True,
                 seed: int = 0, **kwargs: Any) -> None:
        if "autoreset" in kwargs:
            raise ValueError("autoreset: rsl_rl envs reset in the same step; it is fixed here")
        # no copies: every array is converted to a torch tensor before the next step
        self.env = TaskVectorEnv(task, num_envs, num_threads, autoreset="same_step",
                                 copy=False, seed=seed, **kwargs)
        spec = self.env.spec
        self.num_envs = self.env.num_envs
        self.num_actions = spec.action_size
        self.max_episode_length = spec.max_episode_steps
        self.device = torch.device(device)
        self.cfg = {"task": self.env.name, "num_envs": self.num_envs, "seed": seed}
        self.clip_actions = clip_actions
        self._low = spec.action_low.astype(np.float32)
        self._high = spec.action_high.astype(np.float32)
        obs, info = self.env.reset(seed=seed)
        self._obs = self._group(obs, info.get("critic_obs"))

    def _group(self, obs: np.ndarray, critic: np.ndarray | None) -> TensorDict:
        groups = {"policy": torch.as_tensor(obs, dtype=torch.float32, device=self.device)}
        if critic is not None:
            groups["critic"] = torch.as_tensor(critic, dtype=torch.float32, device=self.device)
        return TensorDict(groups, batch_size=[self.num_envs], device=self.device)

    def get_observations(self) -> TensorDict:
        return self._obs

    def step(self, actions: torch.Tensor) -> tuple[TensorDict, torch.Tensor, torch.Tensor,
                                                     dict]:
        acts = actions.detach().to("cpu", torch.float32).numpy()
        if self.clip_actions:
            acts = np.clip(acts, self._low, self._high)
        obs, reward, terminated, truncated, info = self.env.step(acts)
        self._obs = self._group(obs, info.get("critic_obs"))
        dones = torch.as_tensor(terminated | truncated, device=self.device).long()
        time_outs = torch.as_tensor(truncated & ~terminated, device=self.device)
        warned = info["status"] & ((1 << _core.NUM_WARNINGS) - 1)
        unstable = float(np.count_nonzero(warned)) / self.num_envs
        log = {"/unstable_fraction": unstable}
        for name in self.env.spec.info_names:  # the task's reward terms, as means over envs
            log[f"/{name}"] = float(np.mean(info[name]))
        extras = {"time_outs": time_outs, "log": log}
        rewards = torch.as_tensor(reward, dtype=torch.float32, device=self.device)
        return self._obs, rewards, dones, extras

    @property
    def episode_length_buf(self) -> torch.Tensor:
        """(num_envs,) steps taken in each env's current episode (a copy)."""
        return torch.as_tensor(self.env.episode_steps.astype(np.int64), device=self.device)

    @episode_length_buf.setter
    def episode_length_buf(self, value: torch.Tensor) -> None:
        steps = np.asarray(torch.as_tensor(value).detach().cpu(), np.int64)
        if steps.shape != (self.num_envs,):
            raise ValueError(f"episode_length_buf: expected shape ({self.num_envs},), got "
                             f"{steps.shape}")
        limit = self.max_episode_length - 1 if self.max_episode_length > 0 else np.inf
        self.env.episode_steps[:] = np.clip(steps, 0, limit)

    def close(self) -> None:
        self.env.close()


class RslRlActor(torch.nn.Module):
    """A trained rsl_rl actor (an ``MLPModel``, e.g. ``runner.get_inference_policy()``) behind
    ActorCritic's ``act``.

    It holds rsl_rl's own export of the actor (``as_jit()``: normalizer, MLP and deterministic
    output, a copy taken now), so the episode is the deployed policy's; actions are clipped to
    the task's bounds as :class:`RslRlVecEnv` steps them in training. Deterministic only.
    """

    def __init__(self, model: torch.nn.Module, env: RslRlVecEnv) -> None:
        super().__init__()
        if not isinstance(env, RslRlVecEnv):
            raise TypeError(f"env: expected the RslRlVecEnv the actor was trained on, got "
                            f"{type(env).__name__}")
        groups = list(getattr(model, "obs_groups", []))
        if groups != ["policy"] or not hasattr(model, "as_jit"):
            raise ValueError(f"model: expected an rsl_rl MLPModel actor reading the 'policy' "
                             f"observation group, got {type(model).__name__} reading {groups}")
        self.exported = model.as_jit()
        self.obs_size = int(env.env.spec.obs_size)
        self.action_size = int(env.num_actions)
        self.register_buffer("low", torch.as_tensor(env._low))
        self.register_buffer("high", torch.as_tensor(env._high))
        self.clip_actions = env.clip_actions

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = True
            ) -> tuple[torch.Tensor, None, torch.Tensor, None]:
        if not deterministic:
            raise ValueError("deterministic: RslRlActor gives the deterministic action only")
        mean = self.exported(obs.to(self.low.dtype))
        action = mean.clamp(self.low, self.high) if self.clip_actions else mean
        return action.to(obs.dtype), None, mean.to(obs.dtype), None
