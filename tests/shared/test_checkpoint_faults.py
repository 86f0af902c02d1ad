"""Faults during a checkpoint save lose nothing (docs/reliability.md, "Faults").

The RL checkpoint path is the one ``unilab-train`` gives its Trainer (``use_atomic_checkpoints``:
``AtomicCheckpointIO`` over ``safe_load.save`` and ``lightning_omnilab.durable``, which
OmniStrategy's shards use too). A worker
process saves in a loop and is SIGKILLed at every step of a save (before each rename, halfway
through a copy) and at seeded random moments; afterwards the file at the path loads, holds one
whole version, and a resume from it continues. A full disk raises ``OSError`` naming the file and
keeps the previous checkpoint, with no temporary file left.
"""

from __future__ import annotations

import errno
import os
import random
import signal
import time
from pathlib import Path

import checkpoint_fault_worker as worker
import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.plugins.io import TorchCheckpointIO

from lightning_omnilab import durable, safe_load
from lightning_omnilab.checkpoint_io import AtomicCheckpointIO
from lightning_unilab.train import use_atomic_checkpoints

SHM = "/dev/shm"


def _cross_device_tmp(tmp_path: Path) -> str:
    """A temporary directory on another file system than ``tmp_path`` (/dev/shm), as a tmpfs
    /tmp is: the case where a temporary file moved into place is a copy, not a rename."""
    if not os.path.isdir(SHM) or os.stat(SHM).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another file system than the test's tmp_path")
    d = Path(SHM) / f"omnilab-faults-{os.getpid()}"
    d.mkdir(exist_ok=True)
    return str(d)


def _io() -> AtomicCheckpointIO:
    """The checkpoint IO the train command gives its Trainer."""
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)
    use_atomic_checkpoints(trainer)
    return trainer.strategy.checkpoint_io


def _run(io, path: Path, saves: int, fault: str | None, tmpdir: str) -> tuple[int, str]:
    pid, lines = worker.fork(io, path, saves, fault, tmpdir)
    with lines:
        out = lines.read()
    return worker.wait(pid), out


def _load(path: Path) -> int:
    """The version at ``path``, checked whole (every value of the tensor is the version)."""
    ckpt = AtomicCheckpointIO().load_checkpoint(path, weights_only=True)
    v = ckpt["version"]
    w = ckpt["state_dict"]["w"]
    assert w.numel() == 1 << 21 and bool((w == float(v)).all()), f"version {v}: mixed contents"
    return v


def _saved(out: str) -> list[int]:
    return [int(line.split()[1]) for line in out.splitlines() if line.startswith("saved ")]


@pytest.fixture
def tmp_elsewhere(tmp_path):
    d = _cross_device_tmp(tmp_path)
    yield d
    for p in Path(d).iterdir():
        p.unlink()
    os.rmdir(d)


def test_train_command_sets_the_atomic_checkpoint_io_and_keeps_a_chosen_one():
    trainer = Trainer(accelerator="cpu", logger=False, enable_checkpointing=False)
    assert use_atomic_checkpoints(trainer)
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)

    class Mine(AtomicCheckpointIO):
        pass

    trainer = Trainer(accelerator="cpu", logger=False, enable_checkpointing=False,
                      plugins=[Mine()])
    assert not use_atomic_checkpoints(trainer)
    assert type(trainer.strategy.checkpoint_io) is Mine


# before the 1st .. 5th rename: the digest naming old and new, the file, the new digest, and
# the same in the next save; halfway through a copy of the file into place
@pytest.mark.parametrize("fault", ["replace:1", "replace:2", "replace:3", "replace:4",
                                   "replace:5", "sendfile:1"])
def test_sigkill_at_each_step_of_a_save_keeps_a_whole_checkpoint_and_resume_continues(
        tmp_path, tmp_elsewhere, fault):
    path = tmp_path / "last.ckpt"
    io = _io()
    assert _run(io, path, 1, None, tmp_elsewhere) == (0, "saved 1\n")
    code, out = _run(io, path, 2, fault, tmp_elsewhere)
    assert code in (0, -signal.SIGKILL), out
    saved = _saved(out)
    v = _load(path)  # neither refused nor torn
    assert v in {1 + len(saved), 2 + len(saved)} and v <= 3, (v, saved)
    # resume continues from it
    assert _run(io, path, 1, None, tmp_elsewhere) == (0, f"saved {v + 1}\n")
    assert _load(path) == v + 1
    # nothing a reader could take for a checkpoint, and no copy left in the temporary directory:
    # at most the finished file a kill just before its rename left under its hidden name
    left = sorted(p.name for p in tmp_path.iterdir())
    assert [n for n in left if not n.startswith(".")] == ["last.ckpt", "last.ckpt.sha256"], left
    assert len(left) <= 3 and all(n.endswith(".tmp") for n in left if n.startswith(".")), left
    assert not os.listdir(tmp_elsewhere)


