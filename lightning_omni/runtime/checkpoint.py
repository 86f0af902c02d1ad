"""Per-stage checkpoint shards, saved durably, and their consolidation.

A checkpoint is a directory: ``stage{s}.pt`` per pipeline stage (written by replica 0's rank of
that stage: replicas hold identical copies; with model chunks, every chunk of the rank) and
``complete.json`` (the stage and chunk counts), each with its SHA-256 beside it
(``lightning_omnilab.durable``). A save writes every shard into ``.<name>.saving`` beside the
checkpoint; rank 0 marks it complete once every shard is in place and puts it over the
checkpoint's path in one step (``durable.replace_directory``). A rank killed at any point
leaves at the path the previous complete checkpoint (``last.ckpt``, saved again and again) or
nothing; a directory without ``complete.json`` (an interrupted save of an older version) is
refused.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from lightning_omnilab import digests, durable, safe_load

MARKER = "complete.json"


def shard_path(directory: str | os.PathLike, stage: int) -> Path:
    return Path(directory) / f"stage{stage}.pt"


def staging_path(directory: str | os.PathLike) -> Path:
    """Where a save to ``directory`` is written before it is put in place (the same on every
    rank)."""
    d = Path(directory)
    return d.with_name(f".{d.name}.saving")


def write_shard(directory: str | os.PathLike, stage: int, checkpoint: dict[str, Any]) -> None:
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    safe_load.save(checkpoint, shard_path(path, stage))


def write_marker(directory: str | os.PathLike, pp: int, vpp: int = 1) -> None:
    """Mark a complete sharded checkpoint of ``pp`` stages with ``vpp`` model chunks each
    (the file's keys stay "stages" and "chunks")."""
    durable.write_bytes(Path(directory) / MARKER, json.dumps(
        {"format": "lightning_omni.stage_shards", "stages": pp, "chunks": vpp}))


def clear_marker(directory: str | os.PathLike) -> None:
    """Unmark a directory before its shards are removed: a removal cut short must not leave it
    marked complete with a shard gone (each shard passes its own digest)."""
    durable.remove(Path(directory) / MARKER)


def save_sharded(directory: str | os.PathLike, checkpoint: dict[str, Any], stage: int, *,
                 writes_shard: bool, rank_zero: bool, pp: int, vpp: int,
                 barrier: Callable[[str], None]) -> None:
    """One rank's part of a sharded save (every rank calls it): the stage's writer writes its
    shard into the staging directory, rank 0 marks it complete once every shard is in place and
    puts it over ``directory`` in one step."""
    staging = staging_path(directory)
    if rank_zero:  # a save killed before left its staging directory
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    barrier("omni_save_staging")
    if writes_shard:  # one writer per stage
        write_shard(staging, stage, checkpoint)
    barrier("omni_save_shards")
    if rank_zero:
        write_marker(staging, pp, vpp)
        durable.replace_directory(staging, directory)
    barrier("omni_save_marker")


def is_sharded(path: str | os.PathLike) -> bool:
    return Path(path).is_dir() and (Path(path) / MARKER).exists()


def _marker(path: str | os.PathLike) -> dict[str, Any]:
    if not is_sharded(path):
        raise FileNotFoundError(f"checkpoint: {path} is not a complete Omni checkpoint "
                                f"directory (no {MARKER}; an interrupted save?)")
    digests.check(Path(path) / MARKER)
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
    """Remove a checkpoint and its digests; a sharded one is unmarked first, so a removal cut
    short never leaves a directory marked complete with a shard gone."""
    p = Path(path)
    if p.is_symlink():  # save_last="link": the link, not the checkpoint it names
        p.unlink()
    elif p.is_dir():
        clear_marker(p)
        shutil.rmtree(p)
    else:
        durable.remove(p)  # and its digest
