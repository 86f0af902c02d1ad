"""Interleaved pipelines (``virtual_pipeline_parallel``): OmniStrategy with two model chunks per
stage equals the plain single-process run in float64, for both encoder placements, through a
checkpoint resume, validation with short batches and predict; and what it refuses."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from omni_models import (
    ToyData,
    _loader,
    _Record,
    _trainer,
    global_batches,
    loss_terms,
    make_model,
    reference_run,
    spawn,
)
from torch.utils.data import DataLoader, DistributedSampler

from lightning_omni import OmniStrategy
from lightning_omni.plan.interleaved import first_microbatches
from lightning_omni.plan.lssp_schedule import GroupOptions, build_grouped_plan
from lightning_omni.plan.messages import check_schedule
from lightning_omni.plan.schedule import (
    Kind,
    assign_encoder_samples,
    forward_only,
    uniform_insertion,
)
from lightning_omni.runtime import checkpoint as ckpt
from lightning_omni.runtime.engine import _with_empty, build_forward_plan, build_plan
from lightning_omni.runtime.hosting import param_hosting, stage_modules
from lightning_omni.runtime.layout import make_layout

SCHEDULES = ["encoder_first_stage", "uniform_insertion"]
STEPS, BATCH, SAMPLES = 4, 16, 32  # two epochs of two steps; the checkpoint ends the first
VAL_SAMPLES, VAL_BATCH = 14, 6  # per replica: batches of 3 and 1 microbatches (not 2k)
RTOL, ATOL = 1e-7, 1e-12
MICRO = 4


def _f64(values):
    return torch.tensor(values, dtype=torch.float64)


# -- plan and layout, no processes ----------------------------------------------------------------
def test_virtual_stages_cut_the_blocks_chunk_by_chunk():
    lay = make_layout(4, 3, 2, 2, [1.0, 1.0, 2.0, 1.0, 1.0, 2.0], vpp=2)
    # virtual stage k = chunk * pp + stage: stage 1 holds chunks 1 and 3
    assert lay.block_bounds == ((0, 2), (2, 3), (3, 5), (5, 6))
    assert lay.chunk_bounds(1) == ((2, 3), (5, 6)) and lay.chunk_of(3) == 1
    spec = make_model(0).configure_omni()
    lay = make_layout(2, 0, 2, 1, spec.costs_of_blocks(), stage_blocks=[1, 1, 1, 1], vpp=2)
    blocks = list(spec.blocks)
    mods = stage_modules(spec, lay, 0, encoders=False)
    assert mods == [spec.embedding, blocks[0], blocks[2]]
    assert stage_modules(spec, lay, 1, encoders=False) == [blocks[1], blocks[3], spec.head]
    hosting = param_hosting(spec, lay, "encoder_first_stage")
    held = {id(p) for p in hosting.held()}
    assert {id(p) for p in blocks[2].parameters()} <= held
    assert not {id(p) for p in blocks[1].parameters()} & held
    with pytest.raises(ValueError, match="virtual_pipeline_parallel: expected at most 2"):
        make_layout(2, 0, 2, 1, [1.0] * 4, vpp=3)
    with pytest.raises(ValueError, match="stage_blocks: expected pipeline_parallel \\* "
                                         "virtual_pipeline_parallel = 4 positive counts"):
        make_layout(2, 0, 2, 1, [1.0] * 4, stage_blocks=[2, 2], vpp=2)


def _costs(dp: int, n: int) -> tuple:
    rows = [(3.0, 0.0, 1.0, 2.0), (0.0, 0.0, 0.0, 0.0), (1.0, 5.0, 0.0, 2.0), (2.0, 2.0, 1.0, 1.0)]
    return tuple(tuple(rows[(d + m) % 4] for m in range(n)) for d in range(dp))


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("pp,dp,n", [(2, 1, 4), (2, 2, 4), (3, 1, 6)])
def test_runtime_plans_interleave_and_run(schedule, pp, dp, n):
    """Every rank runs each (microbatch, virtual stage) forward and backward once, on its own
    virtual stages; the plan runs under the tag-free posting order; short evaluation batches
    get a plan of their own microbatch count."""
    plan = build_plan(schedule, pp, _costs(dp, n), 2)
    check_schedule(plan)
    assert plan.num_chunks == 2 and plan.num_replicas == dp
    for rank, prog in enumerate(plan.actions):
        for kind in (Kind.LLM_FWD, Kind.LLM_BWD):
            done = sorted((a.microbatch, a.stage) for a in prog if a.kind == kind)
            assert done == sorted((m, c * pp + rank % pp) for m in range(n) for c in range(2))
    for short in range(1, n):  # the engine's plan of a short evaluation batch
        extra = -short % pp
        fwd = build_forward_plan(schedule, pp, _with_empty(_costs(dp, short), extra), 2)
        fwd = first_microbatches(fwd, short) if extra else fwd
        check_schedule(fwd)
        assert {a.microbatch for prog in fwd.actions for a in prog if a.microbatch >= 0} == \
            set(range(short))
        assert not any(a.kind == Kind.LLM_BWD for prog in fwd.actions for a in prog)


def test_uniform_insertion_keeps_the_planners_encoder_placement():
    """The runtime's interleaved plan of one replica is the planner's (pricing prices
    ``interleave(uniform_insertion(...))``): the same actions, all-reduces and completion
    points aside."""
    from lightning_omni.plan.interleaved import interleave

    costs = _costs(1, 4)
    samples, shares = assign_encoder_samples(costs[0], 2, skip_stage0_drain=False)
    planned = interleave(uniform_insertion(2, 4, shares, grad_sync=True, samples=samples,
                                           inline_stage0=True), 2)
    ran = build_plan("uniform_insertion", 2, costs, 2)

    def core(prog):
        return [a for a in prog if a.kind not in (Kind.ALLREDUCE, Kind.WAIT)]

    assert [core(p) for p in ran.actions] == [core(p) for p in planned.actions]
    with pytest.raises(ValueError, match="a forward-only plan"):
        first_microbatches(ran, 2)
    with pytest.raises(ValueError, match="num_microbatches: expected at most the plan's 4"):
        first_microbatches(forward_only(ran), 5)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("pp,dp", [(2, 2), (3, 2), (2, 4)])
def test_grouped_plans_interleave_and_run(schedule, pp, dp):
    """LSSP and grouped reordering: the encoder group actions join the interleaved order;
    members of a group still meet every group collective in the same order."""
    lengths = tuple(tuple(tuple(((d + m + i) % 4 * 3, (m * i) % 3 * 2) for i in range(3))
                          for m in range(2 * pp)) for d in range(dp))
    locality = tuple((r // pp) // 2 for r in range(pp * dp))  # two replicas per group
    opts = GroupOptions(True, True, locality, (4, 2), 1.0, 0.01, 5.0, in_row_bytes=(8, 4),
                        out_row_bytes=16, sp_row_bytes=(64, 64))
    plan = build_grouped_plan(schedule, pp, lengths, opts, (), 2)
    check_schedule(plan.schedule)
    assert plan.schedule.num_chunks == 2
    for w in plan.works:
        seqs = [[(a.kind, a.microbatch, a.payload) for a in plan.schedule.actions[r]
                 if a.group and set(a.group) <= set(w.members)] for r in w.members]
        assert all(seq == seqs[0] for seq in seqs)
    assert any(len(w.members) > 1 for w in plan.works)
    # a short evaluation batch: padded with empty microbatches, which are dropped again
    short = tuple(rep[:pp + 1] for rep in lengths)
    padded = build_grouped_plan(schedule, pp, _with_empty(short, pp - 1), opts, (), 2)
    fwd = first_microbatches(forward_only(padded.schedule), pp + 1)
    check_schedule(fwd)
    assert any(a.kind == Kind.ALLTOALL for prog in fwd.actions for a in prog)
    assert max(a.microbatch for prog in fwd.actions for a in prog) == pp


def test_refusals_name_the_argument(tmp_path):
    with pytest.raises(ValueError, match="virtual_pipeline_parallel: expected an int >= 1"):
        OmniStrategy(pipeline_parallel=2, virtual_pipeline_parallel=0)
    with pytest.raises(TypeError, match="virtual_pipeline_parallel: expected an int"):
        OmniStrategy(pipeline_parallel=2, virtual_pipeline_parallel="2")
    with pytest.raises(ValueError, match="pipeline_parallel: expected >= 2 for "
                                         "virtual_pipeline_parallel=2"):
        OmniStrategy(pipeline_parallel=1, virtual_pipeline_parallel=2)
    with pytest.raises(ValueError, match="num_microbatches: expected a multiple of "
                                         "pipeline_parallel=2"):
        OmniStrategy(pipeline_parallel=2, num_microbatches=3, virtual_pipeline_parallel=2)
    assert OmniStrategy(pipeline_parallel=2, virtual_pipeline_parallel=2).num_microbatches == 4
    # a checkpoint written with one chunk per stage does not resume with two
    ckpt.write_shard(tmp_path, 0, {})
    ckpt.write_shard(tmp_path, 1, {})
    ckpt.write_marker(tmp_path, 2)
    assert ckpt.num_chunks(tmp_path) == 1
    strategy = OmniStrategy(pipeline_parallel=2, virtual_pipeline_parallel=2)
    with pytest.raises(ValueError, match="written with 1 model chunks per stage, expected "
                                         "virtual_pipeline_parallel=2.*consolidate"):
        strategy.load_checkpoint(tmp_path)
    ckpt.write_marker(tmp_path, 2, 2)
    assert ckpt.num_chunks(tmp_path) == 2


# -- OmniStrategy against the plain run ---------------------------------------------------------
class _Eval(pl.Callback):
    def __init__(self) -> None:
        self.val: list[float] = []

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx,
                                dataloader_idx=0) -> None:
        self.val.append(float(outputs["loss"]))


def _val_loader(rank: int, pp: int, dp: int) -> DataLoader:
    data = ToyData(VAL_SAMPLES, seed=1)
    sampler = DistributedSampler(data, num_replicas=dp, rank=rank // pp, shuffle=False)
    return DataLoader(data, batch_size=VAL_BATCH, sampler=sampler)


def vpp_worker(rank: int, world: int, pp: int, dp: int, runs: list[dict[str, Any]],
               ckpt_dir: str | None) -> dict[str, Any]:
    """Per run (OmniStrategy keywords, ``model``: model keywords): losses, first-step
    gradients and final hosted parameters of a fit, then (``evaluate``) validation losses and
    predictions. With ``ckpt_dir``, the last run again: stopped after one epoch and resumed."""
    out: dict[str, Any] = {}

    def strategy(kw: dict) -> OmniStrategy:
        return OmniStrategy(pipeline_parallel=pp, data_parallel=dp, num_microbatches=MICRO,
                            virtual_pipeline_parallel=2, **kw)

    for i, run in enumerate(runs):
        run = dict(run)
        model_kw = run.pop("model", {})
        evaluate = run.pop("evaluate", False)
        model = make_model(0, **model_kw)
        if model_kw.get("lazy"):
            torch.manual_seed(0)
        rec, ev = _Record(), _Eval()
        s = strategy(run)
        trainer = _trainer(world, s, STEPS, [rec, ev])
        trainer.fit(model, _loader(rank, pp, dp, SAMPLES, BATCH))
        preds = []
        if evaluate:
            trainer.validate(model, _val_loader(rank, pp, dp), verbose=False)
            preds = trainer.predict(model, _val_loader(rank, pp, dp))
        hosted = s.engine.hosted_param_ids()
        grouped = s.last_step.grouped
        out[i] = {"losses": rec.losses, "grads0": rec.grads0, "val": ev.val,
                  "preds": torch.cat(preds) if preds else None,
                  "grouped": grouped.metrics() if grouped is not None else None,
                  "params": {n: p.detach().clone() for n, p in model.named_parameters()
                             if id(p) in hosted}}
    if ckpt_dir is not None:
        run = dict(runs[-1])
        model_kw = run.pop("model", {})
        run.pop("evaluate", None)
        save = pl.callbacks.ModelCheckpoint(dirpath=ckpt_dir, filename="epoch0", save_top_k=-1)
        trainer = _trainer(world, strategy(run), -1, [save], max_epochs=1,
                           enable_checkpointing=True)
        trainer.fit(make_model(0, **model_kw), _loader(rank, pp, dp, SAMPLES, BATCH))
        rec = _Record()
        _trainer(world, strategy(run), -1, [rec], max_epochs=STEPS * BATCH // SAMPLES).fit(
            make_model(1, **model_kw), _loader(rank, pp, dp, SAMPLES, BATCH),
            ckpt_path=os.path.join(ckpt_dir, "epoch0.ckpt"))
        out["resumed_losses"] = rec.losses
    return out


def _plain_eval(params: dict[str, torch.Tensor], dp: int, **model_kw) -> tuple[list, list]:
    """The plain module with ``params``: the global validation loss of every batch and each
    replica's predictions (its shard of the validation set, in order)."""
    model = make_model(0, **{k: v for k, v in model_kw.items() if k != "lazy"})
    model.load_state_dict(params, strict=False)
    data = ToyData(VAL_SAMPLES, seed=1)
    shards = [global_batches(torch.utils.data.Subset(data, list(range(d, len(data), dp))),
                             VAL_BATCH) for d in range(dp)]
    losses, preds = [], [[] for _ in range(dp)]
    with torch.no_grad():
        for j in range(len(shards[0])):
            total = count = 0.0
            for d in range(dp):
                logits = model(shards[d][j])
                t, c = loss_terms(logits, shards[d][j])
                total, count = total + float(t), count + float(c)
                preds[d].append(logits)
            losses.append(total / count)
    return losses, [torch.cat(p) for p in preds]


