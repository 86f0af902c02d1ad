"""Numpy arrays inside a Lightning checkpoint, which loads with ``weights_only=True``.

Weights-only loading refuses numpy arrays (their pickle names numpy's reconstructors) and torch
has no tensor type for every numpy dtype (uint64 splitmix64 counters, uint32 status bits), so
an array travels as its raw bytes in a uint8 tensor with its dtype and shape beside it:
exact for every dtype, and plain data :mod:`lightning_omnilab.safe_load` reads back.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["pack", "unpack"]

_MARK = "__ndarray__"


def pack(obj: Any) -> Any:
    """``obj`` with every numpy array (inside dicts, lists, tuples) as checkpointable data."""
    if isinstance(obj, np.ndarray):
        raw = np.ascontiguousarray(obj).reshape(-1).view(np.uint8)
        return {_MARK: obj.dtype.str, "shape": list(obj.shape),
                "bytes": torch.from_numpy(raw.copy())}
    if isinstance(obj, dict):
        return {key: pack(value) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(pack(value) for value in obj)
    return obj


def unpack(obj: Any) -> Any:
    """:func:`pack`'s inverse: the same arrays, bit for bit (fresh, writable)."""
    if isinstance(obj, dict) and _MARK in obj:
        data = obj["bytes"]
        if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8:
            raise ValueError(f"{_MARK}: expected the bytes of an array as a uint8 tensor, got "
                             f"{type(data).__name__}")
        dtype = np.dtype(obj[_MARK])
        return np.frombuffer(data.numpy().tobytes(), dtype).reshape(obj["shape"]).copy()
    if isinstance(obj, dict):
        return {key: unpack(value) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(unpack(value) for value in obj)
    return obj
