"""g1-motion-tracking against UniLab 1.5.2's G1MotionTracking: same clip, same machine, in turn.

UniLab's APPO (its ``mujoco`` backend, on CPU, its defaults but the clip and the env count)
trains alone for the longest wall-time budget, keeping its policy at each shorter one, then our
recipe the same way; each kept policy is evaluated on the same metric, BeyondMimic's
``error_body_pos`` (the mean over the 14 tracked bodies of the distance to the reference,
re-anchored to the robot's torso in the plane and heading), from 5 start frames spread over the
clip with no start noise, each episode to the clip's end or a fall.
docs/unilab/tracking_vs_unilab.md describes the set-up and the numbers.

    python benchmarks/tracking_vs_unilab.py --minutes 15 60 --envs 256 --out build/t.json
    python benchmarks/tracking_vs_unilab.py --quick   # 0.5- and 1-minute budgets: a smoke test

Run with the project's venv. UniLab lives in its own venv (build/unilab-venv, made here when
absent); the private modes ``_unilab_train`` and ``_unilab_eval`` run inside it, so this
module imports only the standard library at the top.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import struct
import subprocess
import sys
import time
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / "build" / "unilab-venv"
VPY = VENV / "bin" / "python"
WORK = ROOT / "build" / "unilab-bench"
CLIP = ROOT / "lightning_unilab" / "motions" / "clips" / "g1_dance.npz"
RECIPE = ROOT / "recipes" / "unilab" / "g1_motion_tracking.yaml"
TASK = "g1-motion-tracking"
TORCH, UNILAB, UNILAB_RL, MJLAB = "2.13.0", "1.5.2", "1.4.15", "1.6.0"
MESH_PREFIX = "mjlab/asset_zoo/robots/unitree_g1/xmls/assets/"
STARTS = 5  # evaluation start frames, spread over the clip


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(cmd: Sequence[str | os.PathLike[str]], *, cwd: Path = ROOT,
        env: dict[str, str] | None = None, out: Path | None = None) -> None:
    """Run cmd (logged), its output to out if given; raise on a non-zero status."""
    args = [str(c) for c in cmd]
    log("$ " + shlex.join(args) + (f"  > {out}" if out else ""))
    if out is None:
        subprocess.run(args, cwd=cwd, env=env, check=True)
        return
    with open(out, "w") as f:
        code = subprocess.run(args, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    if code:
        tail = out.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"exit {code}: {shlex.join(args)}\n{tail}")


def vpy(code: str) -> str:
    """stdout of a Python snippet in UniLab's venv."""
    return subprocess.run([str(VPY), "-c", code], check=True, capture_output=True,
                          text=True).stdout.strip()


# ----------------------------------------------------------------------------- UniLab's venv

