"""A failure in the user's own code ends the run with that exception as the last error: its
type, its message and a traceback through the user's function, not a secondary error from
teardown (a process group, the shared memory, the ring, a pipe) raised on the way out.

Each case fits in this process, single rank, a few steps: OmniStrategy (``configure_model``,
``configure_omni``, a LightningDataModule's ``setup``), Lightning's DDP with one rank, and
UniLab's RolloutDataModule in sync (inline and collector process) and async mode (a task's
constructor, a task method that raises while collecting)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch.distributed as dist

TESTS = Path(__file__).resolve().parents[1]
for _folder in ("omni", "unilab"):  # helpers of those folders (pytest adds them only there)
    if str(TESTS / _folder) not in sys.path:
        sys.path.insert(0, str(TESTS / _folder))

from omni_models import LazyToy, ToyData, make_model  # noqa: E402
from shm_probe import our_blocks  # noqa: E402
from test_user_task import PointMass  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

HERE = __name__  # the module path a collector process imports the task classes by


class UserBug(Exception):
    """What the user's code raises: a type nobody else raises."""


def _frames(excinfo: pytest.ExceptionInfo) -> list[str]:
    return [entry.name for entry in excinfo.traceback]


def _fit(module: pl.LightningModule, strategy, **fit_kwargs) -> None:
    """One rank in this process; the process group and the rendezvous variables it leaves are
    removed afterwards (a later test's group would collide with them)."""
    saved = dict(os.environ)
    try:
        trainer = pl.Trainer(accelerator="cpu", devices=1, strategy=strategy, max_steps=2,
                             logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False)
        trainer.fit(module, **fit_kwargs)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        os.environ.clear()
        os.environ.update(saved)


def _omni():
    from lightning_omni import OmniStrategy

    return OmniStrategy()


# ---------------------------------------------------------------------------- Omni and DDP


class BrokenBuild(LazyToy):
    def configure_model(self) -> None:
        raise UserBug("configure_model: the vision tower's checkpoint is missing")


class BrokenSpec(LazyToy):
    def configure_omni(self):
        raise UserBug("configure_omni: no block list named 'layers'")


class BrokenSetup(pl.LightningDataModule):
    def setup(self, stage: str) -> None:
        raise UserBug("setup: the shard index is empty")

    def train_dataloader(self) -> DataLoader:  # pragma: no cover - setup fails first
        return DataLoader(ToyData(8), batch_size=4)


@pytest.mark.parametrize("strategy", ["omni", "ddp"])
def test_configure_model_raising_is_the_last_error(strategy):
    with pytest.raises(UserBug, match="vision tower's checkpoint is missing") as err:
        _fit(BrokenBuild(), _omni() if strategy == "omni" else "ddp",
             train_dataloaders=DataLoader(ToyData(8), batch_size=4))
    assert "configure_model" in _frames(err)


def test_configure_omni_raising_is_the_last_error():
    with pytest.raises(UserBug, match="no block list named 'layers'") as err:
        _fit(BrokenSpec(), _omni(), train_dataloaders=DataLoader(ToyData(8), batch_size=4))
    assert "configure_omni" in _frames(err)


@pytest.mark.parametrize("strategy", ["omni", "ddp"])
def test_a_datamodule_setup_raising_is_the_last_error(strategy):
    with pytest.raises(UserBug, match="the shard index is empty") as err:
        _fit(make_model(0), _omni() if strategy == "omni" else "ddp", datamodule=BrokenSetup())
    assert "setup" in _frames(err)


# ---------------------------------------------------------------------------- UniLab


class BrokenConstructor(PointMass):
    def __init__(self, **kwargs) -> None:
        raise UserBug("the task's model file is not here")


class BrokenStep(PointMass):
    """Steps fine ``fail_after`` times, then its ``evaluate`` raises (inside the collector)."""

    def __init__(self, fail_after: int = 20, **kwargs) -> None:
        super().__init__(**kwargs)
        self.fail_after, self.calls = fail_after, 0

    def evaluate(self, pool, ids, actions, memory):
        self.calls += 1
        if self.calls > self.fail_after:
            raise UserBug(f"evaluate: the reward went NaN at call {self.calls}")
        return super().evaluate(pool, ids, actions, memory)


def _unilab_fit(task: str, mode: str, inline: bool | None, tmp_path: Path) -> None:
    from lightning_unilab.learner.appo import APPOModule
    from lightning_unilab.runtime.data import RolloutDataModule

    dm = RolloutDataModule({"class_path": f"{HERE}.{task}", "init_args": {}}, num_envs=4,
                           horizon=8, num_slots=2, mode=mode, inline=inline,
                           collector_threads=1, rollout_timeout=60.0)
    module = APPOModule(actor_hidden=(8,), critic_hidden=(8,), epochs=1, minibatches=1)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=50, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path)
    try:
        trainer.fit(module, datamodule=dm)
    finally:
        assert dm.collector is None, "the collector was left running"
        assert not our_blocks(), "shared memory left behind"


UNILAB_MODES = [("sync", True), ("sync", False), ("async", None)]


@pytest.mark.parametrize("mode,inline", UNILAB_MODES)
def test_a_task_constructor_raising_is_the_last_error(mode, inline, tmp_path):
    from lightning_unilab.envs.tasks.ref import TaskBuildError

    with pytest.raises(TaskBuildError, match=r"BrokenConstructor\(\*\*\{\}\) raised UserBug: "
                                             r"the task's model file is not here") as err:
        _unilab_fit("BrokenConstructor", mode, inline, tmp_path)
    cause = err.value.__cause__  # the user's own exception, with its traceback, is chained
    assert isinstance(cause, UserBug)
    frames = [f.name for f in __import__("traceback").extract_tb(cause.__traceback__)]
    assert "__init__" in frames


def test_a_task_raising_while_collecting_inline_is_the_last_error(tmp_path):
    with pytest.raises(UserBug, match="the reward went NaN") as err:
        _unilab_fit("BrokenStep", "sync", True, tmp_path)
    assert "evaluate" in _frames(err)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_collector_process_raising_is_the_last_error(mode, tmp_path):
    from lightning_unilab.runtime.collector import CollectorError

    with pytest.raises(CollectorError) as err:
        _unilab_fit("BrokenStep", mode, False, tmp_path)
    text = str(err.value)
    # the child's own traceback, ending with the user's error, reaches the learner
    assert "Traceback (most recent call last)" in text, text
    assert "in evaluate" in text, text
    assert text.rstrip().endswith("the reward went NaN at call 21"), text
