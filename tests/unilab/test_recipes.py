"""Every UniLab recipe parses and trains two rollouts through the CLI; the evaluation callback
writes its plot (and, with OpenGL, its GIF); the G1 recipe's randomization reaches the env."""

from __future__ import annotations

import json
import os
import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ("inverted_pendulum", "half_cheetah", "ant", "humanoid", "g1_walk_flat",
           "g1_motion_tracking")


def _tiny(recipe: str, tmp_path: Path, video: bool) -> Path:
    """The recipe with a test-sized env, its logs in tmp_path and a short evaluation episode."""
    cfg = yaml.safe_load((ROOT / "recipes" / "unilab" / f"{recipe}.yaml").read_text())
    cfg["trainer"]["logger"]["init_args"]["save_dir"] = str(tmp_path / "runs")
    evals = [c for c in cfg["trainer"]["callbacks"]
             if c["class_path"] == "lightning_unilab.evaluate.EvaluationRollout"]
    assert len(evals) == 1, "each recipe ends with an EvaluationRollout"
    evals[0]["init_args"].update(max_steps=12, video=video, max_frames=4, size=[48, 36])
    if recipe == "g1_walk_flat":  # a new command every 4 of the 12 steps
        evals[0]["init_args"]["task_params"] = {"resample_steps": 4}
    cfg["data"].update(num_envs=4, horizon=8)
    path = tmp_path / f"{recipe}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_trains_two_rollouts_and_evaluates(recipe: str, tmp_path: Path) -> None:
    from lightning_unilab.train import main

    threads = torch.get_num_threads()
    try:
        cli = main(["--config", str(_tiny(recipe, tmp_path, video=recipe == "half_cheetah")),
                    "--trainer.limit_train_batches=2", "--trainer.max_epochs=1",
                    "--trainer.max_time=00:00:02:00"])
    finally:
        torch.set_num_threads(threads)
    module, trainer = cli.model, cli.trainer
    assert module.policy_version == 2, "two rollouts, two updates"
    assert trainer.global_step == 2 * module.hparams.epochs * module.hparams.minibatches
    log_dir = Path(trainer.log_dir)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags: set[str] = set()
    steps: dict[str, list[int]] = {}
    for events in log_dir.glob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events))
        acc.Reload()
        tags |= set(acc.Tags()["scalars"])
        for tag in ("learner/policy_version", "eval/return"):
            if tag in acc.Tags()["scalars"]:
                steps.setdefault(tag, []).extend(e.step for e in acc.Scalars(tag))
    assert {"rollout/env_steps", "learner/policy_version", "eval/return"} <= tags
    # the evaluation sits where the training curves end (the update index, not optimizer steps)
    assert steps["eval/return"] == [max(steps["learner/policy_version"])] == [1]
    # the task's reward terms, as means per step of each rollout, reach TensorBoard
    info_names = module._datamodule().rollout_spec.info_names
    assert info_names and {f"step_info/{name}" for name in info_names} <= tags
    summary = json.loads((log_dir / "evaluation" / "episode.json").read_text())
    assert 1 <= summary["length"] <= 12 and np.isfinite(summary["return"])
    assert len(summary["rewards"]) == summary["length"]
    assert (log_dir / "evaluation" / "episode.png").stat().st_size > 0
    if recipe == "half_cheetah":
        gif = log_dir / "evaluation" / "episode.gif"
        if summary["video"] is None:  # no OpenGL backend: the reason is recorded instead
            assert "no GIF rendered" in summary["video_skipped"] and not gif.exists()
        else:
            from PIL import Image

            assert Image.open(gif).n_frames >= 2
    if recipe == "g1_walk_flat":  # the plot's series: height, velocity and its command
        for key in ("base_height", "vx", "vx_command"):
            assert len(summary["series"][key]) == summary["length"]
        assert len(summary["terms"]["reward_tracking_lin_vel"]) == summary["length"]
        s, tracking = {k: np.asarray(v) for k, v in summary["series"].items()}, summary["tracking"]
        lin = np.hypot(s["vx"] - s["vx_command"], s["vy"] - s["vy_command"]).mean()
        assert tracking["lin_vel_error_mps"] == pytest.approx(lin)
        yaw = np.abs(s["yaw_rate"] - s["yaw_rate_command"]).mean()
        assert tracking["yaw_rate_error_radps"] == pytest.approx(yaw)
        # each step's command is the one it followed: new ones from steps 5 and 9 on
        assert tracking["command_changes"] == (summary["length"] - 1) // 4
    if recipe == "g1_motion_tracking":  # from the clip's first frame, the errors per clip
        tracking = summary["tracking"]
        assert tracking["start_frame"] == 0 and tracking["steps"] == summary["length"]
        errors = np.asarray(summary["terms"]["body_pos_error"])
        assert tracking["body_pos_error_m"] == pytest.approx(errors.mean())
        assert len(summary["series"]["ref_anchor_height"]) == summary["length"]


