"""Checkpoints loaded without running the code a pickle may carry.

``torch.load(..., weights_only=False)`` runs whatever callables a checkpoint's pickle names: a
checkpoint someone sent you is a program. Every checkpoint this project reads goes through
``load``: ``weights_only=True``, with only the project's own plain types allowed
(``allow``: e.g. a recipe's randomization ranges, pickled in a data module's hyperparameters),
also under the module paths they had when older checkpoints were written. Anything else is
refused with ``UnsafeCheckpointError`` naming the file and what it holds.

torch's reader catches most damage to a file but not all (a flipped byte inside a tensor or a
pickled number loads as another value), so ``save`` writes the file atomically with its
SHA-256 beside it (``<file>.sha256``), and ``load`` checks a file that has one:
``CorruptCheckpointError`` rather than silently different values. (torch is imported
where a file is read, so that a torch-free module can ``allow`` its types.)
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterable
from typing import Any

__all__ = ["CorruptCheckpointError", "UnsafeCheckpointError", "allow", "allowed", "check_digest",
           "digest_path", "load", "project_types", "save"]

_ALLOWED: dict[str, type] = {}  # "module.QualName" -> the type it names


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint names a callable or type that weights-only loading does not allow."""


class CorruptCheckpointError(ValueError):
    """A checkpoint file that cannot be read: truncated (an interrupted copy) or corrupted."""


# torch's weights-only unpickler says so when a pickle names a global it does not allow
_UNSAFE_MARKS = ("Unsupported global", "GLOBAL", "safe_globals", "add_safe_globals")


def allow(types: Iterable[type], *, old_modules: dict[str, str] | None = None) -> None:
    """Let checkpoints hold instances of ``types`` (plain data classes of this project).
    ``old_modules``: old module path -> current one, so that a checkpoint written before a
    class moved still names it."""
    moved = {new: old for old, new in (old_modules or {}).items()}
    for t in types:
        _ALLOWED[f"{t.__module__}.{t.__qualname__}"] = t
        if t.__module__ in moved:
            _ALLOWED[f"{moved[t.__module__]}.{t.__qualname__}"] = t


def allowed() -> list[tuple[type, str]]:
    """The allowed types with the names checkpoints may give them."""
    return [(t, name) for name, t in _ALLOWED.items()]


def digest_path(path: str | os.PathLike) -> str:
    return f"{os.fspath(path)}.sha256"


def _sha256(path: str | os.PathLike) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` to ``path`` atomically (a temporary file beside it, renamed over it), with
    its digest. A process killed at any point leaves at ``path`` the old file or the new one,
    each loadable: while the file is swapped the digest file names both the old file's digest
    and the new one's (two renames are not one atomic step). A failed write (a full disk:
    ``OSError`` ``ENOSPC``) removes the temporary file and raises ``OSError`` naming ``path``,
    with the previous checkpoint there untouched. (torch writes through a Python file here: its
    own file writer reports a full disk as "unexpected pos ...".)"""
    import torch

    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    replaced = False
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
        new = _sha256(tmp)
        _write_digests(path, [*_current_digests(path), new])  # old or new file: both pass
        os.replace(tmp, path)
        replaced = True
        _write_digests(path, [new])
    except BaseException as err:
        _remove_quietly(tmp)
        cause = _os_error(err)  # torch's zip writer reports a failed write as a RuntimeError
        if cause is None:
            raise
        if replaced:
            raise OSError(cause.errno, f"checkpoint {path}: saved, but its digest file could "
                                       f"not be rewritten ({cause.strerror or cause}); it "
                                       "still loads") from err
        raise OSError(cause.errno, f"checkpoint {path}: not saved ({cause.strerror or cause}); "
                                   "the previous checkpoint there, if any, is unchanged") from err


def _os_error(err: BaseException | None) -> OSError | None:
    seen = 0
    while err is not None and seen < 10:
        if isinstance(err, OSError):
            return err
        err, seen = err.__cause__ or err.__context__, seen + 1
    return None


def _current_digests(path: str) -> list[str]:
    """The digests the file now at ``path`` may have (none: no file there)."""
    if not os.path.exists(path):
        return []
    try:
        with open(digest_path(path)) as f:
            return f.read().split()
    except FileNotFoundError:
        return [_sha256(path)]  # written without a digest: name its own


def _write_digests(path: str, digests: list[str]) -> None:
    tmp = f"{digest_path(path)}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write("".join(d + "\n" for d in digests))
        os.replace(tmp, digest_path(path))
    except BaseException:
        _remove_quietly(tmp)
        raise


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def check_digest(path: str | os.PathLike) -> None:
    """Raise ``CorruptCheckpointError`` if ``path`` has a digest file (``save`` wrote it) that
    does not match it; a file without one passes (torch's own checks only)."""
    try:
        with open(digest_path(path)) as f:
            want = f.read().split()
    except FileNotFoundError:
        return  # written by someone else: torch's own checks only
    if _sha256(path) not in want:
        raise CorruptCheckpointError(
            f"{os.fspath(path)}: not a readable checkpoint (corrupted?): its SHA-256 does not "
            f"match {digest_path(path)}")


def project_types():
    """A context in which ``torch.load(..., weights_only=True)`` (also Lightning's, e.g.
    ``load_from_checkpoint``) accepts the allowed types."""
    import torch

    return torch.serialization.safe_globals(allowed())


def load(path: str | os.PathLike, map_location: Any = "cpu", *,
         weights_only: bool | None = True) -> Any:
    """``torch.load`` of ``path`` with ``weights_only`` (default True; ``False`` only for a
    checkpoint you trust, as Lightning's ``Trainer.fit(weights_only=False)``)."""
    import torch

    check_digest(path)
    if weights_only is False:
        return torch.load(path, map_location=map_location, weights_only=False)
    try:
        with project_types():
            return torch.load(path, map_location=map_location, weights_only=True)
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        raise
    except pickle.UnpicklingError as err:
        text = str(err)
        if any(mark in text for mark in _UNSAFE_MARKS):
            raise UnsafeCheckpointError(
                f"{os.fspath(path)}: refused to load: the checkpoint names code or a type that "
                f"weights-only loading does not allow ({_first_line(err)}). Load only "
                "checkpoints you trust; a trusted one of your own types loads with "
                "weights_only=False") from err
        raise _corrupt(path, err) from err
    except Exception as err:  # the reader's many ways of failing on a damaged file
        raise _corrupt(path, err) from err


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _corrupt(path: str | os.PathLike, err: BaseException) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"{os.fspath(path)}: not a readable checkpoint (truncated or corrupted?): "
        f"{type(err).__name__}: {_first_line(err)}")
