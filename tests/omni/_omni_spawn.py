"""Run a function on N gloo processes and bring back each rank's result (or its traceback).

Results travel through files written before the process exits, so a process that crashes
while exiting (seen with DeepSpeed on gloo) still reports what it computed.
"""

from __future__ import annotations

import os
import socket
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, out_dir: str, fn: Callable, args: tuple) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / "build" / "torch_extensions"))
    result: Any
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world)
        result = ("ok", fn(rank, world, *args))
    except BaseException:  # report every failure to the parent, with its traceback
        result = ("error", traceback.format_exc())
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    try:
        from lightning_omni.runtime.alltoall import reset_default_cache

        reset_default_cache()
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
    except Exception:
        pass


def run_processes(entry: Callable, world: int, fn: Callable, args: tuple,
                  timeout: float, allow_failures: bool = False) -> list[Any]:
    """``entry(rank, world, port, out_dir, fn, args)`` on ``world`` spawned processes; each
    writes ``(status, value)`` to ``out_dir/rank{r}.pt``. Per-rank values, or with
    ``allow_failures`` the ``(status, value)`` pairs (``("missing", exitcode)`` for a rank that
    wrote nothing); otherwise a rank's failure is raised with its traceback."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as out_dir:
        port = _free_port()
        procs = [ctx.Process(target=entry, args=(r, world, port, out_dir, fn, args))
                 for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout)
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        results = []
        for r in range(world):
            path = Path(out_dir) / f"rank{r}.pt"
            if not path.exists():
                if allow_failures:
                    results.append(("missing", procs[r].exitcode))
                    continue
                raise RuntimeError(f"rank {r} wrote no result (hung: {hung}, exit codes: "
                                   f"{[p.exitcode for p in procs]})")
            status, value = torch.load(path, weights_only=False)
            if status != "ok" and not allow_failures:
                raise RuntimeError(f"rank {r} failed:\n{value}")
            results.append((status, value) if allow_failures else value)
        return results


def run_spmd(fn: Callable, world: int, *args: Any, timeout: float = 120.0) -> list[Any]:
    """``fn(rank, world, *args)`` on ``world`` spawned gloo processes; per-rank return values."""
    return run_processes(_entry, world, fn, args, timeout)
