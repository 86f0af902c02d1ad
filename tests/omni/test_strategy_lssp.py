"""LSSP and grouped reordering under OmniStrategy: a pipelined, data-parallel step whose encoder
work runs as group actions (long samples Ulysses sequence parallel over a stage's data-parallel
group, samples moved between replicas) equals one step of the plain module on the same global
batch (float64), and the step's plan facts reach TensorBoard."""

import pytest
import torch
from omni_models import ToyData, lssp_worker, make_model, reference_run, spawn

STEPS, BATCH, SAMPLES = 2, 16, 32
RTOL, ATOL = 1e-7, 1e-12
# every sample over 3 encoder rows must run sequence parallel (IMG_MAX=5, AUD_MAX=6)
MODES = {
    "lssp": {"lssp": True, "lssp_max_rows": 3},
    "reorder": {"reorder": True, "heavy": True, "encoder_cost": (1.0, 0.5)},
    # both at once, all encoder work on stage 0's data-parallel group
    "both": {"lssp": True, "reorder": True, "heavy": True, "lssp_max_rows": 3,
             "schedule": "encoder_first_stage"},
}


@pytest.fixture(scope="module")
def reference():
    return reference_run(STEPS, BATCH, ToyData(SAMPLES), encoder="token")


@pytest.fixture(scope="module")
def pp1_dp2(tmp_path_factory):
    return spawn(lssp_worker, 2, 1, 2, MODES, STEPS, BATCH, SAMPLES,
                 str(tmp_path_factory.mktemp("tb")))


@pytest.fixture(scope="module")
def pp2_dp2():
    return spawn(lssp_worker, 4, 2, 2, MODES, STEPS, BATCH, SAMPLES, timeout=240)


def _check(ranks, reference, mode):
    names = {n for n, _ in make_model(0, encoder="token").named_parameters()}
    seen = set()
    for r in ranks:
        torch.testing.assert_close(torch.tensor(r[mode]["losses"], dtype=torch.float64),
                                   torch.tensor(reference["losses"], dtype=torch.float64),
                                   rtol=RTOL, atol=0)
        for n, g in r[mode]["grads0"].items():
            torch.testing.assert_close(g, reference["grads0"][n], rtol=RTOL, atol=ATOL,
                                       msg=lambda m, n=n: f"{mode} grad {n}: {m}")
            seen.add(n)
    assert seen == names  # every parameter is hosted, and checked, somewhere


@pytest.mark.parametrize("mode", list(MODES))
def test_pp1_dp2_matches_single_process(pp1_dp2, reference, mode):
    _check(pp1_dp2, reference, mode)


@pytest.mark.parametrize("mode", list(MODES))
def test_pp2_dp2_matches_single_process(pp2_dp2, reference, mode):
    _check(pp2_dp2, reference, mode)


@pytest.mark.parametrize("fixture", ["pp1_dp2", "pp2_dp2"])
def test_the_runs_split_and_moved_samples(fixture, request):
    ranks = request.getfixturevalue(fixture)
    lssp, reorder = ranks[0]["lssp"]["metrics"], ranks[0]["reorder"]["metrics"]
    assert lssp["lssp/long_samples"] >= 4 and lssp["lssp/sp_degree_max"] == 2
    assert reorder["lssp/long_samples"] == 0
    assert reorder["reorder/samples_moved"] > 0
    assert reorder["reorder/imbalance_after"] < reorder["reorder/imbalance_before"]
    both = ranks[0]["both"]["metrics"]
    assert both["lssp/long_samples"] >= 4
    assert both["reorder/imbalance_after"] < both["reorder/imbalance_before"]
    # every rank of a group exchanges bytes (encoder_first_stage: only stage 0's)
    assert all(r[m]["bytes"] > 0 for r in ranks for m in ("lssp", "reorder"))


def test_metrics_reach_tensorboard(pp1_dp2):
    tags = pp1_dp2[0]["lssp"]["tags"]
    for key in ("reorder/imbalance_before", "reorder/imbalance_after", "lssp/long_samples",
                "lssp/sp_degree_max", "lssp/sp_degree_mean", "encoder/bytes_exchanged"):
        assert len(tags[key]) == STEPS, key
    assert all(v >= 4 for v in tags["lssp/long_samples"])
    assert all(v > 0 for v in tags["encoder/bytes_exchanged"])
