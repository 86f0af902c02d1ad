"""BatchEnvPool: every point of its contract against serial MuJoCo and mujoco.batch.Batch."""

from __future__ import annotations

import copy
import threading
import time

import mujoco
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mujoco import batch as mjbatch
from unilab_models import ARM_XML, INTEGRATION, random_ctrl, serial_steps

import lightning_unilab
from lightning_unilab import BatchEnvPool, describe_status
from lightning_unilab.envs.pool import STATUS_ERROR, STATUS_TOO_FAST
from lightning_unilab.envs.vector_env import STATUS_BAD_ACTION, TaskVectorEnv


def started(model: mujoco.MjModel, n: int, threads: int = 2, **kwargs) -> BatchEnvPool:
    pool = BatchEnvPool(model, n, threads, **kwargs)
    pool.reset(keyframe=np.arange(n) % 2)
    pool.ctrl[:] = random_ctrl(model, n)
    return pool


# ---------------------------------------------------------------- 1. construction, threads, GIL


def test_model_from_mjmodel_path_and_string_agree(arm_model, tmp_path):
    path = tmp_path / "arm.xml"
    path.write_text(ARM_XML)
    rows = []
    for source in (arm_model, ARM_XML, path, str(path)):
        pool = BatchEnvPool(source, 4, 1)
        pool.reset(keyframe=0)
        pool.ctrl[:] = random_ctrl(arm_model, 4)
        pool.step(nstep=3)
        rows.append(pool.state.copy())
    for other in rows[1:]:
        np.testing.assert_array_equal(rows[0], other)


def test_default_threads_follow_affinity(arm_model):
    import os

    assert BatchEnvPool(arm_model, 3).num_threads == len(os.sched_getaffinity(0))


def test_gil_is_released_during_step(arm_model):
    """A Python thread keeps ticking while a long step runs in C++ on one thread."""
    pool = started(arm_model, 512, threads=1)
    ticks = 0
    stop = threading.Event()

    def spin() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    thread = threading.Thread(target=spin)
    thread.start()
    time.sleep(0.01)
    start_ticks = ticks
    t0 = time.perf_counter()
    pool.step(nstep=200)
    elapsed = time.perf_counter() - t0
    during = ticks - start_ticks
    stop.set()
    thread.join()
    assert elapsed > 0.05, "the step must be long enough to observe"
    # with the GIL held the spinner could not tick at all until the call returned
    assert during >= 0.25 * elapsed / 0.001, (during, elapsed)


# ---------------------------------------------------------------- 2. state in C++, live views


def test_state_views_are_live_and_zero_copy(arm_model):
    pool = started(arm_model, 5)
    for name in ("qpos", "qvel", "ctrl", "qacc_warmstart", "mocap_pos", "mocap_quat"):
        assert np.shares_memory(pool.field(name), pool.state), name
    pool.qpos[2, 0] = 0.123
    offset, _ = pool.core.state_component(int(mujoco.mjtState.mjSTATE_QPOS))
    assert pool.state[2, offset] == 0.123
    assert pool.time.shape == (5,)
    assert pool.mocap_pos.shape == (5, 1, 3)
    assert pool.xfrc_applied.shape == (5, arm_model.nbody, 6)
    assert pool.state.shape == (5, mujoco.mj_stateSize(arm_model, INTEGRATION))


def test_views_of_absent_parts_are_empty():
    pool = BatchEnvPool('<mujoco><worldbody><body><joint/><geom size=".1"/></body></worldbody>'
                        "</mujoco>", 3, 1)
    assert pool.mocap_pos.shape == (3, 0, 3)
    assert pool.act.shape == (3, 0)
    assert pool.ctrl.shape == (3, 0)


def test_written_ctrl_drives_the_next_step(arm_model):
    pool = started(arm_model, 2)
    pool.ctrl[:] = 0.0
    pool.ctrl[1] = [1.0, -1.0]
    pool.step(nstep=20)
    assert not np.array_equal(pool.qpos[0], pool.qpos[1])


