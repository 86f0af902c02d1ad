"""`python -m lightning_unilab.evaluate checkpoint CKPT` replays the end-of-training evaluation:
task, task_kwargs and the evaluation's settings come from the checkpoint; another task is
refused by name, not by a tensor-size error."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_unilab.evaluate import Episode, EvaluationRollout, _main, render_episode, run_episode

RECIPE = str(Path(__file__).parents[2] / "recipes" / "unilab" / "inverted_pendulum.yaml")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One update of the pendulum recipe with a non-default task parameter, its evaluation
    summary and its last checkpoint."""
    from lightning_unilab.train import main

    tmp = tmp_path_factory.mktemp("run")
    threads = torch.get_num_threads()
    try:
        cli = main(["--config", RECIPE, "--trainer.logger.init_args.save_dir", str(tmp),
                    "--trainer.enable_progress_bar", "false", "--trainer.max_steps", "20",
                    "--data.num_envs", "4", "--data.horizon", "8",
                    "--data.task_kwargs", "{params: {reset_noise_scale: 0.15}}",
                    "--trainer.callbacks.init_args.video", "false",
                    "--trainer.callbacks.init_args.seed", "3"])
    finally:
        torch.set_num_threads(threads)
    rollout = next(c for c in cli.trainer.callbacks if isinstance(c, EvaluationRollout))
    return rollout.summary, Path(cli.trainer.log_dir) / "checkpoints" / "last.ckpt"


def test_checkpoint_is_evaluated_on_its_task_as_training_did(trained, tmp_path, capsys):
    summary, ckpt = trained
    _main(["checkpoint", str(ckpt), "--out", str(tmp_path), "--no-video"])
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    replay = json.loads((tmp_path / "episode.json").read_text())
    assert replay["task"] == "InvertedPendulum-v5"
    # same task parameters, seed and cap: the same episode as at the end of training
    assert (printed["return"], printed["length"]) == (summary["return"], summary["length"])
    assert replay["rewards"] == summary["rewards"]


