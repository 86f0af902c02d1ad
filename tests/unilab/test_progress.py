"""The RL progress bar's line, from a trainer's state (no training): an endless run bounded by
max_time or max_steps shows its env steps, their rate, elapsed and remaining time and the mean
return, never Lightning's batch count of an endless epoch (``Epoch 0/-2 ... 1285/--``); and
``lightning_unilab.train`` installs the bar unless the command chose another or none."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from lightning.pytorch.callbacks import Timer, TQDMProgressBar

from lightning_unilab.progress_bar import RLProgress, RLProgressBar, progress_text, read_progress

NO_LIGHTNING_COUNTS = re.compile(r"-2|--|/-1|\binf\b|\bnan\b|\?")


class FixedTimer(Timer):
    """Lightning's Timer with a fixed elapsed time (the bar reads only these two methods)."""

    def __init__(self, duration_s: float, elapsed_s: float) -> None:
        super().__init__(duration={"seconds": duration_s})
        self.elapsed_s = elapsed_s

    def time_elapsed(self, stage: str = "train") -> float:
        return self.elapsed_s

    def time_remaining(self, stage: str = "train") -> float:
        return self._duration - self.elapsed_s


def _trainer(step: int, max_steps: int = -1, timer: Timer | None = None,
             env_steps: int | None = 131_072, world_size: int = 1, metrics=None):
    counters = {} if env_steps is None else {"env_steps": env_steps}
    return SimpleNamespace(global_step=step, max_steps=max_steps, max_epochs=-1,
                           callbacks=[timer] if timer else [], world_size=world_size,
                           datamodule=SimpleNamespace(counters=counters),
                           progress_bar_metrics=metrics if metrics is not None
                           else {"rollout/return": 512.34, "env_steps/s": 9000.0})


def test_an_endless_run_with_max_time_shows_env_steps_time_left_and_return():
    trainer = _trainer(1285, timer=FixedTimer(180, 60))
    # this run's training started 50 s ago, at step 285 and 31,072 env steps
    progress = read_progress(trainer, started=(100.0, 285, 31_072), now=150.0)
    assert progress == RLProgress(step=1285, max_steps=None, env_steps=131_072,
                                  env_steps_per_s=2000.0, elapsed_s=60, remaining_s=120,
                                  mean_return=512.34)
    text = RLProgressBar().text(trainer)  # what the terminal shows before the first batch
    assert text == ("step 1,285 | env steps 131k | 01:00 elapsed, 02:00 left | return 512.3")
    line = progress_text(progress, {"v_num": 3, "loss": 0.123456})
    assert line == ("step 1,285 | env steps 131k (2,000/s) | 01:00 elapsed, 02:00 left | "
                    "return 512.3 | v_num=3 | loss=0.1235")
    assert not NO_LIGHTNING_COUNTS.search(line), line


def test_max_steps_bounds_the_time_left_at_this_runs_step_rate_and_counts_every_rank():
    trainer = _trainer(300, max_steps=500, env_steps=2_000_000, world_size=2)
    progress = read_progress(trainer, started=(0.0, 100, 1_000_000), now=40.0)
    # 200 steps in 40 s: 200 steps left take 40 s; 2 ranks: 4M env steps, 3M of them in 40 s
    assert (progress.remaining_s, progress.env_steps, progress.env_steps_per_s) == \
        (pytest.approx(40.0), 4_000_000, pytest.approx(75_000.0))
    line = progress_text(progress)
    assert line == ("step 300/500 | env steps 4M (75k/s) | 00:40 elapsed, 00:40 left | "
                    "return 512.3")
    # both bounds: the sooner one
    timer = _trainer(300, max_steps=500, timer=FixedTimer(3600, 3590))
    assert read_progress(timer, started=(0.0, 100, None), now=40.0).remaining_s == 10


def test_nothing_known_yet_and_no_bound_say_so_without_placeholders():
    trainer = _trainer(0, env_steps=None, metrics={"rollout/return": float("nan")})
    line = progress_text(read_progress(trainer, started=None, now=5.0))
    assert line == "step 0 | 00:00 elapsed, no time or step limit"
    assert not NO_LIGHTNING_COUNTS.search(line)
    long = RLProgress(7, None, 3 * 10**9, 1.5e6, 93_784.0, 3_700.0, -1.0)
    assert progress_text(long) == ("step 7 | env steps 3G (1.5M/s) | 1d 02:03:04 elapsed, "
                                   "1:01:40 left | return -1")


def test_train_installs_the_bar_unless_the_command_chose_one_or_none():
    from lightning_unilab.train import use_rl_progress_bar

    def trainer(*callbacks):
        bars = [cb for cb in callbacks if isinstance(cb, TQDMProgressBar)]
        return SimpleNamespace(callbacks=list(callbacks),
                               progress_bar_callback=bars[0] if bars else None)

    default = trainer(Timer(), TQDMProgressBar())  # Lightning's default, added by the Trainer
    assert use_rl_progress_bar(default, chosen=False)
    assert isinstance(default.callbacks[1], RLProgressBar) and len(default.callbacks) == 2
    mine = trainer(TQDMProgressBar(refresh_rate=7))  # --trainer.callbacks named it
    assert not use_rl_progress_bar(mine, chosen=True)
    assert type(mine.callbacks[0]) is TQDMProgressBar
    assert not use_rl_progress_bar(trainer(Timer()), chosen=False)  # enable_progress_bar false


def test_a_tiny_recipe_run_shows_the_rl_line(tmp_path, capsys):
    from lightning_unilab.train import main

    recipe = str(Path(__file__).resolve().parents[2] / "recipes/unilab/inverted_pendulum.yaml")
    cli = main(["--config", recipe, "--trainer.default_root_dir", str(tmp_path),
                "--trainer.max_steps", "4", "--data.mode", "sync", "--data.num_envs", "8",
                "--data.horizon", "8"])
    assert isinstance(cli.trainer.progress_bar_callback, RLProgressBar)
    lines = [s for s in re.split(r"[\r\n]", capsys.readouterr().out) if s.startswith("step ")]
    assert lines, "no progress line written"
    # one rollout: 5 epochs x 4 minibatches of optimizer steps, past max_steps=4 (Lightning's
    # count, which stops the run after that batch)
    assert re.fullmatch(r"step 20/4 \| env steps \d[\d,.]*k? \([\d,.]+k?/s\) \| \d\d:\d\d elapsed, "
                        r"\d\d:\d\d left( \| return [-\d.e+]+)? \| v_num=0", lines[-1]), lines[-1]
    assert not NO_LIGHTNING_COUNTS.search(lines[-1].split(" | v_num")[0]), lines[-1]