def test_memory_grows_with_state_rows_not_mjdata_per_env(arm_model):
    """20k envs cost about 20k state rows; one mjData per env would cost far more."""
    psutil = pytest.importorskip("psutil", reason="psutil (dev extra) measures resident memory")
    n = 20_000
    row_bytes = mujoco.mj_stateSize(arm_model, INTEGRATION) * 8
    data_bytes = arm_model.narena + arm_model.nbuffer  # what one mjData allocates
    assert data_bytes > 20 * row_bytes  # the test can tell the two apart
    before = psutil.Process().memory_info().rss
    pool = BatchEnvPool(arm_model, n, 2)
    pool.reset(randomization={"body_mass": arm_model.body_mass * 1.1})
    pool.step(nstep=1)
    grown = psutil.Process().memory_info().rss - before
    assert grown < 4 * n * row_bytes + 64 * 2**20, (grown, n * row_bytes, n * data_bytes)


# ---------------------------------------------------------------- 3/4. step and forward


def test_step_matches_serial_loop_and_leaves_others(arm_model):
    pool = started(arm_model, 16)
    before = pool.state.copy()
    ids = np.array([1, 4, 5, 15])
    pool.step(ids, nstep=7)
    for i in range(16):
        expected = serial_steps(arm_model, before[i], 7) if i in ids else before[i]
        np.testing.assert_array_equal(pool.state[i], expected)


def test_outputs_describe_the_final_state(arm_model):
    outputs = {"sensordata": None, "xpos": ["fore", "box"], "xquat": ["box"],
               "site_xpos": ["tip"]}
    pool = started(arm_model, 6, outputs=outputs)
    pool.step(nstep=5)
    data = mujoco.MjData(arm_model)
    for i in range(6):
        mujoco.mj_setState(arm_model, data, pool.state[i], INTEGRATION)
        mujoco.mj_forward(arm_model, data)
        out = pool.outputs
        np.testing.assert_array_equal(out["sensordata"][i, :, 0], data.sensordata)
        np.testing.assert_array_equal(out["xpos"][i], data.xpos[[2, 3]])
        np.testing.assert_array_equal(out["xquat"][i, 0], data.xquat[3])
        np.testing.assert_array_equal(out["site_xpos"][i, 0], data.site_xpos[0])
    assert pool.outputs["xpos"].shape == (6, 2, 3)
    with pytest.raises(ValueError):
        pool.outputs["xpos"][0, 0, 0] = 1.0


def test_named_sensor_rows_and_stage_none_is_one_substep_behind(arm_model):
    pool = started(arm_model, 3, outputs={"sensordata": ["tip_pos"]}, stage="none")
    before = pool.state.copy()
    pool.step(nstep=4)
    data = mujoco.MjData(arm_model)
    mujoco.mj_setState(arm_model, data, before[1], INTEGRATION)
    for _ in range(4):
        mujoco.mj_step(arm_model, data)
    # mj_step semantics: derived values are from the start of the last substep
    np.testing.assert_array_equal(pool.outputs["sensordata"][1, :, 0], data.sensordata[2:5])


def test_forward_computes_outputs_without_advancing(arm_model):
    pool = started(arm_model, 4, outputs={"sensordata": None}, stage="none")
    before = pool.state.copy()
    pool.forward([0, 2])
    np.testing.assert_array_equal(pool.state, before)
    data = mujoco.MjData(arm_model)
    mujoco.mj_setState(arm_model, data, before[2], INTEGRATION)
    mujoco.mj_forward(arm_model, data)
    np.testing.assert_array_equal(pool.outputs["sensordata"][2, :, 0], data.sensordata)
    assert not pool.outputs["sensordata"][1].any()


# ---------------------------------------------------------------- 5. sparse reset, randomization


def test_sparse_reset_leaves_others_bit_identical(arm_model):
    pool = started(arm_model, 10)
    pool.step(nstep=5)
    before = pool.state.copy()
    pool.reset([3, 7], keyframe="up")
    untouched = np.setdiff1d(np.arange(10), [3, 7])
    np.testing.assert_array_equal(pool.state[untouched], before[untouched])
    data = mujoco.MjData(arm_model)
    mujoco.mj_resetDataKeyframe(arm_model, data, 1)
    row = np.empty(pool.state_size)
    mujoco.mj_getState(arm_model, data, row, INTEGRATION)
    np.testing.assert_array_equal(pool.state[3], row)


