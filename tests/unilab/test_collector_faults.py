"""A collector killed or stopped during ``Trainer.fit`` (async mode) ends the run with an error
naming it, within a bounded time, and leaves no process and no shared memory behind."""

import os
import signal
import threading
import time

import lightning.pytorch as pl
import pytest
from shm_probe import our_blocks as _shm

from lightning_unilab.learner.appo import APPOModule
from lightning_unilab.runtime.collector import CollectorError
from lightning_unilab.runtime.data import RolloutDataModule

TASK = "InvertedPendulum-v5"
WATCHDOG_S = 20.0  # then a learner still waiting (protection planted out) is made to fail


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:  # a zombie not yet reaped counts as gone
        return f.read().rsplit(") ", 1)[1].startswith("Z")


class SignalCollector(pl.Callback):
    """Sends ``sig`` to the collector process after training step ``at``. A learner still
    waiting ``WATCHDOG_S`` later (one that would wait forever) gets its ring shut: its wait
    ends with a RuntimeError, not the CollectorError the test wants."""

    def __init__(self, sig: signal.Signals, at: int = 2) -> None:
        self.sig, self.at = sig, at
        self.pid: int | None = None
        self.sent = 0.0
        self.watchdog: threading.Timer | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx != self.at:
            return
        self.pid = trainer.datamodule.collector._proc.pid
        self.sent = time.monotonic()
        os.kill(self.pid, self.sig)
        self.watchdog = threading.Timer(WATCHDOG_S, trainer.datamodule.collector.ring.shut)
        self.watchdog.start()


def _fit_until_it_fails(sig: signal.Signals, rollout_timeout: float, tmp_path):
    dm = RolloutDataModule(TASK, num_envs=8, horizon=8, num_slots=2, mode="async",
                           collector_threads=1, rollout_timeout=rollout_timeout)
    module = APPOModule(actor_hidden=(16,), critic_hidden=(16,), epochs=1, minibatches=1)
    hook = SignalCollector(sig)
    trainer = pl.Trainer(accelerator="cpu", max_steps=10_000, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path,
                         callbacks=[hook])
    try:
        with pytest.raises(CollectorError) as err:
            trainer.fit(module, datamodule=dm)
        seconds = time.monotonic() - hook.sent
    finally:
        if hook.watchdog is not None:
            hook.watchdog.cancel()
    assert dm.collector is None
    assert hook.pid is not None and _gone(hook.pid), "the collector process is still there"
    assert not _shm(), "shared memory left behind"
    print(f"{sig.name}: CollectorError {seconds:.1f} s later: {err.value}")
    return str(err.value), seconds


def test_a_sigkilled_collector_ends_the_fit_naming_it_and_its_signal(tmp_path):
    # the timeout is long: a dead collector must be reported by the liveness check, not by it
    msg, seconds = _fit_until_it_fails(signal.SIGKILL, 30.0, tmp_path)
    assert "the collector process omnilab-collector-0 (pid " in msg
    assert "was killed by signal 9 (SIGKILL)" in msg
    assert seconds < 5, f"reported {seconds:.1f} s after the kill"


def test_a_stopped_collector_ends_the_fit_at_the_rollout_timeout(tmp_path):
    msg, seconds = _fit_until_it_fails(signal.SIGSTOP, 2.0, tmp_path)
    assert "the collector process omnilab-collector-0 (pid " in msg
    assert "sent no rollout within 2.0 s; it is alive but stopped (SIGSTOP" in msg
    assert "rollout_timeout" in msg
    assert 2.0 <= seconds < 8, f"reported {seconds:.1f} s after the stop"


def test_rollout_timeout_is_checked_by_name():
    for bad in (0, -1.0, float("nan"), "soon"):
        with pytest.raises((TypeError, ValueError), match="rollout_timeout"):
            RolloutDataModule(TASK, rollout_timeout=bad)
