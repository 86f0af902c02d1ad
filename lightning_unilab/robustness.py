"""Robustness of a velocity-command policy: many start seeds under scheduled disturbances.

One 20 s evaluation says little about what a walking policy survives. Here each condition runs
``episodes`` envs side by side (start-state seeds ``seed`` .. ``seed + episodes - 1``), each to
its first fall or the episode's end, and counts falls and tracking errors:

- ``nominal``: the evaluation's commands (drawn every command period), no pushes;
- ``pushes``: the same with one push per command period: the base's planar velocity changed by
  ``push`` m/s in a drawn direction at a drawn step (the task's own push);
- ``reversals``: the forward command alternating ``+reversal`` and ``-reversal`` m/s at every
  command period (half the envs start backward), lateral and yaw commands 0: each change is a
  step of ``2 x reversal``;
- ``pushes+reversals``: both.

The task's own pushes need its ``push_low``/``push_high`` parameters; a scheduled command needs
its evaluation hooks to set one (:meth:`TaskEvaluation.set_command`). A fall is a termination
before the episode's end; a truncation by the time limit is not.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lightning_omnilab.validate import positive_int, require
from lightning_unilab.envs.tasks.evaluation import evaluation_of
from lightning_unilab.envs.tasks.ref import task_label

__all__ = ["CONDITIONS", "Condition", "evaluate_robustness"]


@dataclass(frozen=True)
class Condition:
    """One disturbance schedule: pushes on or off, the forward command reversing or drawn."""

    name: str
    pushes: bool
    reversals: bool


VELOCITY_TERMS = ("vx", "vx_command", "vy", "vy_command", "yaw_rate", "yaw_rate_command")
CONDITIONS = (Condition("nominal", False, False), Condition("pushes", True, False),
              Condition("reversals", False, True), Condition("pushes+reversals", True, True))


def evaluate_robustness(policy: torch.nn.Module, task: Any,
                        task_kwargs: Mapping[str, Any] | None = None, *, episodes: int = 50,
                        seed: int = 0, max_steps: int = 1000, period_steps: int = 250,
                        push: float = 0.5, reversal: float = 0.7,
                        conditions: tuple[Condition, ...] = CONDITIONS) -> dict[str, Any]:
    """Run every condition on ``episodes`` envs for up to ``max_steps`` control steps, the
    command period ``period_steps``; the summary per condition (falls, when, tracking errors)
    and per env. ``task_kwargs`` as :func:`~lightning_unilab.evaluate.run_episode` takes them
    (the evaluation's: no randomization, pushes off)."""
    episodes = positive_int("episodes", episodes)
    max_steps = positive_int("max_steps", max_steps)
    period_steps = positive_int("period_steps", period_steps)
    require(np.isfinite(push) and push > 0, "push", "a positive speed (m/s)", push)
    require(np.isfinite(reversal) and reversal > 0, "reversal", "a positive speed (m/s)",
            reversal)
    missing = sorted(set(VELOCITY_TERMS) - set(evaluation_of(task).info_names))
    require(not missing, "task", "a task whose evaluation reads its velocities and commands "
            "(VelocityTracking)", f"{task_label(task)!r} without {missing}")
    policy = copy.deepcopy(policy).cpu().float().eval()
    rows = []
    for condition in conditions:
        params = {**dict((task_kwargs or {}).get("params") or {}),
                  "resample_steps": period_steps,
                  "push_low": push if condition.pushes else 0.0,
                  "push_high": push if condition.pushes else 0.0}
        kwargs = {**dict(task_kwargs or {}), "params": params}
        rows.append(_run(policy, task, kwargs, condition, episodes, seed, max_steps,
                         period_steps, reversal))
    return {"episodes": episodes, "seed": seed, "max_steps": max_steps,
            "period_steps": period_steps, "push_mps": push, "reversal_mps": reversal,
            "conditions": rows}


def _run(policy: torch.nn.Module, task: Any, kwargs: dict[str, Any], condition: Condition,
         episodes: int, seed: int, max_steps: int, period_steps: int,
         reversal: float) -> dict[str, Any]:
    from lightning_unilab.envs.vector_env import TaskVectorEnv

    evaluation = evaluation_of(task)
    env = TaskVectorEnv(task, episodes, 1, seed=seed, **kwargs)
    try:
        obs, _ = env.reset(seed=seed)
        sign = np.where(np.arange(episodes) % 2 == 0, 1.0, -1.0)  # half start backward

        def command() -> None:
            cmd = np.zeros((episodes, 3))
            cmd[:, 0] = sign * reversal
            require(evaluation.set_command(env, obs, cmd), "task",
                    "a task whose evaluation sets its velocity command (reversals)", env.name)

        if condition.reversals:
            command()
        alive = np.ones(episodes, bool)
        unstable = 0  # episodes the pool rolled back and truncated (a diverging simulation)
        fell_at = np.full(episodes, -1)
        lin_sum, yaw_sum, steps = np.zeros(episodes), np.zeros(episodes), np.zeros(episodes)
        with torch.no_grad():
            for k in range(max_steps):
                action = policy.act(torch.as_tensor(obs, dtype=torch.float32),
                                    deterministic=True)[0]
                obs, _, term, trunc, info = env.step(action.numpy().astype(np.float64))
                lin = np.hypot(info["vx"] - info["vx_command"], info["vy"] - info["vy_command"])
                yaw = np.abs(info["yaw_rate"] - info["yaw_rate_command"])
                lin_sum[alive] += lin[alive]
                yaw_sum[alive] += yaw[alive]
                steps[alive] += 1
                fell = alive & term
                fell_at[fell] = k + 1
                unstable += int((alive & trunc & (info["status"] != 0)).sum())
                alive &= ~(term | trunc)
                if not alive.any():
                    break
                if condition.reversals and (k + 1) % period_steps == 0 and k + 1 < max_steps:
                    sign = -sign
                    command()
    finally:
        env.close()
    lin_mean = lin_sum / np.maximum(steps, 1)
    yaw_mean = yaw_sum / np.maximum(steps, 1)
    falls = int((fell_at > 0).sum())
    return {"condition": condition.name, "falls": falls, "episodes": episodes,
            "unstable": unstable,
            "fall_steps": sorted(int(s) for s in fell_at if s > 0),
            "lin_vel_error_mps": {"median": float(np.median(lin_mean)),
                                  "max": float(lin_mean.max())},
            "yaw_rate_error_radps": {"median": float(np.median(yaw_mean)),
                                     "max": float(yaw_mean.max())},
            "rows": [{"seed": seed + i, "fell_at_step": int(fell_at[i]) if fell_at[i] > 0
                      else None, "lin_vel_error_mps": float(lin_mean[i]),
                      "yaw_rate_error_radps": float(yaw_mean[i])} for i in range(episodes)]}


def table(summary: Mapping[str, Any]) -> str:
    """The summary as a Markdown table: one line per condition."""
    lines = ["| condition | falls | linear error (m/s), median / max | yaw error (rad/s), "
             "median / max |", "|---|---|---|---|"]
    for r in summary["conditions"]:
        lines.append(f"| {r['condition']} | {r['falls']} of {r['episodes']} | "
                     f"{r['lin_vel_error_mps']['median']:.3f} / "
                     f"{r['lin_vel_error_mps']['max']:.3f} | "
                     f"{r['yaw_rate_error_radps']['median']:.3f} / "
                     f"{r['yaw_rate_error_radps']['max']:.3f} |")
    return "\n".join(lines)
