"""SIGKILL at seeded random moments of OmniStrategy's 2-rank sharded saves: the newest complete
checkpoint loads whole (every shard of one version), ``last.ckpt`` is always one whole version,
a removal cut short is refused by name, and a resume from it saves the next version
(docs/reliability.md, "Faults")."""

from __future__ import annotations

import os
import random
import signal
import socket
import time
from pathlib import Path

import pytest
import sharded_save_worker as worker

from lightning_omni.runtime import checkpoint as ckpt

SEEDS = range(6)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _saved(sent: list) -> int:
    return max((v for v in sent if isinstance(v, int)), default=0)


def _check_whole(directory: Path) -> int:
    """The version of a complete checkpoint, every shard of it checked."""
    found = set()
    for stage in range(ckpt.num_stages(directory)):
        shard = ckpt.read_shard(directory, stage)  # digest checked, weights only
        w = shard["state_dict"][f"stage{stage}.w"]
        assert shard["stage"] == stage and bool((w == float(shard["version"])).all())
        found.add(shard["version"])
    assert len(found) == 1, f"{directory}: shards of versions {sorted(found)}"
    return found.pop()


def _run(root: Path, saves: int, kill_after: float | None, victim: int) -> list[list]:
    """Two ranks saving; with ``kill_after``, SIGKILL ``victim`` that long after the first
    version is saved. Returns what each rank sent; the survivor must exit within 20 s."""
    port = _port()
    ranks = [worker.start(rank, port, root, saves) for rank in (0, 1)]
    procs = [proc for proc, _ in ranks]
    try:
        if kill_after is not None:
            assert ranks[0][1].poll(60) and isinstance(ranks[0][1].recv(), int), "no save"
            time.sleep(kill_after)
            procs[victim].kill()
        sent = [_received(conn) for _, conn in ranks]
        for proc in procs:
            proc.join(20)
        codes = [proc.exitcode for proc in procs]
        assert None not in codes, f"exit codes {codes}: a rank still ran 20 s later"
        if kill_after is None:
            assert codes == [0, 0], (codes, sent)
        else:
            assert codes[victim] == -signal.SIGKILL, (codes, sent)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
    return sent


def _received(conn) -> list:
    """Everything a rank sent until it exited (EOF)."""
    got = []
    while conn.poll(30):
        try:
            got.append(conn.recv())
        except EOFError:
            break
    return got


@pytest.mark.parametrize("seed", SEEDS)
def test_sigkill_at_a_random_moment_of_a_sharded_save_keeps_the_last_complete_one(tmp_path,
                                                                                  seed):
    rng = random.Random(seed)
    sent = _run(tmp_path, saves=10_000, kill_after=rng.uniform(0.0, 0.5),
                victim=rng.randrange(2))
    reported = min(_saved(rank_sent) for rank_sent in sent)
    newest = worker.newest_complete(tmp_path)
    assert newest >= max(1, reported), (newest, sent)
    assert _check_whole(tmp_path / f"step{newest}.ckpt") == newest
    for v in worker.versions(tmp_path):
        # beside it: the older one whose removal was cut short (a save cut short is only in
        # its staging directory)
        assert v in (newest - 1, newest), worker.versions(tmp_path)
        directory = tmp_path / f"step{v}.ckpt"
        if v == newest - 1 and ckpt.is_sharded(directory):
            assert _check_whole(directory) == v
        elif v != newest:
            with pytest.raises(FileNotFoundError, match=rf"step{v}\.ckpt is not a complete "
                                                        r"Omni checkpoint.*interrupted save"):
                ckpt.consolidate(directory)
    last = tmp_path / "last.ckpt"  # replaced in one step: always a whole version
    assert _check_whole(last) in (newest - 1, newest)  # saved after step{V}.ckpt
    # the resume continues from the newest complete checkpoint
    _run(tmp_path, saves=1, kill_after=None, victim=0)
    assert worker.newest_complete(tmp_path) == newest + 1
    assert _check_whole(tmp_path / f"step{newest + 1}.ckpt") == newest + 1
    assert _check_whole(last) == newest + 1
    # what the killed save left in staging directories is gone with the next save
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("k", range(1, 6))
def test_a_removal_cut_short_never_leaves_a_directory_marked_complete_with_a_shard_gone(
        tmp_path, monkeypatch, k):
    """ModelCheckpoint's top-k removes the older checkpoint: killed after its k-th file."""
    d = tmp_path / "step1.ckpt"
    for stage in (0, 1):
        ckpt.write_shard(d, stage, worker.shard(1, stage))
    ckpt.write_marker(d, 2)
    real, calls = os.unlink, []

    def unlink(path, *args, **kwargs):
        real(path, *args, **kwargs)
        calls.append(path)
        if len(calls) == k:
            raise SystemExit("killed")

    monkeypatch.setattr(os, "unlink", unlink)
    with pytest.raises(SystemExit):
        ckpt.remove(d)
    monkeypatch.undo()
    assert not ckpt.is_sharded(d) or _check_whole(d) == 1
