"""Bytes of activations held for backward, counted through saved-tensor hooks.

On CPU there is no allocator statistic per purpose; the tensors autograd saves for backward are
what a pipeline stage accumulates while microbatches are in flight, so they are what we count.
Parameters saved by an op (a linear layer saves its weight) are not activations and are skipped;
a storage saved twice counts once. A DTensor (tensor parallelism) counts its local shard.
"""

from __future__ import annotations

import weakref
from contextlib import AbstractContextManager

import torch
from torch import Tensor


class SavedTensorMeter:
    """Live and peak bytes of saved activations; use ``meter.hooks()`` around forward code."""

    def __init__(self, params: list[Tensor]) -> None:
        self._param_ptrs = {_local(p).untyped_storage().data_ptr() for p in params
                            if _local(p).numel()}
        self._refs: dict[int, int] = {}
        self.live = 0
        self.peak = 0

    def reset_peak(self) -> None:
        self.peak = self.live

    def hooks(self) -> AbstractContextManager:
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t: Tensor) -> object:
        storage = _local(t).untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self._param_ptrs or storage.nbytes() == 0:
            return t
        handle = _Held(t)
        if self._refs.get(ptr, 0) == 0:
            self.live += storage.nbytes()
            self.peak = max(self.peak, self.live)
        self._refs[ptr] = self._refs.get(ptr, 0) + 1
        weakref.finalize(handle, self._release, ptr, storage.nbytes())
        return handle

    def _release(self, ptr: int, nbytes: int) -> None:
        self._refs[ptr] -= 1
        if self._refs[ptr] == 0:
            del self._refs[ptr]
            self.live -= nbytes

    @staticmethod
    def _unpack(obj: object) -> Tensor:
        return obj.tensor if isinstance(obj, _Held) else obj


def _local(t: Tensor) -> Tensor:
    """A DTensor's local shard (its storage is the process's memory), a tensor as it is."""
    inner = getattr(t, "_local_tensor", None)  # DTensor, without importing torch.distributed
    return inner if isinstance(inner, Tensor) else t


class _Held:
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: Tensor) -> None:
        self.tensor = tensor