def test_reset_to_defaults_and_to_given_states(arm_model):
    pool = started(arm_model, 4)
    pool.reset([1])
    data = mujoco.MjData(arm_model)
    row = np.empty(pool.state_size)
    mujoco.mj_getState(arm_model, data, row, INTEGRATION)
    np.testing.assert_array_equal(pool.state[1], row)
    rows = np.stack([row + 0.01, row + 0.02])
    pool.reset([0, 3], initial_state=rows)
    np.testing.assert_array_equal(pool.state[[0, 3]], rows)


def reference_model(model: mujoco.MjModel, **fields) -> mujoco.MjModel:
    """The slow path the pool must equal: a whole model copy, patched, mj_setConst."""
    patched = copy.copy(model)
    for name, value in fields.items():
        if name == "gravity":
            patched.opt.gravity[:] = value
        else:
            getattr(patched, name)[...] = value
    mujoco.mj_setConst(patched, mujoco.MjData(patched))
    return patched


def test_randomized_reset_equals_a_patched_model_copy(arm_model):
    m = arm_model
    pool = started(m, 6)
    mass = m.body_mass * np.array([1, 1.5, 0.7, 2.0, 1])
    ipos_shift = np.array([[0, 0, 0], [0.01, 0, 0], [0, 0.01, 0.01], [0, 0, 0], [0, 0, 0]])
    rand = {
        "body_mass": mass,
        "body_ipos": m.body_ipos + ipos_shift,
        "geom_friction": m.geom_friction * 0.5,
        "dof_damping": m.dof_damping + 0.3,
        "dof_armature": m.dof_armature + 0.01,
        "actuator_kp": [30.0, 5.0],
        "actuator_kd": [2.0, 0.1],
        "opt.gravity": [0.5, 0.0, -7.0],
    }
    before = pool.state.copy()
    pool.reset([2], keyframe=0, randomization=rand)
    pool.ctrl[:] = random_ctrl(m, 6, seed=1)
    after_reset = pool.state.copy()
    pool.step(nstep=25)

    gain = m.actuator_gainprm.copy()
    bias = m.actuator_biasprm.copy()
    gain[:, 0] = [30.0, 5.0]
    bias[:, 1] = [-30.0, -5.0]
    bias[:, 2] = [-2.0, -0.1]
    ref = reference_model(
        m, body_mass=mass, body_ipos=m.body_ipos + ipos_shift, geom_friction=m.geom_friction * 0.5,
        dof_damping=m.dof_damping + 0.3, dof_armature=m.dof_armature + 0.01,
        actuator_gainprm=gain, actuator_biasprm=bias, gravity=[0.5, 0.0, -7.0],
    )
    np.testing.assert_array_equal(pool.state[2], serial_steps(ref, after_reset[2], 25))
    # the derived constants were refreshed for env 2 only
    np.testing.assert_array_equal(pool.model_field("body_subtreemass")[2], ref.body_subtreemass)
    np.testing.assert_array_equal(pool.model_field("dof_invweight0")[2], ref.dof_invweight0)
    np.testing.assert_array_equal(pool.model_field("body_subtreemass")[0], m.body_subtreemass)
    # an env that was not reset ran on the original model, from its own state
    np.testing.assert_array_equal(pool.state[1], serial_steps(m, after_reset[1], 25))
    assert not np.array_equal(before[1], pool.state[1])
    np.testing.assert_array_equal(pool.model_field("actuator_gainprm")[[0, 2], 0, 0], [20, 30])


def test_randomization_persists_and_can_be_replaced(arm_model):
    pool = started(arm_model, 3)
    pool.reset([1], randomization={"body_mass": arm_model.body_mass * 2})
    pool.reset([1])  # a plain reset keeps the env's model
    assert pool.model_field("body_mass")[1, 1] == 2 * arm_model.body_mass[1]
    pool.reset([1], randomization={"body_mass": arm_model.body_mass})
    np.testing.assert_array_equal(pool.model_field("body_mass")[1], arm_model.body_mass)


# ---------------------------------------------------------------- 6. determinism


