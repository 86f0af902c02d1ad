"""The robustness evaluation (lightning_unilab.robustness): a command set from outside reaches
the task and the policy's observation; the schedule reverses it every command period; pushes
and falls are counted per condition."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_unilab.envs.tasks.evaluation import evaluation_of
from lightning_unilab.envs.vector_env import TaskVectorEnv
from lightning_unilab.learner.policy import ActorCritic
from lightning_unilab.robustness import CONDITIONS, Condition, evaluate_robustness, table


def test_a_command_set_from_outside_is_the_one_the_task_follows_and_observes() -> None:
    env = TaskVectorEnv("g1-walk-flat", 3, 1, seed=0)
    try:
        obs, _ = env.reset(seed=0)
        command = np.array([[0.7, 0.0, 0.0], [-0.7, 0.2, 0.0], [0.1, 0.0, -0.5]])
        before = obs.copy()
        assert evaluation_of("g1-walk-flat").set_command(env, obs, command)
        changed = np.flatnonzero((obs != before).any(axis=0))
        assert set(changed) <= {93, 94, 95}  # the command's three entries, nothing else
        _, _, _, _, info = env.step(np.zeros((3, env.spec.action_size)))
        followed = np.stack([info["vx_command"], info["vy_command"], info["yaw_rate_command"]], 1)
        np.testing.assert_array_equal(followed, command)
        after, *_ = env.step(np.zeros((3, env.spec.action_size)))
        np.testing.assert_array_equal(after[:, 93:96], command)  # the task's own observation
    finally:
        env.close()


def test_a_task_without_a_command_is_refused_by_name() -> None:
    assert not evaluation_of("Hopper-v5").set_command(None, np.zeros((1, 1)), np.zeros((1, 3)))
    policy = ActorCritic(11, 11, 3, (8,), (8,))
    with pytest.raises(ValueError, match="task: expected a task whose evaluation reads"):
        evaluate_robustness(policy, "Hopper-v5", episodes=2, max_steps=3)


def test_every_condition_runs_and_reversals_alternate(monkeypatch) -> None:
    torch.manual_seed(0)
    policy = ActorCritic(98, 106, 29, (16,), (16,))
    seen = []
    g1 = evaluation_of("g1-walk-flat")
    real = type(g1).set_command

    def spy(self, env, obs, command):
        seen.append(command[:, 0].copy())
        return real(self, env, obs, command)

    monkeypatch.setattr(type(g1), "set_command", spy)
    summary = evaluate_robustness(policy, "g1-walk-flat", episodes=4, max_steps=12,
                                  period_steps=4, push=0.5, reversal=0.65)
    assert [r["condition"] for r in summary["conditions"]] == [c.name for c in CONDITIONS]
    # two conditions reverse: at the start and after steps 4 and 8 (12 steps: nobody falls
    # that soon), half the envs starting backward
    first = np.array([0.65, -0.65, 0.65, -0.65])
    expected = [first, -first, first] * 2
    assert len(seen) == len(expected)
    for got, want in zip(seen, expected, strict=True):
        np.testing.assert_array_equal(got, want)
    for r in summary["conditions"]:
        assert 0 <= r["falls"] <= 4 and len(r["rows"]) == 4
        assert r["falls"] == sum(row["fell_at_step"] is not None for row in r["rows"])
        assert r["lin_vel_error_mps"]["max"] >= r["lin_vel_error_mps"]["median"] >= 0
    assert "| pushes+reversals |" in table(summary)


def test_pushes_move_the_standing_robot() -> None:
    """With pushes, a policy that holds the home pose is shoved: its base speed departs from the
    undisturbed run's; a push-free condition leaves it as it was."""

    class Still(torch.nn.Module):
        def act(self, obs, deterministic=True):
            return (torch.zeros(len(obs), 29),)

    still = Still()
    out = evaluate_robustness(still, "g1-walk-flat", episodes=4, max_steps=20, period_steps=10,
                              conditions=(Condition("nominal", False, False),
                                          Condition("pushes", True, False)))
    nominal, pushed = out["conditions"]
    assert [r["lin_vel_error_mps"] for r in nominal["rows"]] != \
        [r["lin_vel_error_mps"] for r in pushed["rows"]]
