"""Checkpoints loaded without running the code a pickle may carry.

``torch.load(..., weights_only=False)`` runs whatever callables a checkpoint's pickle names: a
checkpoint someone sent you is a program. Every checkpoint this project reads goes through
``load``: ``weights_only=True``, with only the project's own plain types allowed
(``allow``: e.g. a recipe's randomization ranges, pickled in a data module's hyperparameters),
also under the module paths they had when older checkpoints were written. Anything else is
refused with ``UnsafeCheckpointError`` naming the file and what it holds.

torch's reader catches most damage to a file but not all (a flipped byte inside a tensor or a
pickled number loads as another value), so ``save`` writes the file durably with its SHA-256
beside it (``lightning_omnilab.durable``), and ``load`` checks a file that has one
(``lightning_omnilab.digests``): ``DigestMismatchError``, a ``CorruptCheckpointError``, rather
than silently different values. (torch is imported where a file is read, so that a
torch-free module can ``allow`` its types.)
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterable
from typing import Any

from lightning_omnilab import durable
from lightning_omnilab.digests import CorruptCheckpointError, DigestMismatchError, digest_path
from lightning_omnilab.digests import check as check_digest

__all__ = ["CorruptCheckpointError", "DigestMismatchError", "UnsafeCheckpointError", "allow",
           "allowed", "check_digest", "digest_path", "load", "project_types", "save"]

_ALLOWED: dict[str, type] = {}  # "module.QualName" -> the type it names


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint names a callable or type that weights-only loading does not allow."""


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


def save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` to ``path`` through ``lightning_omnilab.durable``: atomic, ``fsync``ed, with
    its digest beside it. A failed write (a full disk: ``OSError`` ``ENOSPC``) raises ``OSError``
    naming ``path``, with the previous checkpoint there untouched. (torch writes through a
    Python file here: its own file writer reports a full disk as "unexpected pos ...".)"""
    import torch

    with durable.open_durable(path, what="checkpoint") as f:
        torch.save(obj, f)


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
