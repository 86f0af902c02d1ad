"""Per-stage checkpoint shards, written atomically, and their consolidation.

A checkpoint is a directory: ``stage{s}.pt`` per pipeline stage (written by replica 0's rank of
that stage: replicas hold identical copies; with model chunks, every chunk of the rank) and
``complete.json`` (the stage and chunk counts), removed by rank 0 first and written by it
last, after every shard is in place. Each file is written to a temporary name and renamed, so a
crash leaves either the old file or the new one, and a directory without ``complete.json`` is
not a checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from lightning_omnilab import safe_load

MARKER = "complete.json"


def shard_path(directory: str | os.PathLike, stage: int) -> Path:
    return Path(directory) / f"stage{stage}.pt"


def atomic_save(obj: Any, path: Path) -> None:
    """Atomically, with the file's digest beside it (``safe_load.save``)."""
    safe_load.save(obj, path)


def write_shard(directory: str | os.PathLike, stage: int, checkpoint: dict[str, Any]) -> None:
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    atomic_save(checkpoint, shard_path(path, stage))


def write_marker(directory: str | os.PathLike, pp: int, vpp: int = 1) -> None:
    """Mark a complete sharded checkpoint of ``pp`` stages with ``vpp`` model chunks each
    (the file's keys stay "stages" and "chunks")."""
    path = Path(directory) / MARKER
    tmp = path.with_name(f".{MARKER}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"format": "lightning_omni.stage_shards", "stages": pp,
                               "chunks": vpp}))
    os.replace(tmp, path)


def clear_marker(directory: str | os.PathLike) -> None:
    """Unmark a directory before its shards are replaced: saving again to the same path
    (``last.ckpt``) must not leave it marked complete while its shards are half old, half new
    (each shard passes its own digest, so nothing else would notice)."""
    (Path(directory) / MARKER).unlink(missing_ok=True)


def save_sharded(directory: str | os.PathLike, checkpoint: dict[str, Any], stage: int, *,
                 writes_shard: bool, rank_zero: bool, pp: int, vpp: int,
                 barrier: Callable[[str], None]) -> None:
    """One rank's part of a sharded save (every rank calls it): rank 0 unmarks, the stage's
    writer writes its shard, rank 0 marks it complete once every shard is in place. A rank
    killed at any point leaves the directory unmarked or whole, never marked over a mix."""
    if rank_zero:  # an older checkpoint at this path stops being complete first
        clear_marker(directory)
    barrier("omni_save_unmark")
    if writes_shard:  # one writer per stage
        write_shard(directory, stage, checkpoint)
    barrier("omni_save_shards")
    if rank_zero:
        write_marker(directory, pp, vpp)
    barrier("omni_save_marker")


def is_sharded(path: str | os.PathLike) -> bool:
    return Path(path).is_dir() and (Path(path) / MARKER).exists()


def _marker(path: str | os.PathLike) -> dict[str, Any]:
    if not is_sharded(path):
        raise FileNotFoundError(f"checkpoint: {path} is not a complete Omni checkpoint "
                                f"directory (no {MARKER}; an interrupted save?)")
    return json.loads((Path(path) / MARKER).read_text())


def num_stages(path: str | os.PathLike) -> int:
    return int(_marker(path)["stages"])


def num_chunks(path: str | os.PathLike) -> int:
    """Model chunks per stage the checkpoint was written with (1: written before chunks)."""
    return int(_marker(path).get("chunks", 1))


def read_shard(path: str | os.PathLike, stage: int,
               weights_only: bool | None = True) -> dict[str, Any]:
    """Stage ``stage``'s shard, weights only (``lightning_omnilab.safe_load``): a shard naming
    code is refused, naming the file; ``weights_only=False`` for a checkpoint you trust."""
    stages = num_stages(path)
    if not 0 <= stage < stages:
        raise ValueError(f"stage: expected one of 0..{stages - 1} for {path}, got {stage} "
                         "(resume with the pipeline size the checkpoint was written with)")
    return safe_load.load(shard_path(path, stage), map_location="cpu", weights_only=weights_only)


def consolidate(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The plain LightningModule's ``state_dict`` from a sharded checkpoint: each parameter
    from the stage that hosts it (encoders: the first shard that holds them)."""
    merged: dict[str, torch.Tensor] = {}
    for s in range(num_stages(path)):
        for name, t in read_shard(path, s)["state_dict"].items():
            merged.setdefault(name, t)
    return merged


def remove(path: str | os.PathLike) -> None:
    """Remove a checkpoint; a sharded one is unmarked first, so a removal cut short never
    leaves a directory marked complete with a shard gone."""
    p = Path(path)
    if p.is_dir():
        clear_marker(p)
        shutil.rmtree(p)
    elif p.exists():
        p.unlink()
