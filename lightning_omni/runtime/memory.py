"""Bytes of activations held for backward, counted through saved-tensor hooks.

On CPU there is no allocator statistic per purpose; the tensors autograd saves for backward are
what a pipeline stage accumulates while microbatches are in flight, so they are what we count.
Parameters saved by an op (a linear layer saves its weight) are not activations and are skipped;
a storage saved twice counts once. A wrapper tensor subclass (a DTensor under tensor
parallelism, the ``AsyncCollectiveTensor`` a row-parallel layer returns) has no storage of its
own: it counts the storages of the tensors it wraps.
"""

from __future__ import annotations

import weakref
from contextlib import AbstractContextManager

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor


class SavedTensorMeter:
    """Live and peak bytes of saved activations; use ``meter.hooks()`` around forward code."""

    def __init__(self, params: list[Tensor]) -> None:
        self._param_ptrs = {ptr for p in params for ptr, _ in _storages(p)}
        self._refs: dict[int, int] = {}
        self.live = 0
        self.peak = 0

    def reset_peak(self) -> None:
        self.peak = self.live

    def hooks(self) -> AbstractContextManager:
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t: Tensor) -> object:
        held = [(ptr, n) for ptr, n in _storages(t) if ptr not in self._param_ptrs]
        if not held:
            return t
        handle = _Held(t)
        for ptr, nbytes in held:
            if self._refs.get(ptr, 0) == 0:
                self.live += nbytes
                self.peak = max(self.peak, self.live)
            self._refs[ptr] = self._refs.get(ptr, 0) + 1
            weakref.finalize(handle, self._release, ptr, nbytes)
        return handle

    def _release(self, ptr: int, nbytes: int) -> None:
        self._refs[ptr] -= 1
        if self._refs[ptr] == 0:
            del self._refs[ptr]
            self.live -= nbytes

    @staticmethod
    def _unpack(obj: object) -> Tensor:
        return obj.tensor if isinstance(obj, _Held) else obj


def _storages(t: Tensor) -> list[tuple[int, int]]:
    """(data pointer, bytes) of each non-empty storage holding ``t``'s memory. A wrapper
    subclass (``__tensor_flatten__``, torch's protocol for tensor subclasses: DTensor wraps
    its local shard, ``AsyncCollectiveTensor`` a collective's output) is walked to the plain
    tensors it wraps; its own ``untyped_storage()`` is no real storage (it raises)."""
    flatten = getattr(t, "__tensor_flatten__", None)
    if flatten is not None:
        inner = [getattr(t, name) for name in flatten()[0]]
        return [s for x in inner if isinstance(x, Tensor) for s in _storages(x)]
    storage = t.untyped_storage()
    if not storage.nbytes():
        return []
    # a fake tensor's storage (FakeTensorMode, lightning_omni.fake_run) has no data pointer
    # (0 for all): the address of its storage object tells it apart instead
    key = storage._cdata if isinstance(t, FakeTensor) else storage.data_ptr()
    return [(key, storage.nbytes())]


class _Held:
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: Tensor) -> None:
        self.tensor = tensor
