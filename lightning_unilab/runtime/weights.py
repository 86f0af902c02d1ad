"""Versioned weight board: the learner publishes its policy's ``state_dict`` into shared memory,
the collector loads it when the version moved.

The block holds every tensor of the state dict (parameters and buffers, the observation
normalizer's statistics included) at fixed offsets, behind a seqlock: the writer makes the
sequence word odd, copies, stores the version and makes it even again; a reader copies only from
an even word and keeps the copy if the word did not change meanwhile, otherwise it retries. The
learner therefore never waits for the collector; a reader sees one whole version or retries.
Sequence words go through ``_core`` atomics (acquire/release on the mapped memory); the end check
of a read is a fetch-add of 0 so that the payload reads cannot move after it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from lightning_omnilab.validate import ArgumentTypeError, fail, integer
from lightning_unilab import _core
from lightning_unilab.runtime.ring import wait_until
from lightning_unilab.runtime.shm import SharedBlock, free_shm_bytes, new_name, reclaim_orphans

__all__ = ["BoardHandle", "WeightBoard", "TornReadError"]

_ALIGN = 64
_HEADER = 64  # words: seq, version, magic
_SEQ, _VERSION, _MAGIC_W = 0, 1, 2
_MAGIC = 0x6F6D6E69_77656967  # "omniweig"


class TornReadError(RuntimeError):
    """The writer kept publishing during every retry of a read."""


@dataclass(frozen=True)
class BoardHandle:
    """What another process needs to attach (picklable): name and the state dict's layout."""

    name: str
    layout: tuple[tuple[str, tuple[int, ...], str, int], ...]  # (key, shape, dtype, offset)
    nbytes: int


def _layout(state: Mapping[str, torch.Tensor]) -> tuple[tuple, int]:
    entries, offset = [], _HEADER
    for key, tensor in state.items():
        dtype = str(tensor.dtype).removeprefix("torch.")
        entries.append((key, tuple(tensor.shape), dtype, offset))
        offset += -(-tensor.numel() * tensor.element_size() // _ALIGN) * _ALIGN
    return tuple(entries), offset


def _check_publishable(key: str, got: object, held: torch.Tensor) -> None:
    """``got`` fits ``held`` without a silent change: the same shape (a broadcast would copy),
    the same dtype, or floating point on both sides (a NaN or a fraction cast to an integer,
    a complex cast to real, would be)."""
    if not isinstance(got, torch.Tensor):
        fail(f"state_dict[{key!r}]", "a torch.Tensor", type(got).__name__, ArgumentTypeError)
    if tuple(got.shape) != tuple(held.shape):
        fail(f"state_dict[{key!r}]", f"a tensor of shape {tuple(held.shape)}, as the board holds",
             tuple(got.shape))
    if got.dtype != held.dtype and not (got.dtype.is_floating_point and
                                        held.dtype.is_floating_point):
        fail(f"state_dict[{key!r}]", f"a tensor of dtype {held.dtype} (or another floating "
             "dtype for a floating one), as the board holds", got.dtype)


class WeightBoard:
    """One policy's state dict in shared memory with a version; :meth:`create` / :meth:`attach`."""

    def __init__(self, block: SharedBlock, handle: BoardHandle) -> None:
        self._block = block
        self.handle = handle
        self._words = np.ndarray((_HEADER // 8,), np.uint64, block.buf)
        self._tensors = {
            key: torch.from_numpy(np.ndarray(shape, np.dtype(dtype), block.buf, offset))
            for key, shape, dtype, offset in handle.layout
        }

    @classmethod
    def create(cls, module: nn.Module, version: int = 0) -> WeightBoard:
        """A board shaped like ``module.state_dict()``, holding it as ``version``."""
        version = integer("version", version, minimum=0, below=2**64)  # before any memory
        state = module.state_dict()
        layout, nbytes = _layout(state)
        for key, _, dtype, _ in layout:
            if dtype not in ("float32", "float64", "float16", "int64", "int32", "bool"):
                raise ValueError(f"state_dict[{key!r}]: dtype {dtype} cannot be published")
        reclaim_orphans()  # blocks of a run killed with its process group count as free
        if nbytes > free_shm_bytes():
            raise ValueError(f"the weight board needs {nbytes / 2**20:.1f} MiB of shared memory "
                             f"but /dev/shm has {free_shm_bytes() / 2**20:.1f} MiB free")
        name = new_name("weights")
        board = cls(SharedBlock(name, nbytes, create=True), BoardHandle(name, layout, nbytes))
        board._words[_MAGIC_W] = _MAGIC
        board.publish(module, version)
        return board

    @classmethod
    def attach(cls, handle: BoardHandle) -> WeightBoard:
        board = cls(SharedBlock(handle.name, handle.nbytes, create=False), handle)
        if int(board._words[_MAGIC_W]) != _MAGIC:
            board.close()
            raise ValueError(f"shared memory {handle.name!r} is not a weight board")
        return board

    @property
    def name(self) -> str:
        return self.handle.name

    @property
    def version(self) -> int:
        """Version of the last completed publish."""
        return int(_core.atomic_load(self._words, _VERSION))

    def publish(self, module: nn.Module | Mapping[str, torch.Tensor], version: int) -> None:
        """Write ``module``'s state dict (any device) as ``version`` (single writer)."""
        state = module.state_dict() if isinstance(module, nn.Module) else module
        if set(state) != set(self._tensors):
            missing = sorted(set(self._tensors) - set(state))
            extra = sorted(set(state) - set(self._tensors))
            raise ValueError(f"state_dict: keys differ from the board's (missing {missing[:4]}, "
                             f"unexpected {extra[:4]})")
        version = integer("version", version, minimum=0, below=2**64)
        for key, dst in self._tensors.items():
            _check_publishable(key, state[key], dst)
        _core.atomic_fetch_add(self._words, _SEQ, 1)  # odd: write in progress
        try:
            with torch.no_grad():
                for key, dst in self._tensors.items():
                    dst.copy_(state[key].detach())
            _core.atomic_store(self._words, _VERSION, version)
        finally:
            _core.atomic_fetch_add(self._words, _SEQ, 1)  # even: consistent again

    def read_into(self, module: nn.Module | Mapping[str, torch.Tensor],
                  retries: int = 10000) -> int:
        """Copy the latest whole version into ``module``'s tensors; returns that version."""
        state = module.state_dict() if isinstance(module, nn.Module) else module
        for _ in range(retries):
            before = _core.atomic_load(self._words, _SEQ)
            if before % 2:
                time.sleep(1e-4)  # a publish is under way: it takes well under a millisecond
                continue
            version = int(_core.atomic_load(self._words, _VERSION))
            with torch.no_grad():
                for key, src in self._tensors.items():
                    state[key].copy_(src)
            if _core.atomic_fetch_add(self._words, _SEQ, 0) == before:
                return version
            time.sleep(1e-4)
        raise TornReadError(f"weight board {self.name}: no consistent read in {retries} tries")

    def wait_for(self, version: int, timeout: float | None = None,
                 alive: Callable[[], None] | None = None,
                 stop: Callable[[], bool] | None = None) -> bool:
        """Wait until a version >= ``version`` is published (False on timeout or stop)."""
        return wait_until(lambda: self.version >= version, timeout, alive, stop)

    def close(self) -> None:
        """Drop this object's views (the mapping goes with the last view still held)."""
        self._tensors = {}
        self._words = None  # type: ignore[assignment]

    def unlink(self) -> None:
        """Remove the block from /dev/shm (creator; idempotent; also run at interpreter exit)."""
        self._block.unlink()