def test_bit_identical_for_any_thread_count_and_equal_to_batch(arm_model):
    n = 37
    results = []
    for threads in (1, 2, 3, 5):
        pool = started(arm_model, n, threads)
        for k in (1, 3, 8):
            pool.step(nstep=k)
        results.append(pool.state.copy())
    for other in results[1:]:
        np.testing.assert_array_equal(results[0], other)
    batch = mjbatch.Batch(arm_model, n, 2)
    batch.reset(keyframe=np.arange(n) % 2)
    batch.bind("ctrl")[:] = random_ctrl(arm_model, n)
    for k in (1, 3, 8):
        batch.step(nstep=k)
    np.testing.assert_array_equal(results[0], batch.state)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mask=st.lists(st.booleans(), min_size=9, max_size=9), nstep=st.integers(1, 6),
       threads=st.integers(1, 4))
def test_any_subset_matches_a_python_loop(arm_model, mask, nstep, threads):
    pool = started(arm_model, 9, threads)
    before = pool.state.copy()
    pool.step(np.array(mask), nstep=nstep)
    for i in range(9):
        expected = serial_steps(arm_model, before[i], nstep) if mask[i] else before[i]
        np.testing.assert_array_equal(pool.state[i], expected)


# ---------------------------------------------------------------- 7. errors and instability


@pytest.mark.parametrize(
    ("ids", "error", "match"),
    [
        ([3, 3], ValueError, "duplicate 3"),
        ([4, 2], ValueError, "unsorted 4"),
        ([0, 8], IndexError, r"\[0, 8\), got 8"),
        ([-1], IndexError, "got -1"),
        ([[1, 2]], ValueError, "1-D"),
        ([0.5], TypeError, "float"),
        (np.ones(7, bool), ValueError, r"shape \(8,\)"),
    ],
)
def test_bad_ids_name_the_argument(arm_model, ids, error, match):
    pool = BatchEnvPool(arm_model, 8, 1)
    with pytest.raises(error, match=match) as info:
        pool.step(ids)
    assert "ids" in str(info.value)


def test_bad_arguments_are_explained(arm_model):
    pool = BatchEnvPool(arm_model, 4, 1)
    with pytest.raises(ValueError, match="nstep"):
        pool.step(nstep=0)
    with pytest.raises(ValueError, match="stage"):
        pool.step(stage="fast")
    with pytest.raises(ValueError, match=r"initial_state: expected shape \(2, \d+\)"):
        pool.reset([0, 1], initial_state=np.zeros((3, pool.state_size)))
    with pytest.raises(ValueError, match="initial_state: contains NaN"):
        pool.reset([0], initial_state=np.full(pool.state_size, np.nan))
    with pytest.raises(TypeError, match="initial_state: expected real numbers"):
        pool.reset([0], initial_state=np.array(["a"] * pool.state_size))
    with pytest.raises(IndexError, match=r"keyframe: .*\[0, 2\), got 5"):
        pool.reset(keyframe=5)
    with pytest.raises(ValueError, match="no keyframe 'upp'.*did you mean 'up'"):
        pool.reset(keyframe="upp")
    with pytest.raises(ValueError, match="not a per-env model field.*did you mean 'body_mass'"):
        pool.reset(randomization={"body_mas": 1.0})
    with pytest.raises(ValueError, match=r"randomization\['body_mass'\]: expected shape"):
        pool.reset([0, 1], randomization={"body_mass": np.ones((3, arm_model.nbody))})
    with pytest.raises(ValueError, match=r"body_mass'\]: expected values >= 0"):
        pool.reset(randomization={"body_mass": -arm_model.body_mass})
    with pytest.raises(ValueError, match="structure"):
        pool.reset(randomization={"body_parentid": 0})
    with pytest.raises(ValueError, match="'foo' is not an mjData array.*"):
        BatchEnvPool(arm_model, 2, outputs={"foo": None})
    with pytest.raises(ValueError, match="no body named 'bx'.*did you mean 'box'"):
        BatchEnvPool(arm_model, 2, outputs={"xpos": ["bx"]})
    with pytest.raises(ValueError, match=r"part of the state: use pool.field\('qpos'\)"):
        BatchEnvPool(arm_model, 2, outputs={"qpos": None})
    with pytest.raises(ValueError, match="num_envs: expected an int >= 1.*got 0"):
        BatchEnvPool(arm_model, 0)
    with pytest.raises(ValueError, match="num_threads"):
        BatchEnvPool(arm_model, 2, num_threads=-1)
    with pytest.raises(ValueError, match="name: expected a state field.*did you mean 'qvel'"):
        pool.field("qvell")


