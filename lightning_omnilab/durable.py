"""Durable saves: a file is replaced whole, stays saved through a power loss, and carries its
SHA-256 beside it (``lightning_omnilab.digests``). Every checkpoint the project writes
(Lightning's, through ``AtomicCheckpointIO``; OmniStrategy's shards), and the weights and motion
clips it exports, go through ``staged`` or ``open_durable``.

``os.replace`` alone keeps a killed process from leaving half a file, not a power loss: the
bytes and the rename may still be in the page cache, so after "saved" the file or its
directory entry can be gone after a reboot. ``staged``:

1. the bytes go to a temporary file in the target's directory: an unnamed one (Linux
   ``O_TMPFILE``), so a writer killed mid-write leaves nothing behind; elsewhere a hidden
   ``.<name>.<pid>-<hex>.tmp``. Any exception removes it and leaves the old file as it was;
2. the file is ``fsync``ed, then hashed, read back: the digest is of the bytes on file,
   whatever wrote them (torch, safetensors, numpy);
3. the digest file is replaced to name the old and the new digest, the file is renamed over
   the target, and the digest file replaced to name the new digest only: a kill between two
   renames leaves a complete file that its digest file accepts;
4. the directory is ``fsync``ed after each rename, so the renames reach the disk in order.

A file at the target is kept until its replacement is complete: ``last.ckpt`` is replaced
atomically; a link there (Lightning's ``save_last="link"``) is replaced, not its target.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
import shutil
from collections.abc import Iterator
from typing import IO

from lightning_omnilab import digests

__all__ = ["open_durable", "remove", "rename", "replace_directory", "staged", "write_bytes"]

_PROC_FD = "/proc/self/fd"


class _Temp:
    """The file being written, in the target's directory; ``path`` is where a writer opens it."""

    def __init__(self, target: str, unnamed: bool) -> None:
        self.directory = os.path.dirname(os.path.abspath(target))
        self.dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        self.name: str | None = None  # its name in the directory, once it has one
        try:
            try:
                if not unnamed:
                    raise OSError(errno.EOPNOTSUPP, "a writer that opens the file by name")
                self.fd = self._unnamed()
            except OSError:
                self.fd = self._named(os.path.basename(target))
        except BaseException:
            os.close(self.dir_fd)
            raise
        self.path = (f"{_PROC_FD}/{self.fd}" if self.name is None
                     else os.path.join(self.directory, self.name))

    def _unnamed(self) -> int:
        if not hasattr(os, "O_TMPFILE") or not os.path.isdir(_PROC_FD):
            raise OSError(errno.EOPNOTSUPP, "no O_TMPFILE here")
        return os.open(".", os.O_TMPFILE | os.O_RDWR, 0o666, dir_fd=self.dir_fd)

    def _named(self, target_name: str) -> int:
        self.name = f".{target_name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
        return os.open(self.name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666, dir_fd=self.dir_fd)

    def sync(self, digest: bool) -> str | None:
        """``fsync`` the written file (opened anew: a writer may have replaced the one made
        here, as safetensors does) and return its SHA-256 if ``digest``."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
            if not digest:
                return None
            with os.fdopen(os.dup(fd), "rb") as f:
                return digests.file_digest(f)
        finally:
            os.close(fd)

    def give_name(self, target_name: str) -> str:
        """The finished file's path under a hidden name (an unnamed file is linked there)."""
        if self.name is None:
            name = f".{target_name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
            os.link(self.path, name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd,
                    follow_symlinks=True)  # linkat(AT_SYMLINK_FOLLOW): the open file itself
            self.name = name
        return os.path.join(self.directory, self.name)

    def sync_directory(self) -> None:
        os.fsync(self.dir_fd)

    def discard(self) -> None:
        if self.name is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.name, dir_fd=self.dir_fd)

    def close(self) -> None:
        os.close(self.fd)
        os.close(self.dir_fd)


@contextlib.contextmanager
def staged(path: str | os.PathLike, *, digest: bool = True,
           what: str = "file") -> Iterator[str]:
    """A path to write ``path``'s new contents to (for a writer that takes a file name:
    safetensors' ``save_file``); when the block ends, the file is made durable and put at
    ``path``, with its digest unless ``digest=False``. An ``OSError`` (a full disk) is raised
    again naming ``path`` and ``what`` it is; the previous file there is unchanged."""
    with _staging(os.fspath(path), digest, what, unnamed=False) as temp:
        yield temp.path


@contextlib.contextmanager
def open_durable(path: str | os.PathLike, mode: str = "wb", *, digest: bool = True,
                 what: str = "file") -> Iterator[IO]:
    """``staged`` for a writer that takes a file object (``torch.save(obj, f)``, ``np.savez``,
    text); the file has no name until it is complete."""
    with _staging(os.fspath(path), digest, what, unnamed=True) as temp, \
            open(temp.path, mode) as f:
        yield f
        f.flush()
        os.fsync(f.fileno())


