"""Named shared-memory blocks whose mapping lives as long as any numpy view of it.

``multiprocessing.shared_memory.SharedMemory`` unmaps its block on ``close()`` (and when it is
garbage collected) even while numpy arrays made from ``shm.buf`` still point into it, because
numpy keeps a reference to the buffer object, not a buffer export: touching such an array, or a
torch tensor made from it, then crashes the process. Here SharedMemory only creates, registers
and unlinks the name; the mapping is a separate ``mmap`` that is the base of every view, so it is
unmapped only when the last view is gone. Linux (/dev/shm).
"""

from __future__ import annotations

import mmap
import os
import secrets
import weakref
from multiprocessing import shared_memory

import numpy as np

__all__ = ["SHM_DIR", "SHM_PREFIX", "SharedBlock", "free_shm_bytes", "new_name", "unlink_name"]

SHM_PREFIX = "omnilab_"
SHM_DIR = "/dev/shm"


def free_shm_bytes() -> int:
    """Free bytes of the file system behind shared memory."""
    st = os.statvfs(SHM_DIR)
    return st.f_bavail * st.f_frsize


def new_name(kind: str) -> str:
    """``omnilab_<kind>_<pid>_<random>``: recognizable, and the creator's pid is in the name."""
    return f"{SHM_PREFIX}{kind}_{os.getpid()}_{secrets.token_hex(4)}"


def unlink_name(name: str) -> None:
    """Remove a block's name (no error if it is gone already)."""
    try:
        shm = shared_memory.SharedMemory(name=name)
    except FileNotFoundError:
        return
    shm.close()
    try:
        shm.unlink()
    except FileNotFoundError:
        pass


def _unlink(shm: shared_memory.SharedMemory) -> None:
    try:
        shm.unlink()
    except FileNotFoundError:
        pass


class SharedBlock:
    """A named block of ``size`` bytes: created (``create=True``, unlinked by :meth:`unlink` or
    at interpreter exit) or attached; ``buf`` is a uint8 numpy view of it."""

    def __init__(self, name: str, size: int, create: bool) -> None:
        shm = shared_memory.SharedMemory(name=name, create=create, size=size if create else 0)
        shm.close()  # its own mapping is not used; the name stays until unlink
        self.name = name
        self._shm = shm
        self._finalizer = weakref.finalize(self, _unlink, shm) if create else None
        try:
            fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
        except BaseException:
            self.unlink()
            raise
        try:
            if os.fstat(fd).st_size < size:
                raise ValueError(f"shared memory {name!r} is smaller than {size} bytes")
            mapping = mmap.mmap(fd, size)
        except BaseException:
            self.unlink()
            raise
        finally:
            os.close(fd)
        # numpy keeps `mapping` alive as the base of every view; nobody calls mapping.close()
        self.buf: np.ndarray = np.frombuffer(mapping, np.uint8)

    def unlink(self) -> None:
        """Remove the name (creator only; idempotent). Mappings stay valid until dropped."""
        if self._finalizer is not None:
            self._finalizer()