def test_a_failed_randomization_changes_nothing(arm_model):
    pool = started(arm_model, 3)
    with pytest.raises(ValueError):
        pool.reset([0], randomization={"body_mass": arm_model.body_mass * 2, "dof_damping": -1})
    np.testing.assert_array_equal(pool.model_field("body_mass")[0], arm_model.body_mass)


def test_a_patch_mujoco_rejects_raises_and_is_undone(arm_model):
    """The free box is compiled as a simple body: moving its inertial frame is refused."""
    pool = started(arm_model, 3)
    ipos = arm_model.body_ipos.copy()
    ipos[3] += 0.02
    with pytest.raises(ValueError, match="env 1: .*simple"):
        pool.reset([1, 2], randomization={"body_ipos": ipos, "body_mass": 2 * arm_model.body_mass})
    np.testing.assert_array_equal(pool.model_field("body_ipos")[1], arm_model.body_ipos)
    np.testing.assert_array_equal(pool.model_field("body_mass")[2], arm_model.body_mass)
    assert not pool.status.any()


def test_kp_needs_position_actuators():
    motor = mujoco.MjModel.from_xml_string(
        '<mujoco><worldbody><body><joint name="j"/><geom size=".1"/></body></worldbody>'
        '<actuator><motor name="m" joint="j"/></actuator></mujoco>'
    )
    with pytest.raises(ValueError, match="actuator 'm' is not one"):
        BatchEnvPool(motor, 2).reset(randomization={"actuator_kp": 1.0})


def test_xml_errors_name_the_model_argument(tmp_path):
    with pytest.raises(ValueError, match="model: the MJCF string does not load.*unrecognized"):
        BatchEnvPool("<mujoco><worldbody><bogus/></worldbody></mujoco>", 2)
    with pytest.raises(FileNotFoundError, match="model: no MJCF file"):
        BatchEnvPool(tmp_path / "missing.xml", 2)
    with pytest.raises(TypeError, match="model: expected a mujoco.MjModel"):
        BatchEnvPool(42, 2)


@pytest.mark.parametrize("poison", ["ctrl_nan", "qvel_huge", "qfrc_huge"])
def test_unstable_env_is_flagged_and_others_finish(arm_model, poison):
    pool = started(arm_model, 6, outputs={"sensordata": None})
    reference = started(arm_model, 6)
    if poison == "ctrl_nan":
        pool.ctrl[4] = np.nan
    elif poison == "qvel_huge":
        pool.qvel[4] = 1e40
    else:
        pool.qfrc_applied[4] = 1e300
    before = pool.state[4].copy()
    pool.step(nstep=10)
    reference.step(nstep=10)
    assert pool.status[4] != 0 and not pool.status[[0, 1, 2, 3, 5]].any()
    assert list(pool.unstable()) == [4]
    assert describe_status(int(pool.status[4]))
    # the unstable env kept its state from before the call; the others are exactly unaffected
    np.testing.assert_array_equal(pool.state[4], before)
    others = [0, 1, 2, 3, 5]
    np.testing.assert_array_equal(pool.state[others], reference.state[others])
    assert np.isfinite(pool.outputs["sensordata"]).all()
    # the flag stays until the env is reset
    pool.step([0], nstep=1)
    assert pool.status[4] != 0
    pool.reset([4], keyframe=0)
    assert pool.status[4] == 0
    assert pool.error(4) == ""


def test_status_bits_decode():
    warn = int(mujoco.mjtWarning.mjWARN_BADQACC)
    assert describe_status((1 << warn) | STATUS_ERROR) == ["mjWARN_BADQACC", "error"]
    assert describe_status(STATUS_TOO_FAST | STATUS_BAD_ACTION) == ["too_fast", "bad_action"]