@contextlib.contextmanager
def _staging(path: str, digest: bool, what: str, unnamed: bool) -> Iterator[_Temp]:
    try:
        temp = _Temp(path, unnamed)
    except OSError as err:
        raise _named(err, path, what, False) from err
    put = False
    try:
        yield temp
        new = temp.sync(digest)
        if new is not None:  # the old file or the new one: both pass while they swap
            _write_digests(path, [*_old_digests(path), new])
        os.replace(temp.give_name(os.path.basename(path)), path)
        put = True
        temp.sync_directory()
        if new is not None:
            _write_digests(path, [new])
    except BaseException as err:
        temp.discard()
        if _os_error(err) is None:
            raise
        raise _named(err, path, what, put) from err
    finally:
        temp.close()


def write_bytes(path: str | os.PathLike, data: bytes | str, *, digest: bool = True) -> None:
    """``data`` durably at ``path`` (text is written as UTF-8)."""
    raw = data.encode() if isinstance(data, str) else data
    with open_durable(path, "wb", digest=digest) as f:
        f.write(raw)


def rename(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Move a finished file, and its digest, over ``dst`` (as ``staged`` puts a file there)."""
    src, dst = os.fspath(src), os.fspath(dst)
    found = digests.expected(src)
    new = found[0][-1] if found is not None else digests.file_digest(src)
    _write_digests(dst, [*_old_digests(dst), new])
    os.replace(src, dst)
    _sync_directory_of(dst)
    _write_digests(dst, [new])
    remove(digests.digest_path(src))


def remove(path: str | os.PathLike) -> None:
    """Remove a file and its digest file (a missing one is no error), durably."""
    path = os.fspath(path)
    for p in (path, digests.digest_path(path)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)
    _sync_directory_of(path)


def replace_directory(new: str | os.PathLike, target: str | os.PathLike) -> None:
    """Put the finished directory ``new`` at ``target`` in one step (a sharded checkpoint over
    ``last.ckpt``) and remove what was there. One step is Linux's ``renameat2`` exchange; where
    the file system lacks it (NFS, another OS) the old one is first renamed aside to
    ``.<name>.old``, so a kill between the two renames leaves it complete there."""
    new, target = os.fspath(new), os.fspath(target)
    if not os.path.lexists(target):
        os.rename(new, target)
    else:
        try:
            _exchange(new, target)
        except OSError as err:
            if err.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            aside = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.old")
            _remove_any(aside)
            os.rename(target, aside)
            _sync_directory_of(target)
            os.rename(new, target)
            new = aside
    _sync_directory_of(target)
    if os.path.lexists(new):
        _remove_any(new)


def _exchange(a: str, b: str) -> None:
    """``renameat2(a, b, RENAME_EXCHANGE)``: the two names swap in one step. (Python's ``os``
    has no renameat2.)"""
    libc = ctypes.CDLL(None, use_errno=True)
    call = getattr(libc, "renameat2", None)
    if call is None:
        raise OSError(errno.ENOSYS, "renameat2 is not in this C library")
    at_fdcwd, rename_exchange = -100, 2
    if call(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), a, None, b)


def _remove_any(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def _old_digests(path: str) -> list[str]:
    """The digests a file now at ``path`` passes (none: no file there, or a damaged digest
    file, which need not pass)."""
    if not os.path.exists(path):
        return []
    try:
        found = digests.expected(path)
    except digests.CorruptCheckpointError:
        return []
    return found[0] if found is not None else [digests.file_digest(path)]


def _write_digests(path: str, listed: list[str]) -> None:
    text = digests.format_lines(os.path.basename(path), list(dict.fromkeys(listed)))
    with open_durable(digests.digest_path(path), "w", digest=False) as f:
        f.write(text)


def _sync_directory_of(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _os_error(err: BaseException | None) -> OSError | None:
    """The ``OSError`` behind ``err`` (torch's zip writer reports a failed write as a
    ``RuntimeError`` raised from it)."""
    for _ in range(10):
        if err is None or isinstance(err, OSError):
            return err
        err = err.__cause__ or err.__context__
    return None


def _named(err: BaseException, path: str, what: str, put: bool) -> OSError:
    cause = _os_error(err) or OSError(str(err))
    reason = cause.strerror or str(cause)
    if put:
        return OSError(cause.errno, f"{what} {path}: saved, but its digest file could not be "
                                    f"rewritten ({reason}); it still loads")
    return OSError(cause.errno, f"{what} {path}: not saved ({reason}); the previous {what} "
                                "there, if any, is unchanged")
