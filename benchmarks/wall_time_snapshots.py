"""A Lightning callback that saves the policy as it stands at given wall times of one run.

One run of the longest budget then gives the policy each shorter budget would have ended with
(nothing in the recipes depends on ``max_time``), so a 15- and 60-minute comparison costs 60
minutes per system instead of 75. Lightning's ``ModelCheckpoint(train_time_interval=...)`` does
not serve: under manual optimization (APPO's) it saves only on ``every_n_train_steps``.

    --trainer.callbacks+='{"class_path": "wall_time_snapshots.WallTimeSnapshots",
                           "init_args": {"seconds": [900], "dirpath": "DIR"}}'

with ``benchmarks/`` on ``PYTHONPATH``. Each save appends a line to ``DIR/snapshots.jsonl``:
the budget, the seconds since fit start it was taken at, and the optimizer step.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer


class WallTimeSnapshots(Callback):
    """Save ``DIR/wall_{s}s.ckpt`` at the first batch end at least ``s`` seconds after fit start.

    Args:
        seconds: the wall times, in seconds from ``on_train_start`` (where Lightning's ``Timer``
            starts ``max_time``).
        dirpath: where the checkpoints and ``snapshots.jsonl`` go.
    """

    def __init__(self, seconds: list[float], dirpath: str) -> None:
        if not seconds or any(not s > 0 for s in seconds):
            raise ValueError(f"seconds: expected positive wall times, got {seconds!r}")
        self.seconds = sorted(float(s) for s in seconds)
        self.dirpath = Path(dirpath)
        self._start: float | None = None
        self._left: list[float] = []

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start = time.monotonic()
        self._left = list(self.seconds)
        self.dirpath.mkdir(parents=True, exist_ok=True)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        if self._start is None or not self._left:
            return
        elapsed = time.monotonic() - self._start
        if elapsed < self._left[0]:
            return
        budget = self._left.pop(0)
        trainer.save_checkpoint(self.dirpath / f"wall_{budget:g}s.ckpt")
        with open(self.dirpath / "snapshots.jsonl", "a") as f:
            f.write(json.dumps({"budget_s": budget, "at_s": elapsed,
                                "global_step": trainer.global_step}) + "\n")
