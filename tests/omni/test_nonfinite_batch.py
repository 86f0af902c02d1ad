"""NaN and inf in a batch: OmniSpec.check_batch names the key and the sample, OmniStrategy
refuses the batch before its optimizer step (on every rank, replicas included), and
``check_finite=False`` lets it through as a plain Lightning run would."""

from __future__ import annotations

import math
import os
from typing import Any

import pytest
import torch
from lightning.pytorch import Callback, Trainer
from omni_models import ToyData, global_batches, make_model, spawn
from torch.utils.data import DataLoader, Dataset

from lightning_omni import OmniSpecError, OmniStrategy


@pytest.fixture(autouse=True)
def _own_process_group():
    """In-process fits start a gloo group and set MASTER_PORT: end both for later tests."""
    import torch.distributed as dist

    saved = dict(os.environ)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
    os.environ.clear()
    os.environ.update(saved)


def _with(batch: dict, key: str, index: tuple[int, ...], value: float) -> dict:
    bad = {k: v.clone() for k, v in batch.items()}
    bad[key][index] = value
    return bad


@pytest.mark.parametrize("key", ["image", "audio"])
@pytest.mark.parametrize("sample", [0, 3, 6])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_check_batch_names_the_key_the_sample_and_the_first_bad_element(
        key: str, sample: int, value: float) -> None:
    spec = make_model(0).configure_omni()
    batch = global_batches(ToyData(8), 8)[0]
    spec.check_batch(batch)  # the clean batch passes
    bad = _with(batch, key, (sample, 1, 2), value)
    bad[key][7, 0, 0] = value  # a later sample too: the message names the first
    what = "NaN" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    with pytest.raises(OmniSpecError) as err:
        spec.check_batch(bad)
    assert str(err.value).startswith(
        f"batch['{key}']: sample {sample} holds {what} (first at index ({sample}, 1, 2); "
        "2 non-finite value(s) in 2 sample(s))")
    assert "OmniStrategy(check_finite=False)" in str(err.value)
    spec.check_batch(bad, check_finite=False)  # the opt-out lets it through


def test_any_floating_field_is_checked_and_integer_fields_are_not_read() -> None:
    spec = make_model(0).configure_omni()
    batch = global_batches(ToyData(4), 4)[0]
    weights = torch.ones(4, dtype=torch.float32)
    weights[2] = math.nan  # a field the spec does not name, read by a user's loss
    with pytest.raises(OmniSpecError, match=r"^batch\['loss_weight'\]: sample 2 holds NaN"):
        spec.check_batch({**batch, "loss_weight": weights})
    spec.check_batch({**batch, "ids": torch.arange(4)})  # integers cannot hold NaN


class _NanSample(Dataset):
    """ToyData with NaN in one image row of sample ``index`` (a row its length makes valid)."""

    def __init__(self, data: ToyData, index: int) -> None:
        self.data, self.index = data, index
        assert int(data[index]["image_len"]) > 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict:
        item = self.data[i]
        if i == self.index:
            item = {**item, "image": item["image"].clone()}
            item["image"][0, 1] = math.nan
        return item


class _Weights(Callback):
    """The weights after each optimizer step."""

    def __init__(self) -> None:
        self.after: list[dict[str, torch.Tensor]] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.after.append({n: p.detach().clone() for n, p in module.named_parameters()})


def _fit(strategy: OmniStrategy, model: Any, seen: _Weights) -> Trainer:
    """Three steps of 4 samples; batch 2 (samples 8..11) holds NaN in sample 9, its sample 1."""
    trainer = Trainer(accelerator="cpu", devices=1, strategy=strategy, max_steps=3,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0,
                      use_distributed_sampler=False, callbacks=[seen])
    trainer.fit(model, DataLoader(_NanSample(ToyData(12), 9), batch_size=4))
    return trainer


def test_fit_refuses_the_nan_batch_and_keeps_the_weights_of_the_last_step() -> None:
    model, seen = make_model(0), _Weights()
    with pytest.raises(OmniSpecError, match=r"^batch\['image'\]: sample 1 holds NaN "
                                            r"\(first at index \(1, 0, 1\)"):
        _fit(OmniStrategy(), model, seen)
    assert model.trainer.global_step == 2  # two optimizer steps, not the third
    weights = dict(model.named_parameters())
    for name, value in seen.after[-1].items():
        assert torch.equal(weights[name].detach(), value), name
        assert torch.isfinite(value).all(), name


def test_check_finite_false_lets_lightning_take_the_nan_batch() -> None:
    model, seen = make_model(0), _Weights()
    _fit(OmniStrategy(check_finite=False), model, seen)
    assert len(seen.after) == 3  # the third step ran on the NaN batch
    assert all(torch.isfinite(p).all() for p in seen.after[1].values())
    assert not all(torch.isfinite(p).all() for p in model.parameters())


def test_check_finite_is_a_boolean() -> None:
    with pytest.raises(TypeError, match="check_finite"):
        OmniStrategy(check_finite="no")


# -- replicas read different batches: every rank refuses together -------------------------------
def _replica_worker(rank: int, world: int) -> str:
    """Two replicas (PP=1, DP=2): replica 1's second batch holds NaN, replica 0's is clean."""
    from lightning_omni.runtime import ParallelDims, parallelize

    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    model = make_model(0)
    spec = model.configure_omni()
    dims = ParallelDims(pp=1, dp=2, num_microbatches=2).for_world(world, world)
    from datetime import timedelta

    engine = parallelize(spec, dims, dims.layout(rank, spec.costs_of_blocks()),
                         torch.device("cpu"), timedelta(seconds=60))
    batches = global_batches(ToyData(16, seed=rank), 4)
    engine.step(batches[0])
    second = _with(batches[2], "audio", (3, 0, 1), math.inf) if rank == 1 else batches[2]
    try:
        engine.step(second)
    except OmniSpecError as err:
        return str(err)
    return "accepted"


def test_every_replica_refuses_when_one_replica_holds_nan() -> None:
    errors = spawn(_replica_worker, 2, timeout=240.0)
    for err in errors:
        assert err.startswith("batch['audio']: sample 3 holds inf (first at index (3, 0, 1)"), err
        assert "replica 1's batch at step 1; every replica stops" in err