def png_1x1() -> bytes:
    """A grey 1x1 PNG (the floor texture UniLab's asset check asks for; the scene never uses it)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))
    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(b"\x00\x80\x80\x80")) + chunk(b"IEND", b""))


def unilab_assets() -> Path:
    """UniLab's asset root (its package's assets/: it has no setting for another place)."""
    return Path(vpy("import importlib.util as u; "
                    "print(u.find_spec('unilab').submodule_search_locations[0])")) / "assets"


def setup_unilab() -> None:
    """Make build/unilab-venv when absent: torch first (the local CPU wheel), then UniLab with
    its mujoco extra; the G1 meshes it would fetch from Hugging Face come from mjlab's wheel."""
    ready = VENV / ".bench-ready"
    if ready.exists():
        return
    WORK.mkdir(parents=True, exist_ok=True)
    pip = VENV / "bin" / "pip"
    if not VPY.exists():
        run(["python3", "-m", "venv", VENV])
    constraints = WORK / "constraints.txt"
    constraints.write_text(f"torch=={TORCH}\n")
    run([pip, "install", f"torch=={TORCH}"])
    run([pip, "install", "-c", constraints, f"unilab[mujoco]=={UNILAB}", f"unilab-rl=={UNILAB_RL}"])
    wheels = WORK / "wheels"
    run([pip, "download", "--no-deps", "-d", wheels, f"mjlab=={MJLAB}"])
    g1 = unilab_assets() / "robots" / "g1"
    (g1 / "assets").mkdir(parents=True, exist_ok=True)
    (g1 / "textures").mkdir(parents=True, exist_ok=True)
    wheel = next(wheels.glob(f"mjlab-{MJLAB}-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        meshes = [n for n in z.namelist() if n.startswith(MESH_PREFIX) and n.endswith(".STL")]
        for name in meshes:
            (g1 / "assets" / name[len(MESH_PREFIX):]).write_bytes(z.read(name))
    (g1 / "textures" / "floor.png").write_bytes(png_1x1())
    log(f"copied {len(meshes)} G1 meshes of mjlab {MJLAB} into {g1 / 'assets'}")
    ready.write_text(time.strftime("%Y-%m-%d %H:%M:%S\n"))


# ----------------------------------------------------------------------------- the clip

def convert_clip(clip: Path) -> dict[str, Any]:
    """Our clip as UniLab reads it: every body of its G1 in its MuJoCo body order, world row 0.

    UniLab indexes the npz's body axis by MuJoCo body id (world = 0), so its file needs all 31
    rows. Our csv (root pose and joints) goes through our converter with UniLab's own MJCF as the
    model (forward kinematics; our MuJoCo 4 loads it), then a world row is put first."""
    import mujoco
    import numpy as np

    from lightning_unilab.envs.tasks import load_model
    from lightning_unilab.motions import load_clip, model_joint_names

    xml = unilab_assets() / "robots" / "g1" / "scene_flat.xml"
    csv, fk = WORK / f"{clip.stem}.csv", WORK / f"{clip.stem}_fk.npz"
    out = WORK / f"{clip.stem}_unilab.npz"
    ours = load_clip(clip, load_model(TASK))
    theirs_joints = model_joint_names(mujoco.MjModel.from_xml_path(str(xml)))
    if tuple(ours.joint_names) != tuple(theirs_joints):
        raise ValueError(f"joint order differs: ours {ours.joint_names}, UniLab {theirs_joints}")
    py = [sys.executable, "-m", "lightning_unilab.motions"]
    run([*py, "npz2csv", "--model", TASK, clip, csv])
    run([*py, "csv2npz", "--model", xml, csv, fk, "--fps", repr(float(ours.fps))])
    d = dict(np.load(fk))
    frames = d["joint_pos"].shape[0]

    def first(x: np.ndarray, row: Sequence[float]) -> np.ndarray:
        world = np.broadcast_to(np.asarray(row, float), (frames, 1, len(row)))
        return np.concatenate([world, x], 1)

    arrays = {"fps": d["fps"], "joint_pos": d["joint_pos"], "joint_vel": d["joint_vel"],
              "body_pos_w": first(d["body_pos_w"], (0, 0, 0)),
              "body_quat_w": first(d["body_quat_w"], (1, 0, 0, 0)),
              "body_lin_vel_w": first(d["body_lin_vel_w"], (0, 0, 0)),
              "body_ang_vel_w": first(d["body_ang_vel_w"], (0, 0, 0)),
              "joint_names": d["joint_names"],
              "body_names": np.array(["world", *[str(n) for n in d["body_names"]]])}
    np.savez(out, **arrays)
    names = [str(n) for n in d["body_names"]]
    idx = [names.index(n) for n in ours.body_names]
    diff = float(np.linalg.norm(d["body_pos_w"][:, idx] - ours.body_pos_w, axis=-1).max())
    info = {"source": str(clip.relative_to(ROOT)), "unilab_npz": str(out), "frames": frames,
            "fps": float(d["fps"]), "bodies": len(names) + 1, "unilab_model": str(xml),
            "fk_max_body_pos_diff_m": diff,
            "method": "npz2csv (our model), csv2npz --model UniLab's scene_flat.xml, world row "
                      "prepended"}
    log(f"clip: {out} ({frames} frames, {len(names) + 1} bodies); our 14 bodies through "
        f"UniLab's G1 differ by at most {diff:.2e} m")
    return info


# ----------------------------------------------------------------------------- UniLab runs

def unilab_overrides(npz: Path, envs: int, seed: int, run_dir: Path) -> list[str]:
    """Hydra overrides of `train --algo appo --task g1_motion_tracking --sim mujoco`: the clip,
    the env count, the seed, CPU, no playback video; the scene path is the installed package's
    (the task's default is a source checkout's relative path); no periodic checkpoints (the
    budget wrapper saves the final one) and iterations unbounded (the budget stops it)."""
    scene = unilab_assets() / "robots" / "g1" / "scene_flat.xml"
    return ["task=g1_motion_tracking/mujoco", "training.device=cpu", f"algo.num_envs={envs}",
            f"algo.seed={seed}", f"env.scene.model_file={scene}",
            f"env.commands.motion.params.motion_file={npz}", "training.no_play=true",
            f"training.log_dir={run_dir}", "algo.max_iterations=100000000",
            "algo.save_interval=0", f"hydra.run.dir={run_dir / 'hydra'}"]


def unilab_env() -> dict[str, str]:
    # its torch.compile kernels cached in build/, not /tmp
    return {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(WORK / "inductor-cache")}


def train_unilab(npz: Path, seconds: Sequence[float], envs: int, seed: int, tag: str) -> Path:
    run_dir = WORK / "runs" / tag
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    overrides = unilab_overrides(npz, envs, seed, run_dir)
    (run_dir / "overrides.json").write_text(json.dumps(overrides))
    run([VPY, Path(__file__), "_unilab_train", "--budget-s", *map(str, seconds), "--run-dir",
         run_dir, "--", *overrides], cwd=run_dir, env=unilab_env(), out=run_dir / "train.log")
    return run_dir


def warm_unilab(npz: Path, envs: int) -> None:
    """Once per cache: UniLab's first run compiles its torch.compile kernels (minutes on two
    cores); a run stopped at its first iteration fills the cache, so no budget pays for it."""
    marker = WORK / "inductor-cache" / ".warm"
    if marker.exists():
        return
    log("UniLab: filling its torch.compile cache (a run stopped at its first iteration)")
    train_unilab(npz, [0.0], envs, 0, "unilab_warmup")
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(time.strftime("%Y-%m-%d %H:%M:%S\n"))


def run_unilab(npz: Path, minutes: Sequence[float], envs: int, seed: int,
               frames: list[int]) -> list[dict]:
    """One UniLab run of the longest budget, its policy kept at each; one result per budget."""
    t = time.time()
    run_dir = train_unilab(npz, [m * 60 for m in minutes], envs, seed,
                           f"unilab_{max(minutes):g}min_s{seed}")
    wall = time.time() - t
    overrides = json.loads((run_dir / "overrides.json").read_text())
    series = [json.loads(line) for line in (run_dir / "series.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "budget.json").read_text())
    t0 = summary["learn_start"]
    results = []
    for m in minutes:
        at = summary["saved"][f"{m * 60:g}"]
        upto = [r for r in series if r["t"] - t0 <= at + 1e-6]
        rate = rates([(r["t"] - t0, r["env_steps"]) for r in upto])
        evaluation = run_dir / f"eval_{m:g}min.json"
        run([VPY, Path(__file__), "_unilab_eval", "--run-dir", run_dir, "--model",
             f"model_{m * 60:g}s.pt", "--frames", *map(str, frames), "--out", evaluation],
            cwd=run_dir, env=unilab_env(), out=run_dir / f"eval_{m:g}min.log")
        ev = json.loads(evaluation.read_text())
        results.append({
            "system": "unilab", "budget_min": m, "seed": seed, "envs": envs, **rate,
            "kept_at_s": at, "train_episode_length_last": upto[-1]["episode_length"]
            if upto else None, "iterations": upto[-1]["iteration"] if upto else 0,
            "first_iteration_s": series[0]["t"] - t0 if series else None,
            "process_wall_s": wall, "run_dir": str(run_dir), "physics": ev.pop("physics"),
            "versions": ev.pop("versions"), "eval": ev,
            "command": f"train --algo appo --task g1_motion_tracking --sim mujoco "
                       f"{' '.join(o for o in overrides if not o.startswith('task='))}"})
    return results


def rates(points: list[tuple[float, float]]) -> dict[str, float | None]:
    """Env steps/s from (seconds since training start, cumulative env steps): over the whole
    run (start-up included) and over its last 80% (steady state)."""
    if not points:
        return {"env_steps": 0, "train_s": None, "env_steps_per_s": None,
                "env_steps_per_s_steady": None}
    t_end, n_end = points[-1]
    t_from, n_from = next(p for p in points if p[0] >= 0.2 * t_end)
    steady = (n_end - n_from) / (t_end - t_from) if t_end > t_from else None
    return {"env_steps": int(n_end), "train_s": t_end, "env_steps_per_s": n_end / t_end,
            "env_steps_per_s_steady": steady}


# ----------------------------------------------------------------------------- our runs

def run_ours(minutes: Sequence[float], envs: int, seed: int, frames: list[int],
             clip: Path) -> list[dict]:
    """One run of our recipe for the longest budget, its policy kept at each shorter one
    (benchmarks/wall_time_snapshots.py); one result per budget."""
    tag = f"ours_{max(minutes):g}min_s{seed}"
    runs = WORK / "runs"
    shutil.rmtree(runs / tag, ignore_errors=True)
    runs.mkdir(parents=True, exist_ok=True)
    s = round(max(minutes) * 60)
    max_time = f"00:{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"
    snapshots = runs / tag / "snapshots"
    cmd = [sys.executable, "-m", "lightning_unilab.train", "--config", RECIPE,
           "--trainer.max_time", max_time, "--data.num_envs", str(envs), "--seed_everything",
           str(seed), "--trainer.logger.init_args.save_dir", runs,
           "--trainer.logger.init_args.name", tag]
    shorter = [m * 60 for m in minutes if m < max(minutes)]
    if shorter:
        cmd.append("--trainer.callbacks+=" + json.dumps({
            "class_path": "wall_time_snapshots.WallTimeSnapshots",
            "init_args": {"seconds": shorter, "dirpath": str(snapshots)}}))
    if clip.resolve() != CLIP:  # the recipe's clip is g1_dance
        cmd += ["--data.task_kwargs.task_data.motions", str(clip.resolve())]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH")) if p)}
    t = time.time()
    run(cmd, env=env, out=runs / f"{tag}.log")
    wall = time.time() - t
    version = sorted((runs / tag).glob("version_*"), key=lambda p: p.stat().st_mtime)[-1]
    points, lengths = our_series(version)
    kept = {}
    if shorter:
        for line in (snapshots / "snapshots.jsonl").read_text().splitlines():
            row = json.loads(line)
            kept[row["budget_s"]] = (snapshots / f"wall_{row['budget_s']:g}s.ckpt", row["at_s"])
    kept[max(minutes) * 60] = (version / "checkpoints" / "last.ckpt",
                               points[-1][0] if points else 0.0)
    shown = [str(c) for c in cmd]
    shown[:3] = ["python", "-m", "lightning_unilab.train"]
    results, physics, versions = [], our_physics(), our_versions()
    for m in minutes:
        ckpt, at = kept[m * 60]
        episodes = []
        for f in frames:
            out = version / f"eval_{m:g}min_start{f}"
            run([sys.executable, "-m", "lightning_unilab.evaluate", "checkpoint", ckpt, "--out",
                 out, "--no-video", "--param", f"start_frame={f}"],
                out=version / f"eval_{m:g}min_start{f}.log")
            tr = json.loads((out / "episode.json").read_text())["tracking"]
            episodes.append({"start_frame": f, "steps": tr["steps"], "fell": tr["fell"],
                             "body_pos_error_m": tr["body_pos_error_m"]})
        upto = [length for t_, length in lengths if t_ <= at + 1e-6]
        results.append({
            "system": "ours", "budget_min": m, "seed": seed, "envs": envs,
            **rates([p for p in points if p[0] <= at + 1e-6]), "kept_at_s": at,
            "train_episode_length_last": upto[-1] if upto else None, "process_wall_s": wall,
            "run_dir": str(version), "physics": physics, "versions": versions,
            "eval": summarize(episodes),
            "command": shlex.join(os.path.relpath(c, ROOT) if c.startswith("/") else c
                                  for c in shown)})
    return results


def our_series(version: Path) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """(seconds, env steps) and (seconds, mean episode length) from our TensorBoard events; the
    clock starts when the logger's event file was made (at fit start)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(version), size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    start = min(float(p.name.split(".")[3]) for p in version.glob("events.out.tfevents.*"))
    points = [(e.wall_time - start, e.value) for e in acc.Scalars("rollout/env_steps")] \
        if "rollout/env_steps" in tags else []
    lengths = [(e.wall_time - start, e.value) for e in acc.Scalars("rollout/episode_length")] \
        if "rollout/episode_length" in tags else []
    return points, lengths


def our_physics() -> dict[str, Any]:
    import mujoco
    import yaml

    from lightning_unilab import _core
    from lightning_unilab.envs.tasks import load_model

    # the recipe's step over the task's defaults: what the run simulates, not the task table
    given = yaml.safe_load(RECIPE.read_text())["data"]["task_kwargs"].get("params") or {}
    p = {**_core.task_defaults(TASK), **given}
    m = load_model(TASK)
    m.opt.integrator, m.opt.iterations = int(p["integrator"]), int(p["solver_iterations"])
    return physics_of(m, mujoco, p["timestep"], p["ctrl_dt"],
                      "MuJoCo Playground's feet-only G1 (Menagerie), 29 position actuators")


def our_versions() -> dict[str, str]:
    from importlib import metadata

    import mujoco
    import torch

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
    return {"lightning-omnilab": head, "mujoco": mujoco.__version__,
            "torch": torch.__version__, "lightning": metadata.version("lightning")}


def span(x: Any) -> list[float]:
    return [round(float(x.min()), 4) + 0.0, round(float(x.max()), 4) + 0.0]


def physics_of(m: Any, mujoco: Any, timestep: float, ctrl_dt: float, model: str) -> dict:
    return {"timestep_s": timestep, "ctrl_dt_s": ctrl_dt, "substeps": round(ctrl_dt / timestep),
            "integrator": mujoco.mjtIntegrator(int(m.opt.integrator)).name.removeprefix("mjINT_"),
            "solver": mujoco.mjtSolver(int(m.opt.solver)).name.removeprefix("mjSOL_"),
            "iterations": int(m.opt.iterations), "ls_iterations": int(m.opt.ls_iterations),
            "cone": mujoco.mjtCone(int(m.opt.cone)).name.removeprefix("mjCONE_"),
            "ngeom": int(m.ngeom), "nbody": int(m.nbody),
            "colliding_geoms": int(((m.geom_contype != 0) | (m.geom_conaffinity != 0)).sum()),
            "contact_pairs": int(m.npair),
            "actuator_kp": span(m.actuator_gainprm[:, 0]), "actuator_kv": span(
                -m.actuator_biasprm[:, 2]), "joint_damping": span(m.dof_damping[6:]),
            "armature": span(m.dof_armature[6:]), "frictionloss": span(m.dof_frictionloss[6:]),
            "model": model}


def summarize(episodes: list[dict]) -> dict[str, Any]:
    def mean(key: str) -> float:
        return sum(e[key] for e in episodes) / len(episodes)

    out = {"episodes": episodes, "body_pos_error_m": mean("body_pos_error_m"),
           "falls": sum(bool(e["fell"]) for e in episodes), "starts": len(episodes)}
    if "unilab_error_body_pos_m" in episodes[0]:
        out["unilab_error_body_pos_m"] = mean("unilab_error_body_pos_m")
    return out


# ----------------------------------------------------------------------------- inside UniLab's venv

def unilab_train(argv: Sequence[str]) -> int:
    """UniLab's train_appo under wall-time budgets, counted from its runner's learn(): each
    logged iteration appends (time, collected env steps, episode length) to series.jsonl; the
    first log past each budget saves the learner (model_{budget}s.pt); the last budget's also
    stops the run through UniLab's own Ctrl+C path (collector shut down, run summary written)."""
    p = argparse.ArgumentParser(prog="_unilab_train")
    p.add_argument("--budget-s", type=float, nargs="+", required=True)
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("overrides", nargs="*")
    a = p.parse_args(argv)
    import runpy

    import torch
    import unilab
    import unilab.rl.algos.appo.runner as appo_runner
    from unilab.rl.logging.offpolicy import OffPolicyLogger

    class BudgetReached(KeyboardInterrupt):
        pass

    state: dict[str, Any] = {"process_start": time.time(), "saved": {}}
    left = sorted(a.budget_s)
    series = open(a.run_dir / "series.jsonl", "w")
    learn, build, log_step = (appo_runner.APPORunner.learn, appo_runner.APPORunner._build_learner,
                              OffPolicyLogger.log_step)

    def timed_learn(self: Any, *args: Any, **kwargs: Any) -> Any:
        state["learn_start"] = time.time()
        return learn(self, *args, **kwargs)

    def keep_learner(self: Any) -> Any:
        state["learner"] = build(self)
        return state["learner"]

    def budget_log_step(self: Any, *args: Any, **kwargs: Any) -> None:
        log_step(self, *args, **kwargs)
        now = time.time()
        metrics = kwargs.get("metrics") or {}
        series.write(json.dumps({
            "t": now, "iteration": kwargs.get("iteration"), "env_steps": int(self._total_steps),
            "episode_length": float(self._mean_ep_length),
            "return": kwargs.get("return_mean_ep100"),
            "learning_rate": metrics.get("Loss/learning_rate")}) + "\n")
        series.flush()
        while left and now - state["learn_start"] >= left[0]:
            budget = left.pop(0)
            torch.save(state["learner"].get_state_dict(), a.run_dir / f"model_{budget:g}s.pt")
            state["saved"][f"{budget:g}"] = now - state["learn_start"]
        if not left:
            state["stopped"] = now
            raise BudgetReached

    appo_runner.APPORunner.learn = timed_learn
    appo_runner.APPORunner._build_learner = keep_learner
    OffPolicyLogger.log_step = budget_log_step
    script = str(Path(unilab.__file__).parent / "scripts" / "train_appo.py")
    sys.argv = [script, *a.overrides]
    try:  # as `train` runs it: a script (Hydra finds its configs beside it), in this process
        runpy.run_path(script, run_name="__main__")
    except SystemExit:
        if "stopped" not in state:
            raise
    series.close()
    if "stopped" not in state:
        raise RuntimeError("UniLab's run ended before its budget")
    (a.run_dir / "budget.json").write_text(json.dumps(
        {k: state[k] for k in ("process_start", "learn_start", "stopped", "saved")}
        | {"budget_s": a.budget_s}))
    return 0


def unilab_eval(argv: Sequence[str]) -> int:
    """UniLab's final policy (its mean action) in its own env, one env per start frame: the
    start sampler pinned to the frames, the reset pose, velocity and joint noise ranges zeroed;
    each env runs to the clip's end or its first termination. The error per step is
    BeyondMimic's error_body_pos computed here as ours (the robot after the step against the
    reference frame it has advanced to) and, beside it, UniLab's own metric, which its command
    updates before advancing the frame (the frame its observation showed, as its reward)."""
    p = argparse.ArgumentParser(prog="_unilab_eval")
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--model", default="model_final.pt", help="the saved learner, in --run-dir")
    p.add_argument("--frames", type=int, nargs="+", required=True)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    from importlib import metadata

    import mujoco
    import numpy as np
    import torch
    import unilab
    from hydra import compose, initialize_config_dir
    from unilab.base.config_adapter import EnvConfigAdapter, create_env
    from unilab.rl import RslRlVecEnvAdapter
    from unilab.training import algo_config_dict, ensure_registries
    from unilab.visualization.interactive_playback import _build_appo_actor

    overrides = [o for o in json.loads((a.run_dir / "overrides.json").read_text())
                 if not o.startswith("hydra.")]
    conf = Path(unilab.__file__).parent / "conf" / "appo"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    ensure_registries()
    rl_cfg = algo_config_dict(cfg)
    env_override = EnvConfigAdapter(cfg, root_dir=Path.cwd(),
                                    algo_name="appo").build_task_env_cfg_override()
    n = len(a.frames)
    env = create_env(cfg, num_envs=n, env_cfg_override=env_override)
    wrapped = RslRlVecEnvAdapter(env, device="cpu", policy_obs_mode="flat")
    actor, _, _ = _build_appo_actor(env=env, wrapped_env=wrapped, cfg=cfg, rl_cfg=rl_cfg,
                                    device="cpu")
    state = torch.load(a.run_dir / a.model, map_location="cpu", weights_only=True)
    actor.load_state_dict(state["actor"])
    cmd = env.command_manager.get_term("motion")
    for noise in (cmd._pose_range_torch, cmd._velocity_range_torch,
                  cmd._joint_position_range_torch):
        noise.zero_()
    starts = torch.tensor(a.frames, dtype=torch.int32)
    sampler = cmd.tensor_sampler
    sample = sampler.sample_frames

    def pinned(mask: torch.Tensor, rng: Any) -> torch.Tensor:
        frames = sample(mask, rng)
        frames.copy_(starts)
        torch.where(mask, starts, sampler.current_frames, out=sampler.current_frames)
        return frames

    sampler.sample_frames = pinned
    obs, _ = wrapped.reset()
    if not torch.equal(cmd.time_steps.cpu().to(torch.int32), starts):
        raise RuntimeError(f"start frames not pinned: {cmd.time_steps.tolist()}")
    end = int(cmd.current_clip_end_frames[0])
    length = np.array([end - f for f in a.frames])
    err, theirs = np.zeros(n), np.zeros(n)
    steps, fell, active = np.zeros(n, int), np.zeros(n, bool), np.ones(n, bool)
    with torch.inference_mode():
        for k in range(1, int(length.max()) + 1):
            obs, _, done, info = wrapped.step(actor(obs))
            mine = body_pos_error(cmd)
            logged = cmd.metrics["error_body_pos"].cpu().numpy()
            done = done.cpu().numpy().reshape(-1)
            timeout = (info["time_outs"].cpu().numpy().reshape(-1) if "time_outs" in info
                       else np.zeros(n, bool))
            fell |= active & done & ~timeout
            active &= ~done  # a reset row's errors are of its next episode: not counted
            err[active] += mine[active]
            theirs[active] += logged[active]
            steps[active] += 1
            active &= k < length
            if not active.any():
                break
    episodes = [{"start_frame": f, "steps": int(s), "fell": bool(x),
                 "body_pos_error_m": float(e / max(s, 1)),
                 "unilab_error_body_pos_m": float(t / max(s, 1))}
                for f, s, x, e, t in zip(a.frames, steps, fell, err, theirs, strict=True)]
    model = env.backend.model
    sim_dt, ctrl_dt = float(cfg.env.sim_dt), float(cfg.env.ctrl_dt)
    result = summarize(episodes) | {
        "clip_end_frame": end,
        "physics": physics_of(model, mujoco, sim_dt, ctrl_dt,
                              "UniLab's G1 (assets/robots/g1/g1.xml; mjlab's visual meshes)"),
        "versions": {k: metadata.version(k) for k in (
            "unilab", "unilab-rl", "unisim-core", "mujoco", "mjbatch-uni", "torch")}}
    a.out.write_text(json.dumps(result, indent=1))
    return 0


def body_pos_error(cmd: Any) -> Any:
    """BeyondMimic's error_body_pos per env from UniLab's command tensors: the reference bodies
    turned by the heading difference about the anchor, moved to the robot's anchor in x and y
    (their own heights kept), against the robot's bodies; mean over bodies of the distance."""
    import torch

    def mul(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        pw, px, py, pz = p.unbind(-1)
        qw, qx, qy, qz = q.unbind(-1)
        return torch.stack((pw * qw - px * qx - py * qy - pz * qz,
                            pw * qx + px * qw + py * qz - pz * qy,
                            pw * qy - px * qz + py * qw + pz * qx,
                            pw * qz + px * qy - py * qx + pz * qw), -1)

    a = cmd.anchor_body_idx
    ref_pos, ref_quat = cmd._body_pos_w, cmd._motion_data.body_quat_w  # world, env origins in
    pos, quat = cmd.robot_body_pos_w, cmd.robot_body_quat_w
    d = mul(quat[:, a], ref_quat[:, a] * torch.tensor([1.0, -1.0, -1.0, -1.0]))
    yaw = torch.atan2(2 * (d[:, 0] * d[:, 3] + d[:, 1] * d[:, 2]),
                      1 - 2 * (d[:, 2] ** 2 + d[:, 3] ** 2))
    c, s = torch.cos(yaw)[:, None], torch.sin(yaw)[:, None]
    local = ref_pos - ref_pos[:, a:a + 1]
    rel = torch.stack((pos[:, a:a + 1, 0] + c * local[..., 0] - s * local[..., 1],
                       pos[:, a:a + 1, 1] + s * local[..., 0] + c * local[..., 1],
                       ref_pos[..., 2]), -1)
    return torch.linalg.vector_norm(rel - pos, dim=-1).mean(-1).cpu().numpy()


# ----------------------------------------------------------------------------- report

def table(results: list[dict]) -> str:
    head = ("system", "budget", "env steps/s (steady)", "body pos err m (own)", "falls",
            "train ep len", "physics")
    rows = [head]
    for r in results:
        ph, ev = r["physics"], r["eval"]
        sps = f"{r['env_steps_per_s'] or 0:,.0f} ({r['env_steps_per_s_steady'] or 0:,.0f})"
        rows.append((r["system"], f"{r['budget_min']:g} min", sps,
                     f"{ev['body_pos_error_m']:.3f}" + (
                         f" ({ev['unilab_error_body_pos_m']:.3f})"
                         if "unilab_error_body_pos_m" in ev else ""),
                     f"{ev['falls']}/{ev['starts']}",
                     f"{r['train_episode_length_last'] or 0:.0f}",
                     f"{ph['timestep_s'] * 1e3:.2f} ms x {ph['substeps']} {ph['integrator']}, "
                     f"{ph['iterations']} it"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))
                     for row in rows)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "_unilab_train":
        return unilab_train(argv[1:])
    if argv and argv[0] == "_unilab_eval":
        return unilab_eval(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, nargs="+", default=[15.0, 60.0],
                   help="wall-time budgets (default 15 60): each system trains once for the "
                        "longest, its policy kept at each")
    p.add_argument("--envs", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=WORK / "tracking_vs_unilab.json")
    p.add_argument("--quick", action="store_true", help="0.5- and 1-minute budgets: a smoke test")
    p.add_argument("--only", choices=("ours", "unilab"), default=None)
    p.add_argument("--clip", type=Path, default=CLIP)
    a = p.parse_args(argv)
    minutes = [0.5, 1.0] if a.quick else sorted(set(a.minutes))
    WORK.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": {
            "cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        "args": {"minutes": minutes, "envs": a.envs, "seed": a.seed, "only": a.only,
                 "quick": a.quick},
        "metric": "BeyondMimic error_body_pos: mean over 14 bodies of the distance to the "
                  "reference re-anchored to the torso in x, y and heading; mean over the steps "
                  "of each episode (to the clip's end or the fall), then over the start frames",
        "runs": []}
    frames_total = None
    if a.only != "ours":
        setup_unilab()
        report["clip"] = convert_clip(a.clip.resolve())
        frames_total = report["clip"]["frames"]
        warm_unilab(Path(report["clip"]["unilab_npz"]), a.envs)
    if frames_total is None:
        import numpy as np

        frames_total = int(np.load(a.clip)["joint_pos"].shape[0])
    starts = [round(i * (frames_total - 1) / STARTS) for i in range(STARTS)]
    report["start_frames"] = starts
    for system in ("unilab", "ours"):
        if a.only not in (None, system):
            continue
        log(f"{system}: {max(minutes):g} min, policy kept at {minutes} min, {a.envs} envs, "
            f"seed {a.seed}")
        if system == "unilab":
            report["runs"] += run_unilab(Path(report["clip"]["unilab_npz"]), minutes, a.envs,
                                         a.seed, starts)
        else:
            report["runs"] += run_ours(minutes, a.envs, a.seed, starts, a.clip)
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(report, indent=1))
    print(table(report["runs"]))
    for r in report["runs"]:
        print(f"{r['system']}: {r['versions']}")
    log(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
