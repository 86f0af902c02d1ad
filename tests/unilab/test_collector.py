"""Collector process: weights versions, sync waiting, faults surfacing, cleanup when killed."""

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from shm_probe import our_blocks as _shm

from lightning_unilab.learner.policy import ActorCritic
from lightning_unilab.runtime.collector import Collector, CollectorConfig, CollectorError
from lightning_unilab.runtime.rollout import RolloutSpec, as_tensors

TASK = "InvertedPendulum-v5"


def _policy() -> ActorCritic:
    return ActorCritic(4, 4, 1, (16,), (16,))


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie (exited, not yet reaped by its parent) counts as gone
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ", 1)[1].startswith("Z")


def test_sync_mode_waits_for_each_update_and_faults_surface_with_traceback():
    """One process through its life: sync lag 0, a waiting collector, then a crash."""
    policy = _policy()
    collector = Collector(CollectorConfig(TASK, num_envs=8, horizon=16, mode="sync"), policy,
                          num_slots=3)
    try:
        collector.start()
        for version in range(3):
            slot, _ = collector.acquire(timeout=30)
            stats = as_tensors(collector.ring.arrays(slot))["stats"]
            assert stats["policy_version"] == version and stats["seq"] == version
            collector.release(slot)
            # no newer weights yet: a sync collector does not produce the next rollout
            assert collector.acquire(timeout=0.3)[0] is None
            assert collector.publish(policy) == version + 1
        # NaN weights: the actor fails inside the collector process
        with torch.no_grad():
            policy.actor[0].weight.fill_(float("nan"))
        collector.publish(policy)
        start = time.monotonic()
        failed = "(?s)Traceback.*(NaN or inf in the actions|invalid values)"
        with pytest.raises(CollectorError, match=failed):
            while True:
                slot, _ = collector.acquire(timeout=30)
                collector.release(slot)
        assert time.monotonic() - start < 5
    finally:
        collector.stop()
    assert not _shm()


def test_start_errors_raise_here_or_come_back_from_the_process():
    policy = _policy()
    config = CollectorConfig(TASK, num_envs=8, horizon=8,
                             task_kwargs={"params": {"no_such_param": 1.0}})
    with pytest.raises(ValueError, match="no_such_param"):  # found here, before spawning
        Collector(config, policy)
    # given the spec, the parent builds no env of its own: the error comes from the process
    spec = RolloutSpec(num_envs=8, horizon=8, obs_size=4, critic_size=4, action_size=1)
    bad = Collector(config, policy, spec=spec)
    with pytest.raises(CollectorError, match="(?s)Traceback.*no_such_param"):
        bad.start()
    assert not _shm() and not bad.running
    bad.stop()  # what the data module's clean-up does next: the blocks are gone, no second error


@pytest.mark.parametrize(
    ("config", "match"),
    [
        (dict(num_envs=0, horizon=8), "num_envs"),
        (dict(num_envs=8, horizon=0), "horizon"),
        (dict(num_envs=8, horizon=8, threads=os.cpu_count() + 1), "collector threads"),
        (dict(num_envs=8, horizon=8, mode="lockstep"), "mode"),
    ],
)
def test_impossible_configs_fail_before_a_process_starts(config, match):
    with pytest.raises(ValueError, match=match):
        Collector(CollectorConfig(TASK, **config), _policy())
    assert not _shm()


def test_policy_of_the_wrong_size_is_refused():
    with pytest.raises(ValueError, match="policy.obs_size: the network takes 5 but task"):
        Collector(CollectorConfig(TASK, 8, 8), ActorCritic(5, 5, 1, (8,), (8,)))


LEARNER = textwrap.dedent("""
    import sys, time
    from lightning_unilab.runtime.collector import Collector, CollectorConfig
    from lightning_unilab.learner.policy import ActorCritic

    if __name__ == "__main__":
        policy = ActorCritic(4, 4, 1, (8,), (8,))
        c = Collector(CollectorConfig("InvertedPendulum-v5", 8, 8), policy)
        c.start()
        print(c._proc.pid, c.ring.name, c.board.name, flush=True)
        time.sleep(600)
""")


def test_sigkilled_learner_leaves_no_process_and_no_shared_memory(tmp_path):
    script = tmp_path / "learner.py"
    script.write_text(LEARNER)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line, "the learner did not start"
        pid, ring, board = line.split()
        assert {ring, board} <= set(os.listdir("/dev/shm"))
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (_gone(int(pid)) and
                                                  not {ring, board} & set(os.listdir("/dev/shm"))):
            time.sleep(0.05)
        assert _gone(int(pid)), "the collector outlived its learner"
        assert not {ring, board} & set(os.listdir("/dev/shm")), "shared memory left behind"
    finally:
        if proc.poll() is None:
            proc.kill()


def _collect_one() -> None:
    collector = Collector(CollectorConfig(TASK, 8, 8), _policy())
    try:
        collector.start()
        slot, _ = collector.acquire(timeout=60)
        collector.release(slot)
    finally:
        collector.stop()


def test_a_forked_learner_still_starts_collectors():
    """Lightning's ddp_fork: a child of a process whose forkserver is running."""
    import multiprocessing as mp

    _collect_one()  # this process now runs a forkserver
    child = mp.get_context("fork").Process(target=_collect_one)
    child.start()
    child.join(120)
    assert child.exitcode == 0


def test_the_start_method_threads_and_fallbacks_are_logged(caplog, monkeypatch):
    """INFO: how the collector was started and with how many threads; WARNING: each fallback
    from forkserver to spawn, which used to be silent."""
    from lightning_unilab.runtime import collector as collector_module

    caplog.set_level(logging.INFO, logger="lightning_unilab.runtime.collector")
    _collect_one()
    started = [r.getMessage() for r in caplog.records
               if r.name == "lightning_unilab.runtime.collector" and r.levelno == logging.INFO]
    assert len(started) == 1, started
    assert "by forkserver" in started[0] and "1 pool threads and 1 torch thread" in started[0]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING
                and r.name == "lightning_unilab.runtime.collector"]

    caplog.clear()  # a child forked from the forkserver's owner (Lightning's ddp_fork)
    monkeypatch.setattr(collector_module, "_FORKSERVER_OWNER", [os.getpid() + 1])
    assert collector_module._context().get_start_method() == "spawn"
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert f"forked from process {os.getpid() + 1}" in record.getMessage()

    caplog.clear()  # a platform without forkserver
    monkeypatch.setattr(collector_module.mp, "get_all_start_methods", lambda: ["spawn"])
    assert collector_module._context().get_start_method() == "spawn"
    [record] = caplog.records
    assert record.levelno == logging.WARNING and "no forkserver" in record.getMessage()


def test_a_seed_gives_the_same_rollouts():
    """Two sync runs of one seed write the same data; another seed writes other data."""

    def first_actions(seed: int) -> torch.Tensor:
        torch.manual_seed(0)
        collector = Collector(CollectorConfig(TASK, num_envs=4, horizon=8, mode="sync", seed=seed),
                              _policy(), num_slots=2)
        try:
            collector.start()
            slot, _ = collector.acquire(timeout=30)
            actions = as_tensors(collector.ring.arrays(slot))["actions"].clone()
            collector.release(slot)
            return actions
        finally:
            collector.stop()

    assert torch.equal(first_actions(3), first_actions(3))
    assert not torch.equal(first_actions(3), first_actions(4))