def test_g1_recipe_randomizes_per_env_and_survives_pickling() -> None:
    from jsonargparse import ArgumentParser

    from lightning_unilab.envs.vector_env import TaskVectorEnv
    from lightning_unilab.runtime.data import RolloutDataModule

    cfg = yaml.safe_load((ROOT / "recipes" / "unilab" / "g1_walk_flat.yaml").read_text())
    parser = ArgumentParser()
    parser.add_class_arguments(RolloutDataModule, "data")
    with warnings.catch_warnings(record=True) as caught:  # a typed argument: no deprecated form
        warnings.simplefilter("always")
        dm = parser.instantiate(parser.parse_object({"data": cfg["data"]})).data
    assert not [w for w in caught if "deprecat" in str(w.message).lower()]
    from lightning_unilab.envs.randomization import G1Randomization

    given = dm.config.task_kwargs["randomization"]
    assert isinstance(given, G1Randomization) and given.ranges["friction"] == (0.4, 1.0)
    rand = pickle.loads(pickle.dumps(given))  # as the collector receives it
    env = TaskVectorEnv("g1-walk-flat", 6, 1, randomization=rand, seed=3)
    env.reset(seed=3)
    base = env.model
    friction = env.pool.model_field("geom_friction")[:, :, 0]
    assert ((friction >= 0.4) & (friction <= 1.0)).all() and np.ptp(friction[:, 0]) > 0
    scale = env.pool.model_field("body_mass")[:, 1:] / base.body_mass[1:]
    assert ((scale >= 0.9 - 1e-12) & (scale <= 1.1 + 1e-12)).all() and np.ptp(scale) > 0
    env.close()


def test_randomization_rejects_bad_ranges() -> None:
    from lightning_unilab.envs.randomization import G1Randomization
    from lightning_unilab.runtime.data import RolloutDataModule

    with pytest.raises(ValueError, match="randomization: given both"):
        RolloutDataModule("g1-walk-flat", randomization=G1Randomization(),
                          task_kwargs={"randomization": G1Randomization()})
    with pytest.raises(TypeError, match="randomization"):
        RolloutDataModule("g1-walk-flat", randomization=0.5)

    with pytest.raises(ValueError, match="mass_scale"):
        G1Randomization(mass_scale=[1.1, 0.9])
    with pytest.raises(ValueError, match="friction"):
        G1Randomization(friction=[0.5])


@pytest.mark.skipif(os.environ.get("MUJOCO_GL") == "glfw", reason="needs a headless backend")
def test_evaluation_rejects_bad_arguments() -> None:
    from lightning_unilab.evaluate import EvaluationRollout

    with pytest.raises(ValueError, match="max_steps"):
        EvaluationRollout(max_steps=0)
    with pytest.raises(ValueError, match="size"):
        EvaluationRollout(size=[64])


def test_flip_recipe_is_the_tracking_recipe_on_the_flip_clip() -> None:
    """g1_flip.yaml differs from g1_motion_tracking.yaml in its clip, budget and run name only:
    a setting tuned on one reaches the other."""
    def load(name: str) -> dict:
        return yaml.safe_load((ROOT / "recipes" / "unilab" / f"{name}.yaml").read_text())

    flip, tracking = load("g1_flip"), load("g1_motion_tracking")
    assert flip["data"]["task_kwargs"]["task_data"]["motions"] == "g1_backflip"
    flip["data"]["task_kwargs"]["task_data"]["motions"] = "g1_dance"
    flip["trainer"]["max_time"] = tracking["trainer"]["max_time"]
    flip["trainer"]["logger"]["init_args"]["name"] = "g1_motion_tracking"
    assert flip == tracking
