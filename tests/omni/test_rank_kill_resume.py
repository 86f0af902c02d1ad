"""A rank SIGKILLed at a seeded random moment of ``Trainer.fit`` under OmniStrategy at PP2 x TP2
(4 gloo ranks, float64; ``ModelCheckpoint`` writes a sharded checkpoint every epoch of two
steps, keeping the newest): every other rank ends with a named error within the strategy's
timeout and exits, leaving no process and nothing in ``/dev/shm``; a fit resumed with
``ckpt_path`` from the newest complete checkpoint ends with the parameters of the run that was
never interrupted (docs/reliability.md, "A lost process during training").

The trials take their seeds from ``SEEDS``: two by default (a stage-0 and a stage-1 rank
killed), ``OMNILAB_KILL_TRIALS=10`` for ten. A trial spawns the killed run's 4 ranks, then 4
fresh ones that resume and run the uninterrupted fit."""

from __future__ import annotations

import os
import random
import re
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path

import lightning.pytorch as pl
import psutil
import pytest
import torch
from omni_models import spawn
from tp_workers import _full, _loader, _trainer, make_tp_model, reference

from lightning_omni.runtime import checkpoint as ckpt

TIMEOUT_S = 20  # the strategy's timeout here (the default is 10 minutes)
RAISE_S = 5  # a rank whose wait times out raises this long after its timeout at most
EXIT_S = 10  # a survivor's process ends this long after its error at most
PP, TP, WORLD = 2, 2, 4
BATCH, SAMPLES, EPOCHS = 8, 16, 6  # two steps an epoch, a checkpoint at each epoch's end
LAYERS = 2  # one block per stage
VICTIMS = (0, 2, 1, 3)  # by seed: stage 0, stage 1, ... (a stage's TP ranks are consecutive)
SEEDS = range(int(os.environ.get("OMNILAB_KILL_TRIALS", "2")))
NAMED = ("OmniRuntimeError",)
LOST = re.compile(r"probably died or stopped|Connection (reset|closed) by peer")


def _trial(seed: int) -> tuple[int, int, float]:
    """(victim rank, the epoch at whose start its clock starts, the fraction of the epoch
    before's duration it waits then)."""
    rng = random.Random(seed)
    return VICTIMS[seed % len(VICTIMS)], rng.choice((2, 3)), rng.random()


class _KillSelf(pl.Callback):
    """At the start of epoch ``epoch``, a timer SIGKILLs this process ``fraction`` of the
    epoch before's duration (two steps and a save) later, whatever its main thread is doing
    then (a step, a message, a save), after writing the wall time of the kill to
    ``killed_at``."""

    def __init__(self, killed_at: Path, epoch: int, fraction: float) -> None:
        self.killed_at, self.epoch, self.fraction = killed_at, epoch, fraction
        self.started = 0.0

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        now = time.monotonic()
        if trainer.current_epoch == self.epoch:
            timer = threading.Timer(self.fraction * (now - self.started), self._kill)
            timer.daemon = True
            timer.start()
        self.started = now

    def _kill(self) -> None:
        self.killed_at.write_text(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)


def _fit(rank: int, callbacks: list, ckpt_path: str | None = None) -> dict:
    """Fit the toy at PP2 x TP2 for ``EPOCHS`` (from ``ckpt_path`` when given, starting from
    another initial model: the checkpoint must decide); this rank's hosted parameters, whole."""
    from lightning_omni import OmniStrategy

    model = make_tp_model(1 if ckpt_path else 0, layers=LAYERS)
    strategy = OmniStrategy(pipeline_parallel=PP, tensor_parallel=TP, num_microbatches=2,
                            timeout=timedelta(seconds=TIMEOUT_S))
    trainer = _trainer(WORLD, strategy, callbacks, max_epochs=EPOCHS,
                       enable_checkpointing=any(isinstance(c, pl.callbacks.ModelCheckpoint)
                                                for c in callbacks))
    trainer.fit(model, _loader(rank, PP, 1, TP, SAMPLES, BATCH), ckpt_path=ckpt_path)
    hosted = strategy.engine.hosted_param_ids()
    return {"step": trainer.global_step,
            "params": {n: _full(p.detach()) for n, p in model.named_parameters()
                       if id(p) in hosted}}


def killed_worker(rank: int, world: int, root: str, seed: int) -> None:
    """The run one rank of which is killed: each rank writes its pid (the port, to find its
    processes), then fits with a checkpoint each epoch; a survivor writes what it raised and
    when, and raises it again (no barrier after it)."""
    out = Path(root)
    (out / f"pid{rank}").write_text(f"{os.getpid()} {os.environ['MASTER_PORT']}")
    victim, epoch, fraction = _trial(seed)
    callbacks: list = [pl.callbacks.ModelCheckpoint(dirpath=out / "ckpt", filename="{step}",
                                                    save_top_k=1)]
    if rank == victim:
        callbacks.append(_KillSelf(out / "killed_at", epoch, fraction))
    try:
        _fit(rank, callbacks)
    except Exception as err:
        chain = [err]  # the error raised last first, then the ones it was raised over
        while (inner := chain[-1].__cause__ or chain[-1].__context__) is not None:
            chain.append(inner)
        torch.save({"error": type(err).__name__, "message": str(err), "ended_at": time.time(),
                    "chain": [(type(e).__name__, str(e)) for e in chain]},
                   out / f"error{rank}.pt")
        raise


