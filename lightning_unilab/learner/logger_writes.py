"""Metrics written to a Trainer's loggers without ``self.log``, where and when Lightning writes.

``LightningModule.log`` keeps a tracked metric per key (for ``callback_metrics``, monitors and
the progress bar); at a few dozen keys per update that costs milliseconds of every update
cycle (``benchmarks/rl_breakdown.py``). A learner's diagnostics that nothing monitors go to
the loggers directly, at the step Lightning gives this training step's ``self.log`` values and
only on the steps it writes them (``log_every_n_steps``), so TensorBoard shows one x-axis.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def lightning_log_step(trainer: Any) -> int | None:
    """The logger step of the running training step, or None where Lightning writes no
    step metrics now (outside fit, ``log_every_n_steps`` not due, no logger)."""
    if not trainer.loggers or not trainer.training:
        return None
    connector = getattr(trainer, "_logger_connector", None)
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    if connector is None or loop is None or not connector.should_update_logs:
        return None
    # the counter Lightning's own step metrics use (LoggerConnector.log_metrics' default)
    return int(loop._batches_that_stepped)


def write_to_loggers(trainer: Any, metrics: Mapping[str, float]) -> None:
    """``metrics`` to every logger of ``trainer`` at ``lightning_log_step``, if due."""
    step = lightning_log_step(trainer)
    if step is None or not metrics:
        return
    for logger in trainer.loggers:
        logger.log_metrics(dict(metrics), step=step)
