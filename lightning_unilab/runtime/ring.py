"""Shared-memory ring of rollout slots between a collector process (writer) and the learner.

One shared-memory block (:class:`~lightning_unilab.runtime.shm.SharedBlock`) holds a global header
and K slots; each slot is a 64-byte header plus one rollout batch in the
:class:`~lightning_unilab.runtime.rollout.RolloutSpec` layout. A slot's state moves

    FREE --writer--> WRITING --commit--> READY --reader--> READING --release--> FREE

and every change is a compare-exchange or atomic store on the state word (``_core.atomic_*``,
lock-free 64-bit atomics on the mapped memory), so a reader only ever sees a slot after its
writer committed it and a writer never touches a slot being read. The header's ``order`` word
(a global commit counter) lets the reader take the oldest ready slot.

Writer policies: ``"block"`` waits for a free slot; ``"overwrite_oldest"`` takes back the oldest
READY slot when none is free (never a READING one) and counts it in :attr:`Ring.overwritten`.

Waiting is polling with a short sleep (50 us growing to 1 ms): rollouts take tens of
milliseconds or more, and polling keeps the protocol to the atomics alone (no semaphores that a
killed process could leave locked). Waits call an ``alive`` callback every 50 ms so that either
side notices a dead peer instead of hanging.

The creator owns the block: :meth:`Ring.unlink` (also run by a finalizer at exit) removes it from
/dev/shm. Block names start with ``omnilab_`` so that leftovers are easy to spot.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from lightning_omnilab.validate import integer, one_of
from lightning_unilab import _core
from lightning_unilab.runtime.rollout import RolloutSpec
from lightning_unilab.runtime.shm import (
    SHM_PREFIX,
    SharedBlock,
    free_shm_bytes,
    new_name,
    reclaim_orphans,
)

__all__ = ["FREE", "READING", "READY", "WRITING", "Ring", "RingHandle", "SHM_PREFIX",
           "free_shm_bytes", "wait_until"]

FREE, WRITING, READY, READING = 0, 1, 2, 3
WRITER_POLICIES = ("block", "overwrite_oldest")


def check_num_slots(num_slots: object) -> int:
    """A ring needs two slots at least: one written while one is read."""
    return integer("num_slots", num_slots, minimum=2, why="one written while one is read")
_MAGIC = 0x6F6D6E69_72696E67  # "omniring"
_PAGE = 4096
_HEADER_WORDS = 8  # per slot: state, order, seq, policy_version, env_steps, spare x3
# global header words
_G_MAGIC, _G_SLOTS, _G_SLOT_BYTES, _G_CLOSED, _G_ORDER, _G_OVERWRITTEN = range(6)
# slot header words
_S_STATE, _S_ORDER, _S_SEQ, _S_VERSION, _S_ENV_STEPS = range(5)


def wait_until(
    ready: Callable[[], bool],
    timeout: float | None = None,
    alive: Callable[[], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> bool:
    """Poll ``ready``: True once it holds, False on ``timeout`` or ``stop``; ``alive`` may raise."""
    deadline = None if timeout is None else time.monotonic() + timeout
    sleep, next_check = 5e-5, time.monotonic() + 0.05
    while True:
        if ready():
            return True
        now = time.monotonic()
        if stop is not None and stop():
            return False
        if deadline is not None and now >= deadline:
            return False
        if alive is not None and now >= next_check:
            alive()
            next_check = now + 0.05
        time.sleep(sleep)
        sleep = min(sleep * 2, 1e-3)


@dataclass(frozen=True)
class RingHandle:
    """What another process needs to attach (picklable)."""

    name: str
    spec: RolloutSpec
    num_slots: int
    writer_policy: str


class Ring:
    """K rollout slots in one shared-memory block; create with :meth:`create`, attach with
    :meth:`attach`."""

    def __init__(self, block: SharedBlock, handle: RingHandle, owner: bool) -> None:
        self._block = block
        self.handle = handle
        self.spec = handle.spec
        self.num_slots = handle.num_slots
        self.writer_policy = handle.writer_policy
        self.owner = owner
        self._slot_bytes = self.slot_bytes(handle.spec)
        self._words = np.ndarray((self.num_slots * _HEADER_WORDS + 8,), np.uint64, block.buf)
        self._gw = self._words[:8]
        self._hw = [self._words[8 + i * _HEADER_WORDS: 8 + (i + 1) * _HEADER_WORDS]
                    for i in range(self.num_slots)]
        base = self._payload_base(self.num_slots)
        self._views = [handle.spec.views(block.buf, base + i * self._slot_bytes)
                       for i in range(self.num_slots)]

    @property
    def buffer(self) -> np.ndarray:
        """The whole shared block, as bytes (what a CUDA learner page-locks in place)."""
        return self._block.buf

    # ------------------------------------------------------------------ construction

    @staticmethod
    def slot_bytes(spec: RolloutSpec) -> int:
        return -(-spec.nbytes // _PAGE) * _PAGE

    @staticmethod
    def _payload_base(num_slots: int) -> int:
        return -(-(8 + num_slots * _HEADER_WORDS) * 8 // _PAGE) * _PAGE

    @classmethod
    def block_bytes(cls, spec: RolloutSpec, num_slots: int) -> int:
        return cls._payload_base(num_slots) + num_slots * cls.slot_bytes(spec)

    @classmethod
    def check_config(cls, spec: RolloutSpec, num_slots: int, writer_policy: str) -> int:
        """Raise ValueError for a config that cannot work; return the block's bytes."""
        check_num_slots(num_slots)
        one_of("writer_policy", writer_policy, WRITER_POLICIES)
        reclaim_orphans()  # blocks of a run killed with its process group count as free
        need, free = cls.block_bytes(spec, num_slots), free_shm_bytes()
        if need > free:
            raise ValueError(
                f"the ring needs {need / 2**20:.1f} MiB of shared memory ({num_slots} slots of "
                f"{cls.slot_bytes(spec) / 2**20:.1f} MiB for N={spec.num_envs} envs x "
                f"T={spec.horizon} steps) but /dev/shm has {free / 2**20:.1f} MiB free: lower "
                "num_envs, horizon or num_slots, or enlarge /dev/shm (docker: --shm-size)")
        return need

    @classmethod
    def create(cls, spec: RolloutSpec, num_slots: int = 4, writer_policy: str = "block") -> Ring:
        size = cls.check_config(spec, num_slots, writer_policy)
        name = new_name("ring")
        ring = cls(SharedBlock(name, size, create=True),
                   RingHandle(name, spec, num_slots, writer_policy), owner=True)
        g = ring._gw
        g[_G_SLOTS], g[_G_SLOT_BYTES] = num_slots, ring._slot_bytes
        _core.atomic_store(g, _G_MAGIC, _MAGIC)
        return ring

    @classmethod
    def attach(cls, handle: RingHandle) -> Ring:
        size = cls.block_bytes(handle.spec, handle.num_slots)
        ring = cls(SharedBlock(handle.name, size, create=False), handle, owner=False)
        g = ring._gw
        if (_core.atomic_load(g, _G_MAGIC) != _MAGIC or int(g[_G_SLOTS]) != handle.num_slots
                or int(g[_G_SLOT_BYTES]) != ring._slot_bytes):
            ring.close()
            raise ValueError(f"shared memory {handle.name!r} is not a ring of this layout")
        return ring

    # ------------------------------------------------------------------ state

    @property
    def name(self) -> str:
        return self.handle.name

    @property
    def closed(self) -> bool:
        """Set by :meth:`shut`: waiting writers and readers give up."""
        return _core.atomic_load(self._gw, _G_CLOSED) != 0

    def shut(self) -> None:
        _core.atomic_store(self._gw, _G_CLOSED, 1)

    @property
    def overwritten(self) -> int:
        """READY slots the writer took back under ``overwrite_oldest`` (rollouts never read)."""
        return int(_core.atomic_load(self._gw, _G_OVERWRITTEN))

    def states(self) -> list[int]:
        return [int(_core.atomic_load(h, _S_STATE)) for h in self._hw]

    def arrays(self, slot: int) -> dict[str, np.ndarray]:
        """Numpy views of a slot's batch fields (valid while the block is mapped)."""
        return self._views[slot]

    def header(self, slot: int) -> dict[str, int]:
        h = self._hw[slot]
        return {"state": int(_core.atomic_load(h, _S_STATE)), "order": int(h[_S_ORDER]),
                "seq": int(h[_S_SEQ]), "policy_version": int(h[_S_VERSION]),
                "env_steps": int(h[_S_ENV_STEPS])}

    # ------------------------------------------------------------------ writer

    def _try_write(self) -> int | None:
        for i, h in enumerate(self._hw):
            if _core.atomic_compare_exchange(h, _S_STATE, FREE, WRITING):
                return i
        if self.writer_policy != "overwrite_oldest":
            return None
        ready = [(int(h[_S_ORDER]), i) for i, h in enumerate(self._hw)
                 if _core.atomic_load(h, _S_STATE) == READY]
        for _, i in sorted(ready):
            if _core.atomic_compare_exchange(self._hw[i], _S_STATE, READY, WRITING):
                _core.atomic_fetch_add(self._gw, _G_OVERWRITTEN, 1)
                return i
        return None

    def acquire_write(self, timeout: float | None = None,
                      alive: Callable[[], None] | None = None) -> int | None:
        """A slot in WRITING state for the caller, or None on timeout or :meth:`shut`."""
        return self._acquire(self._try_write, timeout, alive)

    def commit(self, slot: int, seq: int = 0, policy_version: int = 0,
               env_steps: int = 0) -> None:
        """Publish a written slot: header first, then the state word (release)."""
        h = self._hw[slot]
        if _core.atomic_load(h, _S_STATE) != WRITING:
            raise RuntimeError(f"slot {slot}: commit of a slot not in WRITING state")
        h[_S_ORDER] = _core.atomic_fetch_add(self._gw, _G_ORDER, 1)
        h[_S_SEQ], h[_S_VERSION], h[_S_ENV_STEPS] = seq, policy_version, env_steps
        _core.atomic_store(h, _S_STATE, READY)

    # ------------------------------------------------------------------ reader

    def _try_read(self) -> int | None:
        while True:
            ready = [(int(h[_S_ORDER]), i) for i, h in enumerate(self._hw)
                     if _core.atomic_load(h, _S_STATE) == READY]
            if not ready:
                return None
            order, slot = min(ready)
            h = self._hw[slot]
            if _core.atomic_compare_exchange(h, _S_STATE, READY, READING):
                if int(h[_S_ORDER]) == order:
                    return slot
                # recycled and committed again between the scan and the exchange
                # (overwrite_oldest): an older slot may be waiting, so hand this one back
                _core.atomic_store(h, _S_STATE, READY)
            # the writer took it back (overwrite_oldest): look again

    def acquire_read(self, timeout: float | None = None,
                     alive: Callable[[], None] | None = None) -> int | None:
        """The oldest READY slot, now READING, or None on timeout or :meth:`shut`."""
        return self._acquire(self._try_read, timeout, alive)

    def _acquire(self, attempt: Callable[[], int | None], timeout: float | None,
                 alive: Callable[[], None] | None) -> int | None:
        """Poll ``attempt`` until it takes a slot; None on timeout or :meth:`shut`."""
        got: list[int] = []

        def ready() -> bool:
            slot = attempt()
            if slot is not None:
                got.append(slot)
            return slot is not None

        if wait_until(ready, timeout, alive, lambda: self.closed):
            return got[0]
        return None

    def release(self, slot: int) -> None:
        if not _core.atomic_compare_exchange(self._hw[slot], _S_STATE, READING, FREE):
            raise RuntimeError(f"slot {slot}: release of a slot not in READING state")

    # ------------------------------------------------------------------ teardown

    def close(self) -> None:
        """Drop this object's views; the mapping goes with the last view anyone still holds."""
        self._views, self._hw = [], []
        self._gw = self._words = None  # type: ignore[assignment]

    def unlink(self) -> None:
        """Remove the block from /dev/shm (owner; idempotent; also run at interpreter exit)."""
        self._block.unlink()

    def __enter__(self) -> Ring:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        self.unlink()