def test_sigkill_at_random_moments_of_saves_keeps_the_last_whole_checkpoint(
        tmp_path, tmp_elsewhere):
    rng = random.Random(0)
    path = tmp_path / "last.ckpt"
    io = _io()
    last = 0
    for _ in range(5):
        pid, lines = worker.fork(io, path, 1000, None, tmp_elsewhere)
        with lines:
            try:
                first = lines.readline()  # one save done: the kill lands in a later one
                assert first.startswith("saved "), first
                time.sleep(rng.uniform(0.0, 0.4))
            finally:
                os.kill(pid, signal.SIGKILL)
            out = first + lines.read()
        assert worker.wait(pid) == -signal.SIGKILL
        saved = _saved(out)
        v = _load(path)
        assert saved[-1] <= v <= saved[-1] + 1 and v > last, (v, saved, last)
        last = v
    assert not os.listdir(tmp_elsewhere)


def test_lightning_default_checkpoint_io_leaves_a_torn_file_when_killed_mid_copy(
        tmp_path, tmp_elsewhere):
    """Why the train command replaces it: with its temporary file on another file system,
    Lightning's TorchCheckpointIO copies into the final name, and a kill there leaves a torn
    checkpoint (and the temporary copy). If Lightning makes this atomic, this test says so."""
    path = tmp_path / "epoch=0-step=1.ckpt"
    code, out = _run(TorchCheckpointIO(), path, 1, "sendfile:1", tmp_elsewhere)
    assert code == -signal.SIGKILL, out
    assert path.exists() and 0 < path.stat().st_size < (1 << 23)  # torn, under its name
    with pytest.raises(Exception):  # noqa: B017 - whatever torch's reader makes of it
        torch.load(path, weights_only=True)
    assert os.listdir(tmp_elsewhere)  # and the whole temporary copy stays behind


def test_a_torn_checkpoint_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"state_dict": {"w": torch.ones(1000)}}, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # e.g. copied elsewhere by a tool that died
    with pytest.raises(safe_load.CorruptCheckpointError, match="last.ckpt"):
        io.load_checkpoint(path)
    io.remove_checkpoint(path)  # ModelCheckpoint's top-k removal takes the digest too
    assert not list(tmp_path.iterdir())


class _FullDisk:
    """``open`` whose files take ``room`` bytes, then fail as a full disk does."""

    def __init__(self, room: int):
        self.room = room

    def __call__(self, file, mode="r", *args, **kwargs):
        f = open(file, mode, *args, **kwargs)  # noqa: SIM115
        if "w" not in mode:
            return f
        real_write, budget = f.write, {"left": self.room}

        def write(data):
            n = len(data)
            if n > budget["left"]:
                real_write(data[: budget["left"]])
                budget["left"] = 0
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            budget["left"] -= n
            return real_write(data)

        f.write = write
        return f


@pytest.mark.parametrize("room", [0, 100_000])
def test_full_disk_during_a_save_names_the_file_and_keeps_the_previous_checkpoint(
        tmp_path, monkeypatch, room):
    path = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"version": 1, "state_dict": {"w": torch.ones(100_000)}}, path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    monkeypatch.setattr(durable, "open", _FullDisk(room), raising=False)
    with pytest.raises(OSError, match="last.ckpt: not saved .*previous checkpoint") as err:
        io.save_checkpoint({"version": 2, "state_dict": {"w": torch.zeros(100_000)}}, path)
    assert err.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # nothing left over
    assert io.load_checkpoint(path)["version"] == 1


def test_a_full_disk_is_reported_as_one_by_safe_load(tmp_path, monkeypatch):
    """torch's own file writer says "unexpected pos ..." on a full disk; written through a
    Python file, the error is ENOSPC."""
    target = tmp_path / "stage0.pt"
    monkeypatch.setattr(durable, "open", _FullDisk(10), raising=False)
    with pytest.raises(OSError, match="No space left on device") as err:
        safe_load.save({"w": torch.ones(10)}, target)
    assert err.value.errno == errno.ENOSPC and not list(tmp_path.iterdir())
