"""Checkpoints loaded without running the code a pickle may carry.

``torch.load(..., weights_only=False)`` runs whatever callables a checkpoint's pickle names: a
checkpoint someone sent you is a program. Every checkpoint this project reads goes through
``load``: ``weights_only=True``, with only the project's own plain types allowed
(``allow``: e.g. a recipe's randomization ranges, pickled in a data module's hyperparameters),
also under the module paths they had when older checkpoints were written. Anything else is
refused with ``UnsafeCheckpointError`` naming the file and what it holds. (torch is imported
where a file is read, so that a torch-free module can ``allow`` its types.)
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterable
from typing import Any

__all__ = ["UnsafeCheckpointError", "allow", "allowed", "load", "project_types"]

_ALLOWED: dict[str, type] = {}  # "module.QualName" -> the type it names


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint names a callable or type that weights-only loading does not allow."""


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

    if weights_only is False:
        return torch.load(path, map_location=map_location, weights_only=False)
    try:
        with project_types():
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UnsafeCheckpointError(
            f"{os.fspath(path)}: refused to load: the checkpoint names code or a type that "
            f"weights-only loading does not allow ({first}). Load only checkpoints you trust; "
            "a trusted one of your own types loads with weights_only=False") from err
