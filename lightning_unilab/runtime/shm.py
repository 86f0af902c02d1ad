"""Named shared-memory blocks whose mapping lives as long as any numpy view of it.

``multiprocessing.shared_memory.SharedMemory`` unmaps its block on ``close()`` (and when it is
garbage collected) even while numpy arrays made from ``shm.buf`` still point into it, because
numpy keeps a reference to the buffer object, not a buffer export: touching such an array, or a
torch tensor made from it, then crashes the process. Here SharedMemory only creates, registers
and unlinks the name; the mapping is a separate ``mmap`` that is the base of every view, so it is
unmapped only when the last view is gone. Linux (/dev/shm).

A creator holds a shared ``flock`` on its block for as long as it lives: the kernel drops it
when the process dies, however it died. A run killed with its whole process group (``kill -9``
of the group, a job scheduler's kill) takes its collector and Python's resource tracker with
it, so nobody is left to unlink its blocks; :func:`reclaim_orphans`, run before every new
block, removes those whose creator is gone (no lock held, and the pid in the name is not
alive here: a block of a run in another pid namespace that shares /dev/shm keeps its lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import secrets
import weakref
from multiprocessing import shared_memory

import numpy as np

__all__ = ["SHM_DIR", "SHM_PREFIX", "SharedBlock", "free_shm_bytes", "new_name", "reclaim_orphans",
           "unlink_name"]

log = logging.getLogger(__name__)

SHM_PREFIX = "omnilab_"
SHM_DIR = "/dev/shm"


def free_shm_bytes() -> int:
    """Free bytes of the file system behind shared memory."""
    st = os.statvfs(SHM_DIR)
    return st.f_bavail * st.f_frsize


def new_name(kind: str) -> str:
    """``omnilab_<kind>_<pid>_<random>``: recognizable, and the creator's pid is in the name."""
    return f"{SHM_PREFIX}{kind}_{os.getpid()}_{secrets.token_hex(4)}"


def _creator_alive(name: str) -> bool:
    try:
        pid = int(name.rsplit("_", 2)[1])
    except (IndexError, ValueError):
        return True  # not a name of ours: leave it
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie has let go of everything
            return f.read().rsplit(") ", 1)[1][:1] != "Z"
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def reclaim_orphans() -> list[str]:
    """Remove our blocks whose creator is gone (see the module docstring); returns their names."""
    removed = []
    for name in sorted(os.listdir(SHM_DIR)):
        if not name.startswith(SHM_PREFIX) or _creator_alive(name):
            continue
        path = os.path.join(SHM_DIR, name)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:  # gone meanwhile, or not ours to open
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a living creator holds it shared
            os.unlink(path)
        except OSError:
            continue
        finally:
            os.close(fd)
        removed.append(name)
    if removed:
        log.warning("removed %d shared-memory block(s) left in %s by processes that are gone "
                    "(a run killed with its process group): %s", len(removed), SHM_DIR,
                    ", ".join(removed))
    return removed


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


def _unlink(shm: shared_memory.SharedMemory, lock_fd: int) -> None:
    try:
        shm.unlink()
    except FileNotFoundError:
        pass
    finally:
        with contextlib.suppress(OSError):
            os.close(lock_fd)


class SharedBlock:
    """A named block of ``size`` bytes: created (``create=True``, unlinked by :meth:`unlink` or
    at interpreter exit) or attached; ``buf`` is a uint8 numpy view of it."""

    def __init__(self, name: str, size: int, create: bool) -> None:
        shm = shared_memory.SharedMemory(name=name, create=create, size=size if create else 0)
        shm.close()  # its own mapping is not used; the name stays until unlink
        self.name = name
        self._shm = shm
        self._finalizer = None
        try:
            fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
        except BaseException:
            if create:
                _unlink(shm, -1)
            raise
        if create:  # the creator's lock, kept until the block is unlinked or the process ends
            lock_fd = os.dup(fd)
            fcntl.flock(lock_fd, fcntl.LOCK_SH)
            self._finalizer = weakref.finalize(self, _unlink, shm, lock_fd)
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