def _substep_speeds(model: mujoco.MjModel, row: np.ndarray, nstep: int) -> np.ndarray:
    """max |qvel| after each of nstep plain mj_step calls from a state row."""
    data = mujoco.MjData(model)
    mujoco.mj_setState(model, data, row, INTEGRATION)
    speeds = []
    for _ in range(nstep):
        mujoco.mj_step(model, data)
        speeds.append(np.abs(data.qvel).max())
    return np.array(speeds)


def test_speed_bound_rolls_back_a_finite_blow_up_after_any_substep(arm_model):
    """max_speed catches a finite blow-up that no MuJoCo warning sees, after any substep."""
    pool = started(arm_model, 4)
    pool.qvel[2] = 50.0  # finite, far below MuJoCo's bound of 1e10: no warning
    rows = pool.state.copy()
    speeds = {env: _substep_speeds(arm_model, rows[env], 5) for env in range(4)}
    peak = speeds[2].max()
    assert speeds[2][-1] < peak and all(speeds[e].max() < peak / 2 for e in (0, 1, 3))
    # above the peak, at 0 (off), and between the last substep's speed and the peak
    for bound, flagged in ((peak * 1.001, False), (0.0, False), ((speeds[2][-1] + peak) / 2, True)):
        pool.reset(initial_state=rows)
        pool.step(nstep=5, max_speed=bound)
        assert list(pool.status) == [0, 0, STATUS_TOO_FAST if flagged else 0, 0], bound
        for env in range(4):
            want = rows[env] if flagged and env == 2 else serial_steps(arm_model, rows[env], 5)
            np.testing.assert_array_equal(pool.state[env], want)
    with pytest.raises(ValueError, match="max_speed: expected a number >= 0"):
        pool.step(max_speed=-1.0)


# ---------------------------------------------------------------- 8. Python face


def test_close_and_context_manager(arm_model):
    with BatchEnvPool(arm_model, 3, 1) as pool:
        qpos = pool.qpos
        assert "num_envs=3" in repr(pool)
    assert repr(pool) == "BatchEnvPool(closed)"
    with pytest.raises(RuntimeError, match="closed"):
        pool.step()
    qpos[0, 0] = 1.0  # a view handed out before close keeps its memory alive
    assert pool.model.nq == arm_model.nq


def test_version_mismatch_raises_import_error_naming_both(monkeypatch):
    monkeypatch.setattr(lightning_unilab._core, "mujoco_build_version", lambda: 3003000)
    with pytest.raises(ImportError, match=r"built for MuJoCo 3003000 but MuJoCo \[4000000\]"):
        lightning_unilab._check_mujoco_version()


MESH_XML = """<mujoco><asset><mesh name="tet" vertex="0 0 0  1 0 0  0 1 0  0 0 1"/></asset>
<worldbody><body name="a"><freejoint/><geom type="mesh" mesh="tet"/>
<geom name="s" size=".1" pos="1 1 1"/></body>
<body name="b" pos="2 0 0"><freejoint/><geom size=".2"/></body></worldbody></mujoco>"""


def test_model_field_reads_the_simulated_model():
    model = mujoco.MjModel.from_xml_string(MESH_XML)
    pool = BatchEnvPool(model, 4, 1)
    original = model.body_mass.copy()
    model.body_mass[1] = 99.0  # the caller edits its model after construction
    np.testing.assert_array_equal(pool.model_field("body_mass")[2], original)
    # geom sizes move the bodies' bounding volumes: mj_setConst expands them, bodies' rows only
    pool.reset(randomization={"geom_size": pool.model_field("geom_size")[0] * 1.5})
    aabb = pool.model_field("bvh_aabb")
    assert aabb.shape[0] == 4 and aabb.shape[2] == 6 and aabb.shape[1] <= model.nbvh
    assert np.isfinite(aabb).all()


