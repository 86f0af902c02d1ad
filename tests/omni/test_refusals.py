"""What OmniStrategy refuses at setup or on a batch, each with a message that names the option
or the sample and field, and a stopped (not dead) peer surfacing as OmniRuntimeError."""

import os
import signal
import time
from datetime import timedelta

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from omni_models import IMG, OmniToy, ToyData, global_batches, make_model
from torch.utils.data import DataLoader

from lightning_omni import OmniSpecError, OmniStrategy
from lightning_omni.runtime import OmniRuntimeError, ParallelDims, parallelize


@pytest.fixture(autouse=True)
def _own_process_group():
    """In-process fits start a gloo group and set MASTER_PORT: end both, or later tests that
    launch DDP inherit a port this process still holds."""
    import torch.distributed as dist

    saved = dict(os.environ)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
    os.environ.clear()
    os.environ.update(saved)


def _fit(model, strategy=None, data=None, **kw):
    trainer = Trainer(accelerator="cpu", devices=1, strategy=strategy or OmniStrategy(),
                      max_steps=kw.pop("max_steps", 1), logger=False,
                      enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0,
                      use_distributed_sampler=False, **kw)
    trainer.fit(model, DataLoader(data or ToyData(8), batch_size=4))
    return trainer


class LogsInStep(OmniToy):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("train_loss", loss)
        return loss


class LogsInHelper(OmniToy):
    def _shared(self, batch):
        loss = super().training_step(batch, 0)
        self.log_dict({"val_loss": loss})
        return loss

    def validation_step(self, batch, batch_idx):
        return self._shared(batch)


class UsesTorchLog(OmniToy):
    def training_step(self, batch, batch_idx):
        return torch.log(torch.exp(super().training_step(batch, batch_idx)))


class CustomBackward(OmniToy):
    def backward(self, loss, *args, **kwargs):
        loss.backward()


@pytest.mark.parametrize("cls,match", [
    (LogsInStep, r"LogsInStep.training_step: calls self.log .*on_train_batch_end"),
    (LogsInHelper, r"LogsInHelper.validation_step: calls self.log_dict .*on_validation_batch_end"),
    (CustomBackward, r"CustomBackward.backward: OmniStrategy runs the backward"),
])
def test_hooks_that_would_never_run_are_refused(cls, match):
    torch.manual_seed(0)
    with pytest.raises(ValueError, match=match):
        _fit(cls().double())


def test_torch_log_is_not_mistaken_for_self_log():
    torch.manual_seed(0)
    _fit(UsesTorchLog().double())


def test_fp16_mixed_and_unknown_precision_plugins_are_refused():
    with pytest.raises(ValueError, match=r"precision: OmniStrategy supports .* got '16-mixed'"):
        Trainer(accelerator="cpu", devices=1, strategy=OmniStrategy(), logger=False,
                plugins=[MixedPrecision("16-mixed", "cpu")])

    class Custom(Precision):
        pass

    with pytest.raises(ValueError, match=r"got Custom"):
        Trainer(accelerator="cpu", devices=1, strategy=OmniStrategy(), logger=False,
                plugins=[Custom()])


def test_every_batch_is_checked_naming_sample_and_field():
    data = ToyData(8)
    bad = data.items[6]  # second batch, sample 2 of it: one image placeholder too many
    bad["tokens"][int(bad["image_len"])] = IMG
    with pytest.raises(OmniSpecError, match=r"sample 2 has \d+ 'image' placeholder tokens .* "
                                            r"image_len="):
        _fit(make_model(0), data=data, max_steps=2)
    data = ToyData(8)
    data.items[5]["image_len"] = torch.tensor(99)
    with pytest.raises(OmniSpecError, match=r"sample 1 has image_len=99; expected 0 to 5"):
        _fit(make_model(0), data=data, max_steps=2)


def test_lengths_and_tokens_must_be_integers():
    """Found by the fuzz door: a NaN length raised ``cannot convert float NaN to integer``."""
    spec = make_model(0).configure_omni()
    batch = global_batches(ToyData(4), 4)[0]
    nan = batch["image_len"].double().fill_(float("nan"))
    with pytest.raises(OmniSpecError, match=r"batch\['image_len'\]: expected integer row "
                                            r"counts, got torch.float64"):
        spec.check_batch({**batch, "image_len": nan})
    with pytest.raises(OmniSpecError, match=r"batch\['tokens'\]: expected integer token ids"):
        spec.check_batch({**batch, "tokens": batch["tokens"].float()})


def test_a_module_split_by_another_layout_is_refused():
    model = make_model(0)
    trainer = _fit(model, OmniStrategy(num_microbatches=2))
    trainer.validate(model, DataLoader(ToyData(8), batch_size=4), verbose=False)  # same strategy
    with pytest.raises(ValueError, match=r"already split into pipeline stages by another "
                                         r"OmniStrategy \(TP1 PP1 DP1 \(world size 1\); "
                                         r"schedule 'uniform_insertion', 2 microbatches"):
        _fit(model, OmniStrategy(num_microbatches=4))


def hung_peer_worker(rank: int, world: int) -> dict:
    """Rank 1 stops (SIGSTOP, not dead) after one step; rank 0's next step must fail with an
    OmniRuntimeError naming rank, step and what it waited for, within the timeout."""
    import torch.distributed as dist

    model = make_model(0)
    spec = model.configure_omni()
    dims = ParallelDims(pp=2, dp=1, num_microbatches=4).for_world(world, world)
    engine = parallelize(spec, dims, dims.layout(rank, spec.costs_of_blocks()),
                         torch.device("cpu"), timedelta(seconds=3))
    batch = global_batches(ToyData(16), 16)[0]
    engine.step(batch)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    t0 = time.perf_counter()
    try:
        engine.step(batch)
        out = {"error": None}
    except OmniRuntimeError as err:
        out = {"error": str(err)}
    out["seconds"] = time.perf_counter() - t0
    dist.destroy_process_group()
    return out


def _hung_entry(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=timedelta(seconds=3))
    torch.save(hung_peer_worker(rank, 2), out)


def test_a_stopped_peer_fails_the_step_within_the_timeout(tmp_path):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = tmp_path / "rank0.pt"
    procs = [ctx.Process(target=_hung_entry, args=(r, port, str(tmp_path / f"rank{r}.pt")))
             for r in range(2)]
    for p in procs:
        p.start()
    try:
        procs[0].join(60)
    finally:
        for p in procs:  # rank 1 is stopped: SIGKILL ends it
            p.kill()
            p.join()
    assert out.exists(), f"rank 0 wrote no result (exit code {procs[0].exitcode})"
    rank0 = torch.load(out)
    assert rank0["error"] is not None
    assert rank0["seconds"] < 3 * 3.0, rank0
    assert rank0["error"].startswith("rank 0, step 1 (train): "), rank0["error"]
    assert "(timeout 3 s)" in rank0["error"] and "died or stopped" in rank0["error"]
    print(rank0["error"])
