"""Lightning checkpoints written atomically, with a digest: ``AtomicCheckpointIO``.

Lightning's ``TorchCheckpointIO`` writes through an fsspec transaction: the bytes go to a
temporary file made in the system's temporary directory, then ``shutil.move`` puts it in place.
Where that directory is on another file system than the checkpoints (a tmpfs ``/tmp``, a
mounted checkpoint volume), the move is a copy into the final name: a process killed during it
leaves a torn ``.ckpt`` there, and every killed save leaves a checkpoint-sized file in the
temporary directory (memory, on a tmpfs). It writes no digest either, so a damaged byte is
caught only as far as torch's reader catches it.

``AtomicCheckpointIO`` (a ``CheckpointIO`` plugin, Lightning's public hook for this) writes local
files through ``lightning_omnilab.durable`` (``safe_load.save``): a temporary file beside the
checkpoint, ``fsync``ed, renamed over it, the directory ``fsync``ed, with its SHA-256 beside it
(``last.ckpt`` too: it is saved again, so replaced in one step); a full disk raises ``OSError``
naming the file and keeps the previous checkpoint. Loading checks the digest
(``DigestMismatchError``), then loads exactly as Lightning does (``weights_only`` as the Trainer
passes it); removing a checkpoint removes its digest. Remote paths (``s3://`` ...) are left to
Lightning. ``unilab-train`` and ``OmniStrategy`` set it (``use_atomic_checkpoint_io``);
elsewhere: ``Trainer(plugins=[AtomicCheckpointIO()])``.
"""

from __future__ import annotations

import os
from typing import Any

import fsspec.utils
from lightning.pytorch.plugins.io import TorchCheckpointIO

from lightning_omnilab import durable, safe_load

__all__ = ["AtomicCheckpointIO", "use_atomic_checkpoint_io"]


def _is_local_file_protocol(path: Any) -> bool:
    return fsspec.utils.get_protocol(str(path)) == "file"


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose local saves are atomic and carry a digest."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any,
                        storage_options: Any | None = None) -> None:
        if storage_options is not None or not _is_local_file_protocol(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = os.fspath(path)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        safe_load.save(checkpoint, path)

    def load_checkpoint(self, path: Any, map_location: Any = lambda storage, loc: storage,
                        weights_only: bool | None = None) -> dict[str, Any]:
        if _is_local_file_protocol(path) and os.path.isfile(path):
            safe_load.check_digest(path)
        # the project's own plain types (a recipe's randomization in the data module's
        # hyperparameters) load weights-only, as through safe_load.load
        with safe_load.project_types():
            return super().load_checkpoint(path, map_location=map_location,
                                           weights_only=weights_only)

    def remove_checkpoint(self, path: Any) -> None:
        if _is_local_file_protocol(path) and not os.path.isdir(path):
            durable.remove(path)  # and its digest
        else:
            super().remove_checkpoint(path)


def use_atomic_checkpoint_io(strategy: Any) -> bool:
    """Give ``strategy`` ``AtomicCheckpointIO`` where it has Lightning's default
    ``TorchCheckpointIO`` (the unilab train command's Trainer, OmniStrategy's plain-file saves and
    loads); a checkpoint plugin the user chose (``Trainer(plugins=...)``) is kept. Returns
    whether it was set."""
    if type(strategy.checkpoint_io) is not TorchCheckpointIO:
        return False
    strategy.checkpoint_io = AtomicCheckpointIO()
    return True