def test_unclear_inputs_get_clear_errors(arm_model):
    with pytest.raises(TypeError, match=r"outputs: expected a mapping .* got list"):
        BatchEnvPool(arm_model, 2, outputs=["xpos"])
    with pytest.raises(ValueError, match="num_envs"):
        BatchEnvPool(arm_model, True)
    with pytest.raises(ValueError, match=r"num_envs: expected an int >= 1 and below 2147483648"):
        BatchEnvPool(arm_model, 2**31)
    sleepy = ARM_XML.replace('<option timestep="0.004"/>',
                             '<option timestep="0.004"><flag sleep="enable"/></option>')
    with pytest.raises(ValueError, match="model: sleeping bodies"):
        BatchEnvPool(sleepy, 2)
    pool = BatchEnvPool(arm_model, 2, 1)
    with pytest.raises(TypeError, match=r"randomization: expected a mapping .* got list"):
        pool.reset(randomization=[("body_mass", 1.0)])
    with pytest.raises(ValueError, match=r"name: 'body_mas' is not a per-env model field"):
        pool.model_field("body_mas")
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.step()
    env = TaskVectorEnv("Hopper-v5", 2, 1)
    env.reset(seed=0)
    state = env.pool.state.copy()
    with pytest.raises(ValueError, match="seed: expected an int >= 0, got -1"):
        env.reset(seed=-1)
    np.testing.assert_array_equal(env.pool.state, state)
    np.testing.assert_array_equal(env.reset(seed=0)[0], TaskVectorEnv("Hopper-v5", 2, 1).reset(
        seed=0)[0])  # the failed call re-seeded nothing
    with pytest.raises(TypeError, match=r"params\['healthy_reward'\]: expected a number"):
        TaskVectorEnv("Hopper-v5", 2, params={"healthy_reward": "1"})
    with pytest.raises(TypeError, match="randomization: expected a function"):
        TaskVectorEnv("Hopper-v5", 2, randomization={"body_mass": 1.0})
    env.close()
    for call in (lambda: env.step(np.zeros((2, 3))), lambda: env.reset()):
        with pytest.raises(RuntimeError, match="TaskVectorEnv of 'Hopper-v5' is closed"):
            call()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("xml", [ARM_XML, MESH_XML], ids=["arm", "mesh"])
def test_parallel_set_const_equals_batch(xml, threads):
    """The pool's mj_setConst runs on its threads; every derived constant equals what
    mujoco.batch.Batch.set_const computes, env by env, and the others keep theirs."""
    model = mujoco.MjModel.from_xml_string(xml)
    n, ids = 6, np.array([1, 2, 4], np.int32)
    rng = np.random.default_rng(0)
    rand = {"body_mass": model.body_mass * rng.uniform(0.5, 1.5, (3, model.nbody)),
            "geom_size": model.geom_size * rng.uniform(0.8, 1.2, (3, model.ngeom, 1)),
            "dof_armature": model.dof_armature + rng.uniform(0, 0.01, (3, model.nv)),
            "opt.gravity": [[0, 0, -9.0], [0, 0, -10.0], [0.1, 0, -9.8]]}
    pool = BatchEnvPool(model, n, threads)
    pool.reset(ids, randomization=rand)
    batch = mjbatch.Batch(model, n, 1)
    for name, values in rand.items():
        batch.expand(name)[ids] = values
    batch.set_const(ids)
    for name in mujoco.MjModel._setconst_outputs:
        if name not in mjbatch.MODEL_FIELDS:
            continue
        expected = batch.expanded(name)
        got = pool.model_field(name)
        if expected is None:
            expected = np.broadcast_to(getattr(model, name), got.shape)
        np.testing.assert_array_equal(got, expected, err_msg=name)


def test_a_pool_too_large_for_the_machine_is_refused_at_once_by_name():
    """Refused from MjData's fixed buffer per env before any env is built; the sizes the
    recipes and benchmarks use (G1 with 4,096 envs: about 3.5 GB) still pass the check."""
    import time

    from lightning_unilab.envs import tasks
    from lightning_unilab.envs.pool import _check_fits

    model = tasks.get("InvertedPendulum-v5").load_model()
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"num_envs: 2000000000 envs need at least"):
        BatchEnvPool(model, 2 * 10**9, 1)
    assert time.perf_counter() - t0 < 5.0
    _check_fits(tasks.get("g1-walk-flat").load_model(), 4096)  # does not raise
