"""The core correctness test: a pipelined, data-parallel OmniStrategy step equals one step of the
plain LightningModule on the same global batch (float64), for both encoder placements."""

from pathlib import Path

import pytest
import torch
from omni_models import ToyData, fit_worker, make_model, reference_run, spawn

from lightning_omni.runtime.checkpoint import consolidate, is_sharded, shard_path

SCHEDULES = ["encoder_first_stage", "uniform_insertion"]
STEPS, BATCH, SAMPLES = 6, 16, 48  # two epochs of three steps; the checkpoint ends the first
RTOL, ATOL = 1e-7, 1e-12


def _f64(values):
    return torch.tensor(values, dtype=torch.float64)


@pytest.fixture(scope="module")
def reference():
    return reference_run(STEPS, BATCH, ToyData(SAMPLES))


@pytest.mark.parametrize("pp,dp,zero,lazy", [(1, 1, 0, 0), (1, 2, 0, 0), (2, 1, 0, 0),
                                             (2, 2, 0, 0), (2, 2, 1, 1)])
def test_matches_single_process(pp, dp, zero, lazy, reference, tmp_path):
    """Also with ZeRO-1 (``zero_stage=1``: optimizer state sharded over each stage's
    data-parallel group) and the model built in ``configure_model`` (``lazy``: on the meta
    device, each rank materializing its stage): the same losses, parameters and resume."""
    ckpt = str(tmp_path) if (pp, dp) == (2, 2) else None
    schedules = SCHEDULES[1:] if zero else SCHEDULES
    ranks = spawn(fit_worker, pp * dp, pp, dp, schedules, STEPS, BATCH, SAMPLES, ckpt, zero,
                  bool(lazy))
    names = {n for n, _ in make_model(0).named_parameters()}
    if lazy:
        full = sum(p.numel() * p.element_size() for p in make_model(0).parameters())
        for r in ranks:  # a stage's blocks and the encoders, never the whole model
            assert 0 < r[schedules[0]]["param_bytes"] < full
    for schedule in schedules:
        for r in ranks:
            torch.testing.assert_close(_f64(r[schedule]["losses"]), _f64(reference["losses"]),
                                       rtol=RTOL, atol=0)
            # each rank ran its own part of the whole plan; at PP1 x DP2 it planned from its
            # replica's data alone, and the other replica's data made another plan
            assert all(own for own, _ in r[schedule]["plans"])
            if (pp, dp) == (1, 2) and schedule == "uniform_insertion":
                assert any(other for _, other in r[schedule]["plans"])
        seen_grads, seen_params = set(), set()
        for r in ranks:
            for n, g in r[schedule]["grads0"].items():
                torch.testing.assert_close(g, reference["grads0"][n], rtol=RTOL, atol=ATOL,
                                           msg=lambda m, n=n, s=schedule: f"{s} grad {n}: {m}")
                seen_grads.add(n)
            for n, p in r[schedule]["params"].items():
                torch.testing.assert_close(p, reference["params"][n], rtol=RTOL, atol=ATOL,
                                           msg=lambda m, n=n, s=schedule: f"{s} param {n}: {m}")
                seen_params.add(n)
        # every parameter is hosted (and checked) somewhere
        assert seen_grads == names and seen_params == names
    if zero:
        full = reference["state_bytes"]
        for r in ranks:
            assert r[schedules[0]]["optimizer"] == "ZeroRedundancyOptimizer"
            # Adam keeps two float64 moments per element: sharded, each rank well under half
            assert 0 < r[schedules[0]]["state_bytes"] <= 0.6 * full
        # the shards cover every element's state once per stage (encoders: once per stage)
        assert sum(r[schedules[0]]["state_bytes"] for r in ranks) >= full, \
            [r[schedules[0]]["state_bytes"] for r in ranks]
    if ckpt is not None:
        path = Path(ckpt) / "epoch0.ckpt"
        assert is_sharded(path) and shard_path(path, 0).exists() and shard_path(path, 1).exists()
        assert not list(path.glob(".*tmp*")), "temporary files left behind"
        # resuming reproduces the uninterrupted run's later losses
        epoch = SAMPLES // BATCH
        torch.testing.assert_close(_f64(ranks[0]["resumed_losses"]),
                                   _f64(reference["losses"][epoch:]), rtol=RTOL, atol=0)
        # the consolidated state dict loads into the plain module, no strategy involved
        plain = make_model(3)
        plain.load_state_dict(consolidate(path))
        after = reference_run(epoch, BATCH, ToyData(SAMPLES))["params"]
        for n, p in plain.named_parameters():
            torch.testing.assert_close(p.detach(), after[n], rtol=RTOL, atol=ATOL)
