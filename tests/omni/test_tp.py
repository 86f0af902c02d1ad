"""Tensor parallelism inside each pipeline stage (DTensor over a DeviceMesh) composed with PP x DP:
TP2 x PP2 and TP2 x DP2 fits on 4 gloo ranks equal the plain single-process run in float64
(losses, gradients, parameters), with a tied head and gradient clipping, sharded and replicated
encoders, meta builds, ZeRO-1, LSSP and reordering (whole and TP-sharded encoders), and
checkpoints that resume at the same and at another TP degree and consolidate to the plain
module. All runs share one spawn of 4
processes (see tp_workers); a layer saving a row-parallel output for backward runs on 2."""

from pathlib import Path

import pytest
import torch
from omni_models import spawn
from tp_workers import make_tp_model, reference, tp_worker

from lightning_omni.runtime.checkpoint import consolidate

BATCH, SAMPLES = 16, 48  # three steps per epoch; every run is one epoch, resumes the second
RTOL, ATOL = 1e-7, 1e-12
CLIP = 0.5  # under the toy's gradient norms: clipping acts on every step
SCHEDULES = ("encoder_first_stage", "uniform_insertion")
PP2 = [{"name": f"pp2_{s}", "pp": 2, "dp": 1, "tp": 2, "schedule": s, "tie": True,
        "clip": CLIP} for s in SCHEDULES]
PP2[0]["lazy"] = True  # built in configure_model on the meta device: a stage, then shards
PP2[-1]["save"] = True
PP2[-1]["evaluate"] = True  # then validation and prediction, vocabulary-sharded logits
RESUMES = [{**PP2[-1], "name": "resume_tp2", "save": False, "resume": PP2[-1]["name"]},
           {**PP2[-1], "name": "resume_tp1_dp2", "tp": 1, "dp": 2, "save": False,
            "resume": PP2[-1]["name"]}]
CLIP_VALUE = 0.01  # clips part of the toy's gradient elements
DP2 = [{"name": "dp2_enc_tp2_zero", "pp": 1, "dp": 2, "tp": 2, "schedule": "uniform_insertion",
        "zero": 1, "save": True, "clip": CLIP_VALUE, "clip_algorithm": "value"},
       {"name": "dp2_enc_tp1_meta", "pp": 1, "dp": 2, "tp": 2,
        "schedule": "encoder_first_stage", "encoder_tp": 1, "lazy": True}]
DP2_RESUME = {**DP2[0], "name": "dp2_zero_resume", "save": False, "resume": DP2[0]["name"]}
# every sample over 3 encoder rows runs sequence parallel (as in test_strategy_lssp)
# TP with the other stage features (tied head, clipping by norm; the toy's 4 blocks, one per
# virtual stage): two model chunks per stage, recomputation of the blocks and the encoders
COMBOS = [*({"name": f"tp2_pp2_vpp2_{s}", "pp": 2, "dp": 1, "tp": 2, "vpp": 2, "schedule": s,
             "tie": True, "clip": CLIP} for s in SCHEDULES),
          {"name": "tp2_pp2_recompute", "pp": 2, "dp": 1, "tp": 2, "schedule": "uniform_insertion",
           "tie": True, "clip": CLIP, "recompute": True, "encoder_recompute": True}]
BF16 = {"name": "tp2_pp2_bf16_mixed", "pp": 2, "dp": 1, "tp": 2, "schedule": "uniform_insertion",
        "tie": True, "precision": "bf16-mixed"}
GROUPED = {"name": "dp2_lssp_reorder", "pp": 1, "dp": 2, "tp": 2, "encoder": "token",
           "schedule": "uniform_insertion", "encoder_tp": 1, "lssp": True, "reorder": True,
           "lssp_max_rows": 3, "log": True}
# the same with TP-sharded token encoders of 4 heads: Ulysses splits each TP rank's 2 heads
GROUPED_TP = {**GROUPED, "name": "dp2_lssp_reorder_enc_tp2", "encoder": "token4",
              "encoder_tp": 2, "log": False}