def test_a_task_other_than_the_checkpoints_is_refused(trained, tmp_path, capsys):
    _, ckpt = trained
    with pytest.raises(SystemExit) as exit_:
        _main(["checkpoint", str(ckpt), "--task", "Ant-v5", "--out", str(tmp_path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--task: the checkpoint was trained on 'InvertedPendulum-v5', got 'Ant-v5'" in err


def test_a_policy_of_another_size_is_refused_naming_both():
    from lightning_unilab.learner.policy import ActorCritic

    with pytest.raises(ValueError, match=r"task: the policy expects observations of size 4 "
                                         r"and actions of size 1, but task 'Ant-v5' has "
                                         r"\d+ and 8"):
        run_episode(ActorCritic(4, 4, 1), "Ant-v5", max_steps=2)


def test_checkpoint_settings_with_explicit_overrides():
    from lightning_unilab.evaluate import checkpoint_evaluation

    checkpoint = {
        "datamodule_hyper_parameters": {
            "task": "g1-walk-flat", "randomization": object(),
            "task_kwargs": {"params": {"w_alive": 1.0, "resample_steps": 50.0}}},
        "callbacks": {"EvaluationRollout": EvaluationRollout(
            max_steps=9, seed=2, task_params={"resample_steps": 250}).state_dict()},
    }
    run = checkpoint_evaluation(checkpoint, params={"w_alive": 2.0})
    assert run.task == "g1-walk-flat" and (run.max_steps, run.seed) == (9, 2)
    # randomization off (as EvaluationRollout's default), the callback's params over training's
    assert run.task_kwargs == {"params": {"w_alive": 2.0, "resample_steps": 250}}
    assert checkpoint_evaluation(checkpoint, "g1-walk-flat", max_steps=3, seed=0).max_steps == 3
    # randomize=True keeps the training's randomization and training-only parameters
    kept = checkpoint_evaluation(checkpoint, randomize=True).task_kwargs
    assert kept["randomization"] is checkpoint["datamodule_hyper_parameters"]["randomization"]
    assert kept["params"] == {"w_alive": 1.0, "resample_steps": 250}
    with pytest.raises(ValueError, match="--task: the checkpoint does not name its task"):
        checkpoint_evaluation({})


def test_several_episodes_sum_up_one_per_seed(trained, tmp_path, capsys):
    """--episodes N runs seeds SEED..SEED+N-1: the recipe's own seed (3) replays the
    end-of-training episode, the others are new start states."""
    summary, ckpt = trained
    _main(["checkpoint", str(ckpt), "--out", str(tmp_path), "--episodes", "3"])
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    written = json.loads((tmp_path / "episodes.json").read_text())
    assert [r["seed"] for r in written["rows"]] == [3, 4, 5]
    assert written["deterministic"] is True and written["episodes"] == 3
    first = written["rows"][0]
    assert (first["return"], first["length"]) == (summary["return"], summary["length"])
    lengths = sorted(r["length"] for r in written["rows"])
    assert written["length_median"] == lengths[1]
    assert written["terminated"] == sum(r["terminated"] for r in written["rows"])
    assert printed == {k: v for k, v in written.items() if k != "rows"}
    assert not (tmp_path / "episode.json").exists()


def test_stochastic_episodes_sample_and_repeat_for_a_seed(trained, tmp_path, capsys):
    from lightning_unilab.learner.appo import APPOModule

    _, ckpt = trained
    _main(["checkpoint", str(ckpt), "--out", str(tmp_path), "--no-video", "--stochastic"])
    assert json.loads((tmp_path / "episode.json").read_text())["deterministic"] is False
    policy = APPOModule.load_from_checkpoint(ckpt, map_location="cpu").policy
    task = ("InvertedPendulum-v5", {"params": {"reset_noise_scale": 0.15}})
    states = []
    for global_seed, deterministic in ((1, False), (2, False), (1, True)):
        torch.manual_seed(global_seed)  # the caller's stream must not matter
        states.append(run_episode(policy, task[0], task[1], seed=3, max_steps=30,
                                  deterministic=deterministic).states)
    torch.manual_seed(0)
    before = torch.rand(1)
    torch.manual_seed(0)
    run_episode(policy, task[0], task[1], seed=3, max_steps=5, deterministic=False)
    assert torch.rand(1) == before  # the caller's random stream is left alone
    assert np.array_equal(states[0], states[1])  # seeded: the same samples again
    n = min(len(states[0]), len(states[2]))
    assert not np.array_equal(states[0][:n], states[2][:n])  # samples, not the mean


def test_episodes_must_be_positive(trained, tmp_path, capsys):
    _, ckpt = trained
    with pytest.raises(SystemExit):
        _main(["checkpoint", str(ckpt), "--out", str(tmp_path), "--episodes", "0"])
    assert "--episodes: expected a positive number of episodes, got 0" in capsys.readouterr().err


def test_a_g1_checkpoint_names_the_physics_step_it_trained_at():
    """The data module saves the model-level parameters at their values now, so a checkpoint is
    evaluated (and resumed) at its own step after the default moves; given ones are kept."""
    from lightning_unilab import _core
    from lightning_unilab.evaluate import checkpoint_evaluation
    from lightning_unilab.runtime.data import RolloutDataModule

    defaults = _core.task_defaults("g1-walk-flat")
    saved = RolloutDataModule("g1-walk-flat", num_envs=2, horizon=2).hparams
    physics = {k: defaults[k] for k in ("timestep", "eulerdamp", "integrator",
                                        "solver_iterations")}
    assert saved["task_kwargs"] == {"params": physics}
    given = RolloutDataModule("g1-walk-flat", num_envs=2, horizon=2,
                              task_kwargs={"params": {"timestep": 0.005, "w_alive": 1.0}})
    params = given.hparams["task_kwargs"]["params"]
    assert params == {**physics, "timestep": 0.005, "w_alive": 1.0}
    assert given.config.task_kwargs["params"] == params  # the collector's env: the same
    run = checkpoint_evaluation({"datamodule_hyper_parameters": dict(given.hparams)})
    assert run.task_kwargs["params"]["timestep"] == 0.005
    # tasks without model-level parameters: as given
    assert RolloutDataModule("HalfCheetah-v5", num_envs=2, horizon=2).hparams["task_kwargs"] is None


def test_tracking_errors_per_command():
    from lightning_unilab.evaluate import Episode

    # 2 steps under (1, 0, 0) then 3 under (0, 0.5, 0.2); closed-form errors per command
    cmd = np.array([[1.0, 0.0, 0.0]] * 2 + [[0.0, 0.5, 0.2]] * 3)
    vel = np.array([[0.4, 0.0, 0.0], [1.0, 0.8, 0.0],
                    [0.0, 0.5, 0.2], [0.3, 0.9, 0.1], [0.0, 0.5, 0.5]])
    names = ("vx", "vy", "yaw_rate")
    series = {**{n: vel[:, i] for i, n in enumerate(names)},
              **{f"{n}_command": cmd[:, i] for i, n in enumerate(names)}}
    tracking = Episode("t", np.zeros(5), series=series, dt=0.02).tracking()
    assert tracking["command_changes"] == 1
    first, second = tracking["per_command"]
    assert (first["start_s"], first["steps"], first["command"]) == (0.0, 2, [1.0, 0.0, 0.0])
    assert first["lin_vel_error_mps"] == pytest.approx((0.6 + 0.8) / 2)
    assert first["yaw_rate_error_radps"] == pytest.approx(0.0)
    assert (second["start_s"], second["steps"]) == (pytest.approx(0.04), 3)
    assert second["lin_vel_error_mps"] == pytest.approx((0.0 + 0.5 + 0.0) / 3)
    assert second["yaw_rate_error_radps"] == pytest.approx((0.0 + 0.1 + 0.3) / 3)
    # the whole-episode means weigh each command by its steps
    assert tracking["lin_vel_error_mps"] == pytest.approx((0.6 + 0.8 + 0.5) / 5)
    # standing still: the commands' sizes, |(1, 0)| twice and |(0, 0.5)| three times
    assert tracking["standing_lin_vel_error_mps"] == pytest.approx((2 * 1.0 + 3 * 0.5) / 5)
    assert tracking["standing_yaw_rate_error_radps"] == pytest.approx(3 * 0.2 / 5)


def test_a_render_slower_than_its_bound_says_so(tmp_path):
    """The GIF's bound is per backend try; a slow renderer is reported as slow, with the frame
    count and the bound, not as a missing backend, and no GIF is left behind."""
    states = np.zeros((7, 4))
    episode = Episode(task="Pendulum-v1", rewards=np.zeros(6), states=states, dt=0.05)
    reason = render_episode(episode, tmp_path / "e.gif", max_frames=3, timeout=0.01)
    assert reason is not None and not (tmp_path / "e.gif").exists()
    tries = reason.split("; ")
    assert len(tries) >= 2 and all(t.endswith(": 3 frames not drawn in 0 s") for t in tries)


def test_the_default_render_bound_grows_with_the_frames_drawn(tmp_path, monkeypatch):
    """Without ``timeout`` each backend try gets 120 s plus 10 s for every frame it draws
    (the states kept after striding to ``max_frames``), so a long episode is not cut short."""
    import subprocess

    import lightning_unilab.evaluate as evaluate

    bounds = []

    def slow(cmd, timeout, **kwargs):
        bounds.append(timeout)
        raise subprocess.TimeoutExpired(cmd, timeout)

    monkeypatch.setattr(evaluate.subprocess, "run", slow)
    episode = Episode(task="Pendulum-v1", rewards=np.zeros(6), states=np.zeros((7, 4)), dt=0.05)
    few = render_episode(episode, tmp_path / "a.gif", max_frames=3)  # states 0, 3, 6
    n_tries = len(bounds)
    many = render_episode(episode, tmp_path / "b.gif", max_frames=100)  # all 7 states
    assert n_tries >= 1 and len(bounds) == 2 * n_tries
    assert bounds[:n_tries] == [150.0] * n_tries and bounds[n_tries:] == [190.0] * n_tries
    assert "3 frames not drawn in 150 s" in few and "7 frames not drawn in 190 s" in many