def resume_worker(rank: int, world: int, ckpt_path: str) -> dict:
    """The fit resumed from ``ckpt_path``, then the uninterrupted fit, without checkpoints."""
    return {"resumed": _fit(rank, [], ckpt_path), "uninterrupted": _fit(rank, [])}


def _newest_complete(directory: Path) -> tuple[int, Path]:
    found = [(int(m.group(1)), p) for p in directory.iterdir()
             if (m := re.fullmatch(r"step=(\d+)\.ckpt", p.name)) and ckpt.is_sharded(p)]
    assert found, f"no complete checkpoint in {sorted(p.name for p in directory.iterdir())}"
    return max(found)


def _processes_on(port: str) -> list[psutil.Process]:
    """Processes of the run on ``port`` still alive (a rank, or anything it started)."""
    left = []
    for proc in psutil.process_iter(["environ"]):
        env = proc.info["environ"] or {}
        if env.get("MASTER_PORT") == port and "RANK" in env:
            left.append(proc)
    return left


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm"))


@pytest.fixture(scope="module")
def plain():
    """The plain single-process run's parameters after ``EPOCHS`` epochs."""
    return reference(EPOCHS * SAMPLES // BATCH, BATCH, SAMPLES, layers=LAYERS)["params"]


@pytest.mark.parametrize("seed", SEEDS, ids=lambda s: f"seed{s}-rank{_trial(s)[0]}")
def test_a_rank_killed_mid_fit_ends_the_job_and_the_newest_checkpoint_resumes_it(
        tmp_path, seed, plain):
    victim, epoch, fraction = _trial(seed)
    shm_before, started = _shm(), time.monotonic()
    results = spawn(killed_worker, WORLD, str(tmp_path), seed, timeout=300,
                    allow_failures=True)
    exited_at, killed_s = time.time(), time.monotonic() - started
    # (1) the killed rank died of the signal mid-run; every other rank raised a named error
    # within the strategy's timeout, and every process of the run is gone, nothing left in
    # /dev/shm
    assert results[victim] == ("missing", -signal.SIGKILL), f"not killed mid-run: {results}"
    killed_at = float((tmp_path / "killed_at").read_text())
    survivors = {r: torch.load(tmp_path / f"error{r}.pt") for r in range(WORLD) if r != victim
                 if (tmp_path / f"error{r}.pt").exists()}
    assert sorted(survivors) == [r for r in range(WORLD) if r != victim], results
    for r, err in survivors.items():
        assert any(LOST.search(message) for _, message in err["chain"]), (r, err)
        # most ranks hear of the kill at once (their peer's socket closed); one waiting in
        # a gloo barrier may hear nothing and wait out the timeout
        assert err["ended_at"] - killed_at < TIMEOUT_S + RAISE_S, (r, err["ended_at"] - killed_at,
                                                                 err)
    last_error = max(err["ended_at"] for err in survivors.values())
    assert exited_at - last_error < EXIT_S, exited_at - last_error
    pids, ports = zip(*((tmp_path / f"pid{r}").read_text().split() for r in range(WORLD)),
                      strict=True)
    assert not _processes_on(ports[0]), _processes_on(ports[0])
    leaked = {n for n in _shm() - shm_before
              if n.startswith("torch_") or set(pids) & set(re.findall(r"\d+", n))}
    assert not leaked, f"left in /dev/shm: {sorted(leaked)}"
    # (2) the newest complete checkpoint resumes: the uninterrupted run's parameters
    step, path = _newest_complete(tmp_path / "ckpt")
    for stage in range(ckpt.num_stages(path)):
        assert ckpt.read_shard(path, stage)["global_step"] == step  # whole, digests checked
    started = time.monotonic()
    ranks = spawn(resume_worker, WORLD, str(path), timeout=300)
    resumed_s = time.monotonic() - started
    seen = set()
    for r, got in enumerate(ranks):
        assert got["resumed"]["step"] == got["uninterrupted"]["step"] == EPOCHS * 2
        assert got["resumed"]["params"].keys() == got["uninterrupted"]["params"].keys()
        for n, t in got["resumed"]["params"].items():
            want = got["uninterrupted"]["params"][n]
            torch.testing.assert_close(t, want, rtol=0, atol=1e-12,
                                       msg=lambda m, n=n, r=r: f"rank {r} {n}: {m}")
            # and the uninterrupted run is the plain one's (as tests/omni/test_tp.py)
            torch.testing.assert_close(want, plain[n], rtol=1e-7, atol=1e-12)
            seen.add(n)
    assert seen == set(plain), "not every parameter was hosted and checked"
    unnamed = {r: err["chain"] for r, err in survivors.items() if err["error"] not in NAMED}
    delays = ", ".join(f"{e['ended_at'] - killed_at:.1f}" for e in survivors.values())
    print(f"seed {seed}: rank {victim} (stage {victim // TP}) killed in epoch {epoch}+"
          f"{fraction:.2f}; errors after {delays} s; resumed from step {step}; killed run "
          f"{killed_s:.0f} s, resume {resumed_s:.0f} s; "
          + "; ".join(f"rank {r}: {e['message'][:160]}" for r, e in survivors.items()))
    assert not unnamed, f"not ended by {NAMED}: {unnamed}"
