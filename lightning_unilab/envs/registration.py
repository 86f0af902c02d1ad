"""gymnasium registration: every task under the ``omnilab/`` namespace, as vector envs.

    import lightning_unilab                  # registers (when gymnasium is installed)
    envs = gym.make_vec("omnilab/HalfCheetah-v5", num_envs=64)
    envs = gym.make_vec("omnilab/g1-walk-flat", num_envs=1024, autoreset="same_step")

``gym.make_vec`` reaches :class:`~lightning_unilab.envs.gym.PoolVectorEnv` through the vector entry
point (its default mode for these ids), sets ``envs.spec`` and passes its keyword arguments on
(``num_threads``, ``params``, ``autoreset``, ``render_mode`` ...). The gymnasium-parity tasks also
register gymnasium's own env as the single-env entry point, so ``gym.make("omnilab/Ant-v5")``
and ``gym.make_vec(..., vectorization_mode="sync")`` give the reference implementation.
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym

from lightning_unilab.envs import tasks

__all__ = ["NAMESPACE", "make_vector_env", "register_envs"]

NAMESPACE = "omnilab"

# gymnasium's own env classes of the parity tasks (the single-env entry points)
_GYM_ENTRY = {
    "HalfCheetah-v5": "gymnasium.envs.mujoco.half_cheetah_v5:HalfCheetahEnv",
    "Ant-v5": "gymnasium.envs.mujoco.ant_v5:AntEnv",
    "Hopper-v5": "gymnasium.envs.mujoco.hopper_v5:HopperEnv",
    "Walker2d-v5": "gymnasium.envs.mujoco.walker2d_v5:Walker2dEnv",
    "Humanoid-v5": "gymnasium.envs.mujoco.humanoid_v5:HumanoidEnv",
    "InvertedPendulum-v5": "gymnasium.envs.mujoco.inverted_pendulum_v5:InvertedPendulumEnv",
}


def make_vector_env(task: str, num_envs: int = 1, **kwargs: Any) -> gym.vector.VectorEnv:
    """The vector entry point: a PoolVectorEnv of task."""
    from lightning_unilab.envs.gym import PoolVectorEnv

    return PoolVectorEnv(task, num_envs, **kwargs)


def register_envs() -> list[str]:
    """Register every task as ``omnilab/<name>``; returns the ids (idempotent)."""
    ids = []
    for name in tasks.task_names():
        env_id = f"{NAMESPACE}/{name}"
        ids.append(env_id)
        if env_id in gym.registry:
            continue
        gym_task = name in _GYM_ENTRY
        gym.register(
            id=env_id,
            entry_point=_GYM_ENTRY.get(name),
            vector_entry_point=functools.partial(make_vector_env, name),
            # the gymnasium tasks' time limit, also gymnasium's TimeLimit for the single env
            max_episode_steps=1000 if gym_task else None,
        )
    return ids
