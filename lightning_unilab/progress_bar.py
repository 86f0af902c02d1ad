"""The terminal's progress bar for an RL run: env steps, their rate, time and return.

An RL run's rollout stream is endless (``max_epochs: -1``), so Lightning's bar counts batches
of an epoch that never ends, against no total. :class:`RLProgressBar` (Lightning's
``TQDMProgressBar``, the bar the recipes use) shows instead what an RL user watches::

    step 1,285 | env steps 1.32M (10.4k/s) | 02:13 elapsed, 00:47 left | return 512.3 | v_num=3

``lightning_unilab.train`` installs it unless the command names another progress bar
(``--trainer.callbacks``) or none (``--trainer.enable_progress_bar false``).

The numbers: env steps are those of the rollouts trained on (the data module's ``counters``,
times the ranks under DDP, each of which collects as many); their rate is over this run's wall
time since training started (after the collector's start); the time left is the sooner of
``max_time`` (Lightning's ``Timer``, which counts a resumed run's earlier time) and
``max_steps`` at this run's step rate; the return is the mean the learner logs
(``rollout/return``). The formatting is pure
(:func:`progress_text`), so it is tested without training.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Timer, TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

__all__ = ["RLProgress", "RLProgressBar", "progress_text", "read_progress"]

# the learner's metrics this bar formats itself (the others are appended as Lightning shows them)
RETURN_METRIC = "rollout/return"
_SHOWN = (RETURN_METRIC, "env_steps/s")


@dataclass(frozen=True)
class RLProgress:
    """What the bar shows, read from the trainer (None: not known yet, or no such bound)."""

    step: int  # optimizer steps (``trainer.global_step``)
    max_steps: int | None  # None: no step bound
    env_steps: int | None
    env_steps_per_s: float | None
    elapsed_s: float
    remaining_s: float | None
    mean_return: float | None


def _count(n: float) -> str:
    """1234 -> "1,234"; 1.32e6 -> "1.32M": short enough for a terminal line."""
    for scale, suffix in ((1e9, "G"), (1e6, "M")):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{suffix}"
    if abs(n) >= 1e4:
        return f"{n / 1e3:.3g}k"
    return f"{n:,.0f}"


def _clock(seconds: float) -> str:
    """Seconds as [h:]mm:ss (days as "1d 02:03:04")."""
    s = max(0, int(round(seconds)))
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    text = f"{hours:d}:{minutes:02d}:{s:02d}" if hours or days else f"{minutes:02d}:{s:02d}"
    return f"{days}d {hours:02d}:{minutes:02d}:{s:02d}" if days else text


def progress_text(progress: RLProgress, extra: dict[str, Any] | None = None) -> str:
    """The bar's line: step (of max_steps), env steps and their rate, elapsed and remaining
    time, mean return, then ``extra`` (the other progress bar metrics) as ``name=value``."""
    p = progress
    parts = [f"step {p.step:,}" + (f"/{p.max_steps:,}" if p.max_steps is not None else "")]
    if p.env_steps is not None:
        rate = (f" ({_count(p.env_steps_per_s)}/s)" if p.env_steps_per_s is not None else "")
        parts.append(f"env steps {_count(p.env_steps)}{rate}")
    left = (f", {_clock(p.remaining_s)} left" if p.remaining_s is not None
            else ", no time or step limit")
    parts.append(f"{_clock(p.elapsed_s)} elapsed{left}")
    if p.mean_return is not None:
        parts.append(f"return {p.mean_return:.4g}")
    for name, value in (extra or {}).items():
        parts.append(f"{name}={value:.4g}" if isinstance(value, float) else f"{name}={value}")
    return " | ".join(parts)


def _finite(value: Any) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _env_steps(trainer: Any) -> int | None:
    counters = getattr(getattr(trainer, "datamodule", None), "counters", None) or {}
    steps = counters.get("env_steps")
    if steps is None:
        return None
    return int(steps) * max(1, int(getattr(trainer, "world_size", 1)))  # each rank collects


def read_progress(trainer: Any, started: tuple[float, int, int | None] | None,
                  now: float | None = None) -> RLProgress:
    """The progress of ``trainer``'s run; ``started``: (monotonic time, global step, env steps)
    when this run's training started, the base of the rates (None: no rates yet)."""
    now = time.monotonic() if now is None else now
    step = int(trainer.global_step)
    max_steps = trainer.max_steps if trainer.max_steps is not None and trainer.max_steps > 0 \
        else None
    timer = next((cb for cb in trainer.callbacks if isinstance(cb, Timer)), None)
    run_s = now - started[0] if started is not None else 0.0
    elapsed = timer.time_elapsed("train") if timer is not None else run_s
    remaining = []
    if timer is not None and timer.time_remaining("train") is not None:
        remaining.append(max(0.0, timer.time_remaining("train")))
    env_steps = _env_steps(trainer)
    rate = None
    if started is not None and run_s > 0:
        steps_done = step - started[1]
        if max_steps is not None and steps_done > 0:
            remaining.append(max(0, max_steps - step) * run_s / steps_done)
        if env_steps is not None and started[2] is not None and env_steps > started[2]:
            rate = (env_steps - started[2]) / run_s
    return RLProgress(step, max_steps, env_steps, rate, elapsed,
                      min(remaining) if remaining else None,
                      _finite(trainer.progress_bar_metrics.get(RETURN_METRIC)))


class RLProgressBar(TQDMProgressBar):
    """Lightning's tqdm bar, its training line replaced by :func:`progress_text`.

    Args:
        refresh_rate: update the line every this many batches (Lightning's meaning).
        process_position: as Lightning's ``TQDMProgressBar``.
        leave: as Lightning's ``TQDMProgressBar``.
    """

    TRAIN_FORMAT = "{desc}"  # the line is the description: no batch count of an endless epoch

    def __init__(self, refresh_rate: int = 1, process_position: int = 0,
                 leave: bool = False) -> None:
        super().__init__(refresh_rate, process_position, leave)
        self._started: tuple[float, int, int | None] | None = None

    def init_train_tqdm(self) -> Tqdm:
        bar = super().init_train_tqdm()
        bar.bar_format = self.TRAIN_FORMAT
        return bar

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        # the rates start here: the data loader (the collector's start) is set up already
        env_steps = _env_steps(trainer)
        self._started = (time.monotonic(), trainer.global_step,
                         0 if env_steps is None else env_steps)

    def on_train_epoch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        super().on_train_epoch_start(trainer, *args)
        self.train_progress_bar.total = None
        self.train_progress_bar.set_description_str(self.text(trainer), refresh=False)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        bar = self.train_progress_bar
        if bar is not None and not bar.disable and self._should_update(batch_idx + 1, None):
            bar.n = batch_idx + 1
            bar.set_description_str(self.text(trainer, pl_module))

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.train_progress_bar.disable:
            self.train_progress_bar.set_description_str(self.text(trainer, pl_module))
        if self._leave:
            self.train_progress_bar.close()

    def text(self, trainer: pl.Trainer, pl_module: pl.LightningModule | None = None) -> str:
        """The training line for ``trainer`` now."""
        extra = {} if pl_module is None else self.get_metrics(trainer, pl_module)
        extra = {k: v for k, v in extra.items() if k not in _SHOWN}
        return progress_text(read_progress(trainer, self._started), extra)