# encoder lanes in workload A's shape (TP4, encoder TP2, encoder recomputation): two lanes of
# two processes, each lane's token encoders sharded two ways (4 heads: 2 per process)
# the done-when's one case: ZeRO-1, a meta build, the head tied to the embedding (one stage)
# and clipping by norm, all in one TP2 x DP2 run
ALL_IN_ONE = {"name": "dp2_zero_meta_tied_clip", "pp": 1, "dp": 2, "tp": 2,
              "schedule": "uniform_insertion", "zero": 1, "lazy": True, "tie": True,
              "clip": CLIP}
LANES = {"name": "tp4_enc_tp2_lanes", "pp": 1, "dp": 1, "tp": 4, "heads": 4,
         "encoder": "token4", "encoder_tp": 2, "schedule": "uniform_insertion",
         "encoder_recompute": True, "clip": CLIP}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("tp_ckpt")
    ranks = spawn(tp_worker, 4, [*PP2, *RESUMES, *DP2, DP2_RESUME, GROUPED, GROUPED_TP,
                                 *COMBOS, BF16, LANES, ALL_IN_ONE], BATCH, SAMPLES, str(ckpt),
                  timeout=300)
    return ranks, ckpt


@pytest.fixture(scope="module")
def tied():
    """The plain run of the tied, clipped model after one and after two epochs."""
    return {e: reference(e * SAMPLES // BATCH, BATCH, SAMPLES, clip=CLIP, tie=True)
            for e in (1, 2)}


def _f64(values):
    return torch.tensor(values, dtype=torch.float64)


def _check(ranks, name, ref, names, steps=slice(0, SAMPLES // BATCH), grads=True):
    for r in ranks:
        torch.testing.assert_close(_f64(r[name]["losses"]), _f64(ref["losses"][steps]),
                                   rtol=RTOL, atol=0, msg=lambda m: f"{name} losses: {m}")
    seen = set()
    for r in ranks:
        for kind in ("grads0", "params") if grads else ("params",):
            for n, t in r[name][kind].items():
                torch.testing.assert_close(t, ref[kind][n], rtol=RTOL, atol=ATOL,
                                           msg=lambda m, n=n, k=kind: f"{name} {k} {n}: {m}")
                seen.add(n)
    assert seen == names, f"{name}: not every parameter was hosted and checked"
    # parameters that stay plain get the same gradient, bit for bit, on every TP rank
    by_plan: dict[int, list] = {}
    for r in ranks:
        by_plan.setdefault(r[name]["plan_rank"], []).append(r[name]["plain0"])
    for plan_rank, copies in by_plan.items():
        if len(copies) < 2:
            continue
        assert copies[0], (name, plan_rank)
        for n, g in copies[0].items():
            assert torch.equal(g, copies[1][n]), f"{name}: plain {n} differs between TP ranks"


def test_tp2_pp2_tied_head_and_clipping_match_the_plain_run(runs, tied):
    """TP2 x PP2, both schedules: the head tied to the embedding across the stages (one
    vocabulary-sharded weight), clipping by the global norm over every stage and TP shard;
    the first run built on the meta device in ``configure_model``; then validation (loss and
    an accuracy metric on vocabulary-sharded logits) and prediction."""
    ranks, _ = runs
    names = {n for n, _ in make_tp_model(0, tie=True).named_parameters()}
    for run in PP2:
        _check(ranks, run["name"], tied[1], names)
    assert all(r[PP2[0]["name"]]["tp_rank"] == i % 2 for i, r in enumerate(ranks))
    # validation (loss and accuracy metric) and prediction of the trained model, on every rank
    last = PP2[-1]["name"]
    for r in ranks:
        assert len(r[last]["val"]) == len(tied[1]["val"])
        for got, want in zip(r[last]["val"], tied[1]["val"], strict=True):
            assert got == pytest.approx(want, rel=RTOL), (got, want)
        torch.testing.assert_close(r[last]["preds"], tied[1]["preds"], rtol=RTOL, atol=ATOL)


def test_tp_checkpoint_resumes_at_two_tp_degrees_and_consolidates(runs, tied):
    """The TP2 x PP2 checkpoint holds full tensors: resumed at TP2 x PP2 and at TP1 x PP2 x
    DP2 the second epoch equals the uninterrupted plain run; consolidated, it loads into the
    plain module with the plain run's values after one epoch."""
    ranks, ckpt = runs
    names = {n for n, _ in make_tp_model(0, tie=True).named_parameters()}
    epoch = SAMPLES // BATCH
    for run in RESUMES:
        _check(ranks, run["name"], tied[2], names, steps=slice(epoch, 2 * epoch),
               grads=False)
    plain = make_tp_model(3, tie=True)
    plain.load_state_dict(consolidate(Path(ckpt) / f"{PP2[-1]['name']}.ckpt"))
    for n, p in plain.named_parameters():
        torch.testing.assert_close(p.detach(), tied[1]["params"][n], rtol=RTOL, atol=ATOL)


def test_tp2_dp2_zero_sharded_replicated_encoders_and_meta_build(runs):
    """TP2 x DP2: encoders sharded over the TP group with ZeRO-1 over each TP rank's
    data-parallel group and clipping by value (its checkpoint resumed), or replicated on the TP
    group
    (``encoder_tensor_parallel=1``) with the model built on the meta device in
    ``configure_model`` (each rank materializes its stage, then shards it). With everything
    sharded a rank holds about half of the parameter bytes and a quarter of Adam's state."""
    ranks, _ = runs
    clipped = {e: reference(e * SAMPLES // BATCH, BATCH, SAMPLES, clip=CLIP_VALUE,
                            clip_algorithm="value") for e in (1, 2)}
    ref = reference(SAMPLES // BATCH, BATCH, SAMPLES)
    names = {n for n, _ in make_tp_model(0).named_parameters()}
    _check(ranks, DP2[0]["name"], clipped[1], names)
    _check(ranks, DP2[1]["name"], ref, names)
    epoch = SAMPLES // BATCH
    _check(ranks, DP2_RESUME["name"], clipped[2], names, steps=slice(epoch, 2 * epoch),
           grads=False)
    full = sum(p.numel() * p.element_size() for p in make_tp_model(0).parameters())
    for r in ranks:
        sharded, replicated = r[DP2[0]["name"]]["param_bytes"], r[DP2[1]["name"]]["param_bytes"]
        assert sharded <= 0.6 * full and sharded < replicated, (sharded, replicated, full)
        assert r[DP2[0]["name"]]["optimizer"] == "LocalShardZero"
        assert 0 < r[DP2[0]["name"]]["state_bytes"] <= 0.35 * ref["state_bytes"]


def test_tp2_dp2_lssp_and_reordering_with_replicated_encoders(runs):
    """LSSP (long samples Ulysses sequence parallel over the replicas) and grouped reordering
    with TP2 x DP2: the encoders whole on every TP rank, each TP rank running the same group
    work over the processes of its TP rank."""
    ranks, _ = runs
    ref = reference(SAMPLES // BATCH, BATCH, SAMPLES, encoder="token")
    _check(ranks, GROUPED["name"], ref,
           {n for n, _ in make_tp_model(0, encoder="token").named_parameters()})
    grouped = ranks[0][GROUPED["name"]]["grouped"]
    assert grouped["lssp/long_samples"] >= 4 and grouped["lssp/sp_degree_max"] == 2
    # the strategy's step metrics, gathered over every process, reach Lightning's logger
    logged = ranks[0][GROUPED["name"]]["logged"]
    for key in ("omni/step_ms", "omni/bubble_fraction/stage0", "omni/predicted_step_ms",
                "lssp/long_samples", "encoder/bytes_exchanged"):
        assert len(logged[key]) == SAMPLES // BATCH and all(v >= 0 for v in logged[key]), key
    torch.testing.assert_close(_f64(logged["omni/loss"]), _f64(ref["losses"]), rtol=1e-6,
                               atol=0)


def test_tp2_dp2_lssp_and_reordering_with_tp_sharded_encoders(runs):
    """LSSP and grouped reordering with TP2 x DP2 and the token encoders sharded over the TP
    group (column-parallel qkv, 2 of the 4 heads per TP rank): Ulysses over the processes of
    one TP rank splits that rank's heads; float64 equality with the plain run."""
    ranks, _ = runs
    ref = reference(SAMPLES // BATCH, BATCH, SAMPLES, encoder="token4")
    names = {n for n, _ in make_tp_model(0, encoder="token4").named_parameters()}
    _check(ranks, GROUPED_TP["name"], ref, names)
    for r in ranks:
        got = r[GROUPED_TP["name"]]
        assert got["group_heads"] == (2, 2), got["group_heads"]  # heads per TP rank
        assert got["grouped"]["lssp/long_samples"] >= 4
        assert got["grouped"]["lssp/sp_degree_max"] == 2
        # the encoders really are sharded: each qkv weight is a DTensor, not a plain tensor
        assert not any(n.endswith("qkv.weight") for n in got["plain0"]), got["plain0"]


def test_tp2_dp2_zero_meta_build_tied_head_and_clipping_together(runs, tied):
    """TP2 x DP2 with ZeRO-1, the model built on the meta device, the head tied to the
    embedding (one vocabulary-sharded weight on the one stage) and clipping by norm, in one
    run: float64 equality with the plain run."""
    ranks, _ = runs
    _check(ranks, ALL_IN_ONE["name"], tied[1],
           {n for n, _ in make_tp_model(0, tie=True).named_parameters()})
    for r in ranks:
        assert r[ALL_IN_ONE["name"]]["optimizer"] == "LocalShardZero"


def test_tp4_encoder_lanes_match_the_plain_run(runs, tied):
    """TP4 with the encoders at TP2 (two lanes of two processes), encoder recomputation,
    clipping by the global norm (each lane's encoder shards counted once): float64 equality
    with the plain run, and each lane encoded a share of the samples, not all of them."""
    ranks, _ = runs
    kw = {"encoder": "token4", "heads": 4}
    ref = reference(SAMPLES // BATCH, BATCH, SAMPLES, clip=CLIP, **kw)
    _check(ranks, LANES["name"], ref, {n for n, _ in make_tp_model(0, **kw).named_parameters()})
    rows = [r[LANES["name"]]["rows_encoded"] for r in ranks]  # TP ranks 0..3: lanes 0,0,1,1
    assert rows[0] == rows[1] and rows[2] == rows[3], rows  # a lane's processes: the same rows
    assert 0 < rows[0] and 0 < rows[2], rows
    for r in ranks:  # the encoders really are sharded within the lane
        assert not any(n.endswith("qkv.weight") for n in r[LANES["name"]]["plain0"])


def test_tp2_dp2_encoder_lanes_of_one_process_share_the_samples(runs):
    """Encoder TP 1 under TP2: each TP rank is a lane and encodes its own share of the rank's
    samples, in the per-replica plans and in the LSSP group plans."""
    ranks, _ = runs
    for name in (DP2[1]["name"], GROUPED["name"]):
        for a, b in ((0, 1), (2, 3)):  # the two processes of each plan rank
            ra, rb = ranks[a][name]["rows_encoded"], ranks[b][name]["rows_encoded"]
            assert ra > 0 and rb > 0, (name, ra, rb)


def test_tp2_pp2_with_interleaved_stages_and_recomputation_match_the_plain_run(runs, tied):
    """TP2 x PP2 x VPP2 (both schedules: each stage shards the blocks of both its chunks) and
    TP2 x PP2 with ``recompute`` and ``encoder_recompute`` (checkpointed DTensor blocks and
    sharded encoders), tied head and clipping: float64 equality with the plain run."""
    ranks, _ = runs
    names = {n for n, _ in make_tp_model(0, tie=True).named_parameters()}
    def plain(run):  # the parameters left unsharded (a block left whole computes the same)
        return {n for r in ranks for n in r[run["name"]]["plain0"]}

    for run in COMBOS:
        _check(ranks, run["name"], tied[1], names)
        assert plain(run) == plain(PP2[0]), (run["name"], plain(run) ^ plain(PP2[0]))
    assert not any(n.startswith("blocks.") and n.endswith("qkv.weight") for n in plain(PP2[0]))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_tp2_pp2_bf16_mixed_is_close_to_the_plain_bf16_run(runs):
    """bf16-mixed under TP2 x PP2 against the plain run under the same CPU bf16 autocast.
    Tolerances: TP sums the row-parallel products in two bf16 partial sums and an all-reduce,
    the plain matmul in one, so the losses differ by bf16 rounding, not by fp32 order (the
    1e-6 of test_user_path's bf16-mixed without TP): within 2^-8 relative, one bf16 ulp
    (measured 2e-4); first-step gradients within 3e-2 of each tensor's norm (measured 9e-3).
    A missing or doubled reduction is off by the whole value."""
    ranks, _ = runs
    steps = SAMPLES // BATCH
    ref = reference(steps, BATCH, SAMPLES, precision="bf16-mixed", tie=True)
    fp32 = reference(steps, BATCH, SAMPLES, precision="32-true", tie=True)
    seen = set()
    for r in ranks:
        got = r[BF16["name"]]
        for g, want, plain32 in zip(got["losses"], ref["losses"], fp32["losses"], strict=True):
            assert abs(g - want) <= 2 ** -8 * abs(want), (g, want)
            # the precision really changed the result: this is not the fp32 run
            assert abs(g - plain32) > 1e-4 * abs(plain32), (g, plain32)
        for n, g in got["grads0"].items():
            assert g.dtype == torch.float32 and _rel(g, ref["grads0"][n]) < 3e-2, n
            seen.add(n)
    assert seen == set(ref["grads0"])


@pytest.mark.parametrize("kwargs, words", [
    ({"tensor_parallel": 4, "encoder_tensor_parallel": 3, "lssp": True},
     "encoder_tensor_parallel: expected a divisor of tensor_parallel=4"),
    ({"tensor_parallel": 2, "encoder_tensor_parallel": 4}, "encoder_tensor_parallel: expected"),
    ({"tensor_parallel": 0}, "tensor_parallel: expected"),
])
def test_refused_combinations_name_their_arguments(kwargs, words):
    from lightning_omni import OmniStrategy

    with pytest.raises(ValueError, match=words):
        OmniStrategy(**kwargs)


def test_a_layer_saving_a_row_parallel_output_for_backward(tmp_path):
    """TP2 on 2 processes, two steps: every block's MLP ends in a float64 RMSNorm that saves
    the row-parallel ``mlp.2``'s output (an ``AsyncCollectiveTensor``) for backward, where the
    saved-activation meter's hooks see it. It equals the plain run."""
    run = {"name": "tp2_post_norm", "pp": 1, "dp": 1, "tp": 2,
           "schedule": "uniform_insertion", "post_norm": True}
    steps, samples = 2, 2 * BATCH
    ranks = spawn(tp_worker, 2, [run], BATCH, samples, str(tmp_path), timeout=240)
    names = {n for n, _ in make_tp_model(0, post_norm=True).named_parameters()}
    assert any(n.endswith("mlp.3.weight") for n in names)
    _check(ranks, run["name"], reference(steps, BATCH, samples, post_norm=True), names,
           steps=slice(0, steps))
