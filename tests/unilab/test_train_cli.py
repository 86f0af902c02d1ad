"""unilab-train: the recipe trains, logs, checkpoints, resumes; signals leave nothing behind."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from lightning_unilab.train import main

RECIPE = str(Path(__file__).parents[2] / "recipes" / "unilab" / "inverted_pendulum.yaml")
STEPS_PER_SLOT = 5 * 4  # the recipe's epochs x minibatches: optimizer steps per rollout


def _quick(tmp_path, *extra: str) -> list[str]:
    return ["--config", RECIPE, "--trainer.logger.init_args.save_dir", str(tmp_path),
            "--trainer.enable_progress_bar", "false", "--trainer.max_time", "00:00:05:00",
            "--data.num_envs", "16", "--data.horizon", "16", *extra]


def test_recipe_trains_logs_checkpoints_and_resumes(tmp_path, capsys):
    cli = main(_quick(tmp_path, "--trainer.max_steps", str(2 * STEPS_PER_SLOT)))
    log_dir = Path(cli.trainer.logger.log_dir)
    assert cli.trainer.global_step == 2 * STEPS_PER_SLOT
    assert list(log_dir.glob("events.out.tfevents.*")), "no TensorBoard event file"
    last = log_dir / "checkpoints" / "last.ckpt"
    assert last.exists()
    assert last.with_name("last.ckpt.sha256").exists()  # AtomicCheckpointIO: reliability.md
    assert f"tensorboard --logdir {log_dir}" in capsys.readouterr().err
    assert cli.datamodule.collector is None

    resumed = main(_quick(tmp_path, "--trainer.max_steps", str(3 * STEPS_PER_SLOT),
                          "--ckpt_path", str(last)))
    assert resumed.trainer.global_step == 3 * STEPS_PER_SLOT  # one more rollout
    assert resumed.datamodule.policy_version == 3
    assert resumed.datamodule.counters["seq"] >= 3  # the collector's counters went on


def test_last_checkpoint_is_the_final_policy(tmp_path):
    # periodic saves every 2 rollouts, the run stops after 3: Lightning alone left last.ckpt at
    # the second rollout while the evaluation ran the third's policy
    import torch
    import yaml

    recipe = yaml.safe_load(Path(RECIPE).read_text())
    recipe["trainer"]["callbacks"][0]["init_args"]["every_n_train_steps"] = 2 * STEPS_PER_SLOT
    config = tmp_path / "recipe.yaml"
    config.write_text(yaml.safe_dump(recipe))
    args = _quick(tmp_path, "--trainer.max_steps", str(3 * STEPS_PER_SLOT))
    args[1] = str(config)
    cli = main(args)
    last = Path(cli.trainer.logger.log_dir) / "checkpoints" / "last.ckpt"
    saved = torch.load(last, map_location="cpu", weights_only=False)
    assert saved["global_step"] == 3 * STEPS_PER_SLOT and saved["appo"]["policy_version"] == 3
    policy = cli.model.policy.state_dict()
    for key, value in saved["state_dict"].items():
        assert torch.equal(value, policy[key.removeprefix("policy.")]), key
    assert last.with_name("last.ckpt.sha256").exists()
    periodic = sorted(p.name for p in last.parent.glob("epoch=*.ckpt"))
    assert periodic == [f"epoch=0-step={2 * STEPS_PER_SLOT}.ckpt"]  # kept as it was


def test_bad_arguments_fail_before_training(tmp_path):
    with pytest.raises(ValueError, match="horizon"):
        main(_quick(tmp_path, "--data.horizon", "0"))
    with pytest.raises(ValueError, match="learner_threads"):
        main(_quick(tmp_path, "--learner_threads", "0"))


def _blocks(pid: int) -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith(f"omnilab_ring_{pid}_")
            or n.startswith(f"omnilab_weights_{pid}_")}


def test_sigterm_stops_the_run_and_removes_everything(tmp_path):
    """(SIGINT, i.e. KeyboardInterrupt, is tested in-process in test_data.py.)"""
    args = [sys.executable, "-m", "lightning_unilab.train", *_quick(tmp_path)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not _blocks(proc.pid) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert _blocks(proc.pid), "the run did not start its collector"
        time.sleep(1.0)  # training under way
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        _, still = psutil.wait_procs(children, timeout=10)
        still = [p for p in still if p.status() != psutil.STATUS_ZOMBIE]  # exited, not reaped
        assert not still, f"left running: {[p.pid for p in still]}"
        assert not _blocks(proc.pid), "shared memory left behind"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# "--learner_threads 0" fails right after parsing: a flag that parses (as a prefix did) fails
# fast with the wrong error instead of starting a run
@pytest.mark.parametrize(("typo", "value", "fix"), [
    ("--data.num_env", "8", "--data.num_envs"),
    ("--trainer.max_tim", "00:00:00:10", "--trainer.max_time"),
    ("--optimizer", "Adam", "--model.lr"),
])
def test_a_typo_fails_and_names_the_closest_flag(tmp_path, capsys, typo, value, fix):
    with pytest.raises(SystemExit) as exit_:
        main(_quick(tmp_path, typo, value, "--learner_threads", "0"))
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"unrecognized arguments: {typo} {value}" in err
    assert re.search(rf"{re.escape(typo)}: (did you mean|not a flag here)[^;]*{re.escape(fix)}\b",
                     err), err[-400:]


def test_a_typo_in_a_config_file_names_the_closest_key(tmp_path, capsys):
    typo = tmp_path / "typo.yaml"
    typo.write_text("data:\n  num_env: 8\n")
    with pytest.raises(SystemExit) as exit_:
        main(["--config", RECIPE, "--config", str(typo), "--learner_threads", "0"])
    assert exit_.value.code == 2
    assert "--data.num_env: did you mean --data.num_envs?" in capsys.readouterr().err


def test_help_lists_only_flags_that_work(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--trainer.default_root_dir" in out and "--data.num_envs" in out
    assert "--optimizer" not in out and "--lr_scheduler" not in out
    assert "what remains" in " ".join(out.split())  # a resumed run's max_time


def test_default_root_dir_moves_the_logs_and_checkpoints(tmp_path):
    from lightning_unilab.learner.appo import APPOModule
    from lightning_unilab.runtime.data import RolloutDataModule
    from lightning_unilab.train import UniLabCLI

    root = tmp_path / "root"
    cli = UniLabCLI(APPOModule, RolloutDataModule, run=False,
                    args=["--config", RECIPE, "--trainer.default_root_dir", str(root)])
    assert Path(cli.trainer.logger.log_dir).parent.parent == root
    assert Path(cli.trainer.log_dir).is_relative_to(root)  # ModelCheckpoint writes under it
