"""Two forked gloo ranks saving OmniStrategy's sharded checkpoints in a loop, the way a run with
``ModelCheckpoint(save_top_k=1, save_last=True)`` does (tests/omni/test_sharded_save_faults.py).

Each version ``V`` goes to a new directory ``step{V}.ckpt`` and over ``last.ckpt``, through
``checkpoint.save_sharded`` (the strategy's protocol, each rank writing its stage's shard); then
rank 0 removes ``step{V-1}.ckpt``. A rank writes ``saved V`` to its pipe after each version.
A resumed pair starts from the newest complete ``step*.ckpt``. The ranks are forked, not
spawned, so that a kill costs no imports.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from lightning_omni.runtime import checkpoint as ckpt

SIZE = 1 << 20  # 4 MB of float32 per shard: a save takes long enough to be hit


def shard(version: int, stage: int) -> dict:
    # numpy fills it: a torch op on its thread pool can hang in a forked child
    w = torch.from_numpy(np.full(SIZE, float(version), np.float32))
    return {"version": version, "stage": stage, "state_dict": {f"stage{stage}.w": w}}


def versions(root: Path) -> list[int]:
    """Versions of the ``step*.ckpt`` directories under ``root``, complete or not."""
    found = (re.fullmatch(r"step(\d+)\.ckpt", p.name) for p in root.iterdir())
    return sorted(int(m.group(1)) for m in found if m)


def newest_complete(root: Path) -> int:
    return max((v for v in versions(root) if ckpt.is_sharded(root / f"step{v}.ckpt")),
               default=0)


def _barrier(name: str) -> None:
    dist.barrier()


def _rank(rank: int, port: int, root: Path, saves: int, out: Any) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=timedelta(seconds=10))
    version = newest_complete(root)
    if version:  # the resume: this stage's shard of the newest complete checkpoint
        assert ckpt.read_shard(root / f"step{version}.ckpt", rank)["version"] == version
    for _ in range(saves):
        version += 1
        for name in (f"step{version}.ckpt", "last.ckpt"):
            ckpt.save_sharded(root / name, shard(version, rank), rank, writes_shard=True,
                              rank_zero=rank == 0, pp=2, vpp=1, barrier=_barrier)
        if rank == 0:  # ModelCheckpoint's top-1: the older one goes once the newer is whole
            ckpt.remove(root / f"step{version - 1}.ckpt")
        out.send(version)


def _main(rank: int, port: int, root: Path, saves: int, out: Any) -> None:
    try:
        _rank(rank, port, root, saves, out)
    except BaseException as err:  # noqa: BLE001 - reported to the parent, then exit 1
        out.send(f"{type(err).__name__}: {err}")
        os._exit(1)
    os._exit(0)


def start(rank: int, port: int, root: Path, saves: int) -> tuple[Any, Any]:
    """(process, connection) of a forked rank: it sends each version saved, then exits 0; on
    an error it sends the error's text and exits 1."""
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_main, args=(rank, port, root, saves, send), daemon=True)
    proc.start()
    send.close()
    return proc, recv
