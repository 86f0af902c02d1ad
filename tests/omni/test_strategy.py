"""OmniStrategy as Lightning sees it: registry, clear errors for bad setups, metrics, lost ranks."""

import logging
import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from lightning.pytorch import Trainer
from lightning.pytorch.strategies import StrategyRegistry
from omni_models import ToyData, make_model, reference_run, spawn, strategy_worker
from torch.utils.data import DataLoader

from lightning_omni import OmniSpecError, OmniStrategy


def _fit(strategy, model):
    """A one-rank fit in this process; the process group and the rendezvous variables it
    leaves are removed after it (a later test's group would collide with them)."""
    saved = dict(os.environ)
    try:
        trainer = Trainer(accelerator="cpu", devices=1, strategy=strategy, max_steps=1,
                          logger=False, enable_checkpointing=False, enable_progress_bar=False,
                          enable_model_summary=False)
        trainer.fit(model, DataLoader(ToyData(8), batch_size=4))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        os.environ.clear()
        os.environ.update(saved)


def test_registered_as_omni():
    assert "omni" in StrategyRegistry
    trainer = Trainer(accelerator="cpu", devices=1, strategy="omni", logger=False)
    assert isinstance(trainer.strategy, OmniStrategy)


@pytest.mark.parametrize("kwargs,match", [
    ({"pipeline_parallel": 0}, "pipeline_parallel: expected an int >= 1"),
    ({"schedule": "zero_bubble"}, "schedule: expected one of"),
    ({"num_microbatches": 0}, "num_microbatches: expected an int >= 1"),
    # bool is an int to Python, a mistake here (the pool refuses it too)
    ({"pipeline_parallel": True}, r"^pipeline_parallel: expected an int >= 1, got True$"),
    ({"data_parallel": False}, r"^data_parallel: expected an int >= 1 or None, got False$"),
    ({"zero_stage": True}, r"^zero_stage: expected 0 .* or 1 .*, got True$"),
    ({"lssp": "yes"}, r"^lssp: expected True or False, got 'yes'$"),
    ({"encoder_cost": 3}, r"^encoder_cost: expected a pair \(a, b\) of finite numbers >= 0, "
                          r"not both 0, got 3$"),
    ({"encoder_cost": (1.0, float("nan"))}, r"^encoder_cost: expected a pair .*, got \(1.0, nan\)"),
    ({"encoder_cost": [0, 0]}, r"^encoder_cost: expected a pair .*, got \[0, 0\]$"),
    ({"stage_blocks": True}, r"^stage_blocks: expected a list of ints or None, got True$"),
    ({"locality_groups": [0, 1.5]}, r"^locality_groups: expected a list of ints or None"),
    ({"timeout": 1e308}, r"^timeout: expected a datetime.timedelta > 0, got 1e\+308$"),
    ({"timeout": timedelta(0)}, r"^timeout: expected a datetime.timedelta > 0"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        OmniStrategy(**kwargs)


def test_module_without_configure_omni_fails_before_any_process_starts():
    class Plain(type(make_model(0))):
        configure_omni = None

    with pytest.raises(OmniSpecError, match="configure_omni"):
        _fit(OmniStrategy(), Plain().double())


def test_parallel_sizes_must_match_the_world():
    with pytest.raises(ValueError, match=r"world size 1 \(devices \* num_nodes\), got 2 \* 1"):
        _fit(OmniStrategy(pipeline_parallel=2, data_parallel=1), make_model(0))


def test_the_layout_is_logged_once_and_each_step_at_debug(caplog):
    caplog.set_level(logging.DEBUG, logger="lightning_omni.strategy")
    _fit(OmniStrategy(num_microbatches=2), make_model(0).double())
    ours = [r for r in caplog.records if r.name == "lightning_omni.strategy"]
    assert [r.getMessage() for r in ours if r.levelno == logging.INFO] == [
        "OmniStrategy layout: TP1 PP1 DP1 (world size 1); schedule 'uniform_insertion', 2 "
        "microbatches per replica; lssp=False, reorder=False, zero_stage=0; LLM blocks per "
        "stage [4]; meta build materialized per stage: False"]
    debug = [r.getMessage() for r in ours if r.levelno == logging.DEBUG]
    assert debug[0] == "rank 0: stage 0, replica 0, TP rank 0, LLM blocks (0, 4)"
    assert len(debug) == 2 and debug[1].startswith("training step 0: ")


def test_metrics_split_errors_and_a_lost_rank(tmp_path):
    rank0, _ = spawn(strategy_worker, 2, str(tmp_path), allow_failures=True)
    status, out = rank0
    assert status == "ok", out
    tags = out["tags"]
    for tag in ("omni/tokens_per_s", "omni/bubble_fraction", "omni/step_ms",
                "omni/predicted_step_ms", "omni/peak_saved_activation_mb/stage0",
                "omni/peak_saved_activation_mb/stage1", "omni/bubble_fraction/stage1"):
        assert tag in tags and len(tags[tag]) == 2, tag
    assert all(0.0 <= b < 1.0 for b in tags["omni/bubble_fraction"])
    assert all(v > 0 for v in tags["omni/peak_saved_activation_mb/stage0"])
    assert all(v > 0 for v in tags["omni/tokens_per_s"])
    assert "cannot be split into num_microbatches=3" in out["split_error"]
    assert "probably died" in out["lost_rank_error"]
    assert out["lost_rank_seconds"] < 30
    # the logged loss is the global one (TensorBoard stores float32)
    want = reference_run(1, 16, ToyData(32))["losses"][0]
    assert tags["omni/loss"][0] == pytest.approx(want, rel=1e-6)
    print(out["split_error"], out["lost_rank_error"], sep="\n")


def test_each_microbatch_is_encoded_at_its_own_longest_sample():
    """A microbatch of short samples does not pay for the batch's longest (DDP's smaller
    loader batches would not either): the image encoder sees only its samples' own width."""
    model = make_model(0)
    widths: list[tuple[int, int]] = []
    encoder = model.image_encoder
    forward = encoder.forward

    def recording(x, lengths):
        if torch.is_grad_enabled():  # a training microbatch, not the first batch's checks
            widths.append((x.shape[1], int(lengths.max())))
        return forward(x, lengths)

    encoder.forward = recording
    _fit(OmniStrategy(num_microbatches=2), model)
    full = next(iter(DataLoader(ToyData(8), batch_size=4)))["image"].shape[1]
    assert widths and all(width == longest for width, longest in widths)
    assert any(width < full for width, _ in widths), (widths, full)
