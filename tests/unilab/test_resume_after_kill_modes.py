"""An async APPO run and a DDP run of 2 learners, SIGKILLed with their whole process group at a
seeded random moment of ``fit`` (after a checkpoint) and resumed with ``ckpt_path``.

Both: the weights and the optimizer state at resume are the checkpoint's, the envs continue
from the checkpoint's state (every rank's), and nothing is left behind: no process of the
killed run, and its shared memory is reclaimed when the next run starts. DDP (sync, collected
in each learner's process): every update after the checkpoint logs the uninterrupted run's
losses and observations, rank by rank. Async: the collector's timing is not reproduced; what is,
and the bounds of what is not, are docs/reliability.md's ("Resume after a kill").
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from kill_run import HORIZON, NUM_ENVS, NUM_SLOTS, fit

from lightning_omnilab import safe_load
from lightning_unilab.runtime.checkpoint_arrays import unpack
from lightning_unilab.runtime.collector import CollectorConfig
from lightning_unilab.runtime.data import RolloutDataModule
from lightning_unilab.runtime.inline import InlineCollector

WORKER = Path(__file__).with_name("kill_run.py")
DM = "RolloutDataModule"


WAIT_S = 600  # a loaded machine; a run here takes seconds


@pytest.fixture
def start():
    """Start the run as a process of its own session (its pid is its process group's); any
    group still there when the test ends is killed."""
    groups = []

    def run(root: Path, mode: str, max_steps: int, tag: str, ckpt: Path | None = None):
        args = [sys.executable, str(WORKER), str(root), mode, str(max_steps), tag]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        with open(root / f"{tag}.stderr", "w") as err:  # a pipe left unread could fill
            child = subprocess.Popen(args + ([str(ckpt)] if ckpt else []),
                                     start_new_session=True, stdout=subprocess.DEVNULL,
                                     stderr=err, env=env)
        child.stderr_path = root / f"{tag}.stderr"
        groups.append(child)
        return child

    yield run
    for child in groups:
        if _session(child.pid):
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def _log(root: Path, tag: str, rank: int = 0) -> list[dict]:
    path = root / f"{tag}_rank{rank}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def _session(sid: int) -> set[int]:
    """Live processes of session ``sid`` (zombies are gone: only their exit status is left)."""
    pids = set()
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            pids.add(int(entry))
    return pids


def _blocks_of(pids: set[int]) -> set[str]:
    return {n for n in os.listdir("/dev/shm")
            if n.startswith("omnilab_") and int(n.rsplit("_", 2)[1]) in pids}


def _kill_at_random_moment(child: subprocess.Popen, root: Path, seed: int,
                           after_step: int) -> set[int]:
    """SIGKILL the run's process group once rank 0 has logged ``after_step`` (a checkpoint is
    saved after each step) plus a seeded random 0-300 ms; returns the pids it killed."""
    rng = random.Random(seed)
    deadline = time.monotonic() + WAIT_S
    while len(_log(root, "killed")) < after_step or not (root / "last.ckpt").exists():
        assert child.poll() is None, child.stderr_path.read_text()[-3000:]
        assert time.monotonic() < deadline, f"the run logged {after_step} updates in no less " \
                                            f"than {WAIT_S} s"
        time.sleep(0.01)
    time.sleep(rng.uniform(0.0, 0.3))
    pids = _session(child.pid)
    os.killpg(child.pid, signal.SIGKILL)
    assert child.wait(30) == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while _session(child.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _session(child.pid), "processes of the killed run are left"
    return pids


def _assert_restored(start: dict, ckpt: dict) -> None:
    """The weights and optimizer state a resumed fit started with are the checkpoint's."""
    assert start["global_step"] == ckpt["global_step"]
    assert start["model"].keys() == ckpt["state_dict"].keys()
    for name, value in ckpt["state_dict"].items():
        assert torch.equal(start["model"][name], value), name
    saved, got = ckpt["optimizer_states"][0], start["optimizer"]
    assert got["param_groups"] == saved["param_groups"]
    assert got["state"].keys() == saved["state"].keys() and saved["state"]
    for index, state in saved["state"].items():
        for key, value in state.items():
            assert torch.equal(got["state"][index][key], value), (index, key)