def _check_run(ranks: list[dict], key: Any, reference: dict, pp: int, dp: int,
               model_kw: dict) -> None:
    plain_kw = {k: v for k, v in model_kw.items() if k != "lazy"}
    names = {n for n, _ in make_model(0, **plain_kw).named_parameters()}
    seen_grads, seen_params = set(), set()
    for r in ranks:
        got = r[key]
        torch.testing.assert_close(_f64(got["losses"]), _f64(reference["losses"]),
                                   rtol=RTOL, atol=0)
        for n, g in got["grads0"].items():
            torch.testing.assert_close(g, reference["grads0"][n], rtol=RTOL, atol=ATOL,
                                       msg=lambda m, n=n: f"run {key} grad {n}: {m}")
            seen_grads.add(n)
        for n, p in got["params"].items():
            torch.testing.assert_close(p, reference["params"][n], rtol=RTOL, atol=ATOL,
                                       msg=lambda m, n=n: f"run {key} param {n}: {m}")
            seen_params.add(n)
    assert seen_grads == names and seen_params == names
    if ranks[0][key]["preds"] is None:
        return
    val, preds = _plain_eval(reference["params"], dp, **model_kw)
    for rank, r in enumerate(ranks):
        torch.testing.assert_close(_f64(r[key]["val"]), _f64(val), rtol=RTOL, atol=0)
        torch.testing.assert_close(r[key]["preds"], preds[rank // pp], rtol=RTOL, atol=ATOL)


def test_pp2_vpp2_matches_single_process(tmp_path):
    """Both schedules on 2 ranks with 2 chunks each (4 virtual stages of one block), then
    validation with short batches and predict, and a resume from the interleaved run's
    sharded checkpoint."""
    runs = [{"schedule": "encoder_first_stage"},
            {"schedule": "uniform_insertion", "evaluate": True}]
    ranks = spawn(vpp_worker, 2, 2, 1, runs, str(tmp_path))
    reference = reference_run(STEPS, BATCH, ToyData(SAMPLES))
    for i in range(len(runs)):
        _check_run(ranks, i, reference, 2, 1, {})
    path = Path(tmp_path) / "epoch0.ckpt"
    assert ckpt.num_stages(path) == 2 and ckpt.num_chunks(path) == 2
    epoch = SAMPLES // BATCH
    torch.testing.assert_close(_f64(ranks[0]["resumed_losses"]),
                               _f64(reference["losses"][epoch:]), rtol=RTOL, atol=0)
    # the consolidated state dict (every chunk of every stage) loads into the plain module
    plain = make_model(3)
    plain.load_state_dict(ckpt.consolidate(path))
    after = reference_run(epoch, BATCH, ToyData(SAMPLES))["params"]
    for n, p in plain.named_parameters():
        torch.testing.assert_close(p.detach(), after[n], rtol=RTOL, atol=ATOL)


def test_pp2_vpp2_dp2_matches_single_process():
    """4 ranks, two replicas: the head tied to the embedding (virtual stages 0 and 3 share
    it), the model built on the meta device and ZeRO-1 optimizer state; then LSSP and grouped
    reordering (a sequence-parallel encoder, every sample over 3 rows split over a stage's
    data-parallel group), with validation and predict."""
    tied = {"tie": True, "lazy": True}
    runs = [{"schedule": "uniform_insertion", "zero_stage": 1, "model": tied},
            {"lssp": True, "reorder": True, "lssp_max_rows": 3, "ulysses_backend": "torch",
             "model": {"encoder": "token"}, "evaluate": True}]
    ranks = spawn(vpp_worker, 4, 2, 2, runs, None, timeout=240.0)
    _check_run(ranks, 0, reference_run(STEPS, BATCH, ToyData(SAMPLES), tie=True), 2, 2, tied)
    _check_run(ranks, 1, reference_run(STEPS, BATCH, ToyData(SAMPLES), encoder="token"), 2, 2,
               {"encoder": "token"})
    assert ranks[0][0]["grouped"] is None
    metrics = ranks[0][1]["grouped"]
    assert metrics["lssp/long_samples"] >= 1 and metrics["lssp/sp_degree_max"] == 2
