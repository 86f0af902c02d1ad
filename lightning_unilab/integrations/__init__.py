"""Adapters of TaskVectorEnv for RL libraries; each imports its library only when used.

- :class:`~lightning_unilab.integrations.sb3.SB3VecEnv`: a Stable-Baselines3 ``VecEnv``
  (extra ``sb3``): ``PPO("MlpPolicy", SB3VecEnv("HalfCheetah-v5", 16))``.
- :class:`~lightning_unilab.integrations.rsl_rl.RslRlVecEnv`: an rsl_rl ``VecEnv`` (extra
  ``rsl_rl``): ``OnPolicyRunner(RslRlVecEnv("g1-walk-flat", 1024), train_cfg)``;
  :class:`~lightning_unilab.integrations.rsl_rl.RslRlActor` runs its trained actor through our
  evaluation episode.

CleanRL and other gymnasium users need no adapter: :class:`lightning_unilab.envs.gym.PoolVectorEnv`
is a gymnasium vector env. See docs/unilab/integrations.md.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RslRlActor", "RslRlVecEnv", "SB3VecEnv"]

_WHERE = {"SB3VecEnv": ("lightning_unilab.integrations.sb3", "sb3"),
          "RslRlVecEnv": ("lightning_unilab.integrations.rsl_rl", "rsl_rl"),
          "RslRlActor": ("lightning_unilab.integrations.rsl_rl", "rsl_rl")}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module, extra = _WHERE[name]
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as err:
        raise ImportError(f"{name} needs the {extra!r} extra: pip install "
                          f"'lightning-omnilab[{extra}]' ({err})") from err
