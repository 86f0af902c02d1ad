"""A rank SIGKILLed (or stopped by SIGSTOP) in the middle of ``Trainer.fit`` under
OmniStrategy (2 gloo ranks, pipeline parallel 2) ends the other rank with ``OmniRuntimeError``
within the strategy's timeout, and its process exits: nobody waits for a lost rank forever."""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import torch.multiprocessing as mp

TIMEOUT_S = 6  # the strategy's timeout in this test (the default is 10 minutes)
KILL_AT = 2  # rank 1 gets its signal in the forward of this training step's first microbatch


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _SignalRank1MidStep(pl.Callback):
    """Rank 1 sends itself ``sig`` inside step ``KILL_AT`` (in a block's forward); rank 0
    records when it started that step."""

    def __init__(self, rank: int, sig: signal.Signals) -> None:
        self.rank, self.sig = rank, sig
        self.step_started = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx != KILL_AT:
            return
        self.step_started = time.monotonic()
        if self.rank == 1:
            def signal_self(*_):
                os.kill(os.getpid(), self.sig)

            for module in pl_module.modules():  # the first forward of a block it hosts
                module.register_forward_hook(signal_self)


def _fit(rank: int, sig: signal.Signals) -> dict:
    from omni_models import ToyData, make_model
    from torch.utils.data import DataLoader

    from lightning_omni import OmniStrategy

    strategy = OmniStrategy(pipeline_parallel=2, num_microbatches=2,
                            timeout=timedelta(seconds=TIMEOUT_S))
    hook = _SignalRank1MidStep(rank, sig)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_steps=20,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[hook],
                         use_distributed_sampler=False)
    try:
        trainer.fit(make_model(0), DataLoader(ToyData(64), batch_size=8))
    except Exception as err:  # noqa: BLE001 - the type is what is checked
        return {"error": type(err).__name__, "message": str(err),
                "seconds": time.monotonic() - hook.step_started, "ended_at": time.time()}
    return {"error": None}


def _entry(rank: int, port: int, out_dir: str, sig: signal.Signals) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
                      RANK=str(rank), LOCAL_RANK=str(rank), NODE_RANK="0")
    torch.set_num_threads(1)
    try:
        result = _fit(rank, sig)
    except BaseException:  # noqa: BLE001 - reported to the parent
        result = {"error": "crash", "message": traceback.format_exc()}
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    # the process ends the way a launched rank's does: its interpreter exits, atexit and all
    # (Lightning, gloo); a hang here fails the join below


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "stopped"])
def test_a_lost_rank_ends_the_other_with_a_named_error_within_the_timeout(sig):
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as out_dir:
        port = _port()
        procs = [ctx.Process(target=_entry, args=(r, port, out_dir, sig)) for r in range(2)]
        for p in procs:
            p.start()
        procs[0].join(90)  # a stopped rank 1 stays: its launcher would end it
        rank0_ran_on, rank0_exited_at = procs[0].is_alive(), time.time()
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        assert not rank0_ran_on, "rank 0 was still running 90 s after the start"
        assert procs[1].exitcode == -signal.SIGKILL
        path = Path(out_dir) / "rank0.pt"
        assert path.exists(), f"rank 0 wrote no result (exit code {procs[0].exitcode})"
        out = torch.load(path, weights_only=False)
    assert out["error"] == "OmniRuntimeError", out
    assert "a peer rank has probably died or stopped" in out["message"]
    assert out["seconds"] < (2 if sig == signal.SIGKILL else TIMEOUT_S + 3), out
    # and its process exits: Lightning's teardown and the interpreter's exit wait for nobody
    assert rank0_exited_at - out["ended_at"] < 10, rank0_exited_at - out["ended_at"]
    print(f"rank 0 after {out['seconds']:.1f} s: {out['message']}")