def _assert_same(got, want, where: str = "env") -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), where
        for key in want:
            _assert_same(got[key], want[key], f"{where}[{key!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            _assert_same(a, b, f"{where}[{i}]")
    else:
        assert np.array_equal(np.asarray(got), np.asarray(want)), where


def _collection(ckpt: dict, seed: int) -> dict:
    (mine,) = [c for c in ckpt[DM]["collections"] if c["seed"] == seed]
    return unpack(mine)


@pytest.mark.filterwarnings("ignore")
def test_an_async_run_killed_with_its_process_group_resumes_its_envs_and_learner(tmp_path,
                                                                                start):
    child = start(tmp_path, "async", 10_000, "killed")
    killed = _kill_at_random_moment(child, tmp_path, seed=0, after_step=3)
    # the ring and the weight board: their creator died with its collector, nobody removed them
    leaked = _blocks_of(killed)
    assert len(leaked) == 2, leaked
    ckpt = safe_load.load(tmp_path / "last.ckpt")
    step, more = ckpt["global_step"], 6
    assert step >= 1

    fit(tmp_path, "async", step + more, "resumed", ckpt_path=str(tmp_path / "last.ckpt"))
    assert not _blocks_of(killed), f"left in /dev/shm: {sorted(leaked)}"

    _assert_restored(torch.load(tmp_path / "resumed_start_rank0.pt", weights_only=False), ckpt)
    saved = _collection(ckpt, seed=3)
    learner, collector = ckpt[DM]["counters"], saved["rollout"]
    after = _log(tmp_path, "resumed")
    assert [line["step"] for line in after] == list(range(step + 1, step + more + 1))
    # the collector had collected, at most, a ring's worth that the learner had not read yet:
    # those rollouts are not trained on, and the counters count them
    assert 0 <= collector["seq"] - learner["seq"] <= NUM_SLOTS
    first = after[0]
    assert first["seq"] == collector["seq"]
    assert first["env_steps"] == collector["env_steps"] + NUM_ENVS * HORIZON
    assert first["episodes_total"] >= collector["episodes_total"]
    assert first["policy_version"] == ckpt[DM]["policy_version"] == step  # no lag at resume
    assert [line["seq"] for line in after] == list(range(first["seq"], first["seq"] + more))
    for line in _log(tmp_path, "killed") + after:  # the ring bounds the policy lag
        assert 0 <= line["lag"] <= NUM_SLOTS, line

    # the first rollout after the resume is the checkpoint's envs, action stream and weights
    # collected once more here: its every byte
    spec = RolloutDataModule("InvertedPendulum-v5", num_envs=NUM_ENVS,
                             horizon=HORIZON).rollout_spec
    config = CollectorConfig("InvertedPendulum-v5", NUM_ENVS, HORIZON, seed=3, mode="sync")
    policy = torch.load(tmp_path / "resumed_start_rank0.pt", weights_only=False)["policy"]
    again = InlineCollector(config, policy, spec, version=step)
    again.start(resume=saved)
    _assert_same(again.get_state()["env"], saved["env"])  # the envs' own state, not only obs
    slot, _ = again.acquire()
    batch = torch.load(tmp_path / "resumed_batch_rank0.pt")
    running = torch.as_tensor(collector["buffers"]["obs"], dtype=torch.float32)
    assert torch.equal(batch["obs"][0], running)  # the envs went on from the checkpoint's
    arrays = again.ring.arrays(slot)
    compared = sorted(set(arrays) & set(batch) - {"collect_s"})
    assert {"obs", "actions", "rewards"} <= set(compared), compared
    for name in compared:
        assert torch.equal(torch.as_tensor(arrays[name]), batch[name]), name
    again.stop()


@pytest.mark.filterwarnings("ignore")
def test_a_ddp_run_killed_with_its_process_group_resumes_every_ranks_envs(tmp_path, start):
    whole_root, root, last = tmp_path / "whole", tmp_path / "killed", 10
    whole_root.mkdir()
    root.mkdir()
    # one after the other: two DDP launches at once may draw the same free port, and then a
    # rank of one joins the other's group
    whole = start(whole_root, "ddp", last, "whole")
    assert whole.wait(WAIT_S) == 0, whole.stderr_path.read_text()[-3000:]
    child = start(root, "ddp", 10_000, "killed")
    killed = _kill_at_random_moment(child, root, seed=1, after_step=3)
    assert not _blocks_of(killed)
    ckpt = safe_load.load(root / "last.ckpt")
    step = ckpt["global_step"]
    assert 1 <= step < last - 1, step
    assert sorted(c["seed"] for c in ckpt[DM]["collections"]) == [3, 4]  # both ranks' envs

    resumed = start(root, "ddp", last, "resumed", root / "last.ckpt")
    assert resumed.wait(WAIT_S) == 0, resumed.stderr_path.read_text()[-3000:]
    for rank, seed in ((0, 3), (1, 4)):
        start_state = torch.load(root / f"resumed_start_rank{rank}.pt", weights_only=False)
        _assert_restored(start_state, ckpt)
        batch = torch.load(root / f"resumed_batch_rank{rank}.pt")
        running = _collection(ckpt, seed)["rollout"]["buffers"]["obs"]
        assert torch.equal(batch["obs"][0], torch.as_tensor(running, dtype=torch.float32))
        expected = {line["step"]: line for line in _log(whole_root, "whole", rank)}
        before = _log(root, "killed", rank)
        after = _log(root, "resumed", rank)
        assert [line["step"] for line in after] == list(range(step + 1, last + 1)), rank
        for line in before + after:  # losses compared with ==, observations by their bytes
            assert line == expected[line["step"]], (rank, line["step"])
