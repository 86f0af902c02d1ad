"""Shared-memory ring: slot protocol, no torn reads across processes, config errors, cleanup."""

import multiprocessing as mp
import os
import time

import numpy as np
import pytest

from lightning_unilab.runtime.ring import FREE, READING, READY, WRITING, Ring
from lightning_unilab.runtime.rollout import RolloutSpec

SPEC = RolloutSpec(num_envs=32, horizon=16, obs_size=24, critic_size=24, action_size=4)
FILLED = ("obs", "critic_obs", "actions", "rewards", "final_critic_obs", "last_critic_obs")


def _ours() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("omnilab_")}


def _fill(arrays, seq: int) -> None:
    # field by field, element rows one at a time: a slot read while this runs would mix values
    for name in FILLED:
        arr = arrays[name]
        for row in range(arr.shape[0]):
            arr[row] = seq
    arrays["seq"][()] = seq


def _writer(handle, count: int, slow_every: int) -> None:
    ring = Ring.attach(handle)
    try:
        for seq in range(count):
            slot = ring.acquire_write(timeout=30)
            assert slot is not None, "writer timed out"
            _fill(ring.arrays(slot), seq)
            ring.commit(slot, seq=seq, policy_version=seq // 3, env_steps=seq * 512)
    finally:
        ring.close()


def _check_slot(ring: Ring, slot: int) -> int:
    arrays = ring.arrays(slot)
    seq = int(arrays["seq"])
    for name in FILLED:
        values = np.unique(arrays[name])
        assert values.tolist() == [seq], f"torn slot: {name} holds {values[:5]} for seq {seq}"
    head = ring.header(slot)
    assert head["seq"] == seq and head["policy_version"] == seq // 3
    return seq


@pytest.mark.parametrize("policy", ["block", "overwrite_oldest"])
def test_two_processes_never_tear_a_slot(policy):
    count = 400
    ctx = mp.get_context("fork")  # the protocol is the same; fork skips re-importing torch
    with Ring.create(SPEC, num_slots=3, writer_policy=policy) as ring:
        proc = ctx.Process(target=_writer, args=(ring.handle, count, 7))
        proc.start()
        seen = []
        try:
            while len(seen) + ring.overwritten < count:
                slot = ring.acquire_read(timeout=30)
                assert slot is not None, "reader timed out"
                seen.append(_check_slot(ring, slot))
                if len(seen) % 5 == 0:
                    # a slow read: the writer runs on and (overwrite_oldest) recycles slots
                    time.sleep(0.002)
                    _check_slot(ring, slot)
                ring.release(slot)
        finally:
            proc.join(30)
        assert proc.exitcode == 0
        assert seen == sorted(seen) and len(set(seen)) == len(seen)  # oldest first, once each
        if policy == "block":
            assert seen == list(range(count)) and ring.overwritten == 0
        else:
            assert len(seen) + ring.overwritten == count and ring.overwritten > 0
    assert not any(ring.name in n for n in _ours())


def test_slot_states_and_overwrite_never_takes_a_read_slot():
    with Ring.create(SPEC, num_slots=2, writer_policy="overwrite_oldest") as ring:
        a = ring.acquire_write(timeout=0)
        ring.commit(a, seq=0)
        b = ring.acquire_write(timeout=0)
        assert sorted(ring.states()) == sorted([READY, WRITING])
        ring.commit(b, seq=1)
        r = ring.acquire_read(timeout=0)
        assert r == a and ring.states()[r] == READING  # the oldest first
        c = ring.acquire_write(timeout=0)
        assert c == b and ring.overwritten == 1  # took back the READY one, not the READING one
        assert ring.acquire_write(timeout=0.01) is None  # one writing, one being read
        ring.release(r)
        assert ring.states()[r] == FREE
        with pytest.raises(RuntimeError, match="not in READING"):
            ring.release(r)


def test_block_policy_waits_and_shut_wakes_waiters():
    with Ring.create(SPEC, num_slots=2) as ring:
        for seq in range(2):
            ring.commit(ring.acquire_write(timeout=0), seq=seq)
        assert ring.acquire_write(timeout=0.02) is None
        ring.shut()
        assert ring.acquire_write() is None and ring.acquire_read(timeout=None) is not None


def test_alive_callback_aborts_a_wait():
    def dead() -> None:
        raise RuntimeError("peer is gone")

    with Ring.create(SPEC, num_slots=2) as ring, pytest.raises(RuntimeError, match="peer"):
        ring.acquire_read(alive=dead)


def test_impossible_configs_fail_before_allocation():
    huge = RolloutSpec(num_envs=1 << 16, horizon=1 << 12, obs_size=512, critic_size=512,
                       action_size=64)
    before = _ours()
    with pytest.raises(ValueError, match="lower num_envs, horizon or num_slots"):
        Ring.create(huge)
    with pytest.raises(ValueError, match="num_slots"):
        Ring.create(SPEC, num_slots=1)
    with pytest.raises(ValueError, match="writer_policy"):
        Ring.create(SPEC, writer_policy="newest")
    assert _ours() == before


def test_block_is_unlinked_when_the_ring_is_dropped():
    ring = Ring.create(SPEC)
    name = ring.name
    assert name in _ours()
    ring.close()
    del ring
    assert name not in _ours()


def test_ring_and_weight_board_are_readable_by_their_owner_only():
    """Rollouts and weights in /dev/shm: other users of the machine may not read them."""
    import stat

    import torch

    from lightning_unilab.runtime.shm import SHM_DIR
    from lightning_unilab.runtime.weights import WeightBoard

    with Ring.create(SPEC, num_slots=2) as ring:
        mode = os.stat(os.path.join(SHM_DIR, ring.name)).st_mode
        assert stat.S_IMODE(mode) & 0o077 == 0, oct(mode)
    board = WeightBoard.create(torch.nn.Linear(2, 2))
    try:
        mode = os.stat(os.path.join(SHM_DIR, board.handle.name)).st_mode
        assert stat.S_IMODE(mode) & 0o077 == 0, oct(mode)
    finally:
        board.close()
        board.unlink()
