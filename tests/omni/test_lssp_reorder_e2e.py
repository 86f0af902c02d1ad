"""End to end on 2 gloo ranks, data parallel: each rank loads its own shard of the recipe's
batch, the encoders run through LSSP (long samples Ulysses over both ranks) or through grouped
reordering, features come back to the loading rank, the LLM runs there. The loss and every
parameter's gradient (summed over ranks) equal the single-process ``training_step`` on the
global batch (float64)."""

from __future__ import annotations

import pytest
import torch
from _omni_spawn import run_spmd

from lightning_omni.examples.multimodal_data import CaptionDataset, collate
from lightning_omni.examples.multimodal_model import MultimodalCaptioner, caption_loss
from lightning_omni.runtime.lssp_exec import EncoderCost

BATCH, SEED = 8, 5
COST = EncoderCost(seconds_per_token=1.0, seconds_per_token_pair=0.05, bytes_per_token=1.0)
MEMORY_CAP = 40.0  # any sample over 40 encoder rows is long: it must run sequence parallel


def _model() -> MultimodalCaptioner:
    torch.manual_seed(0)
    return MultimodalCaptioner(hidden=16, layers=2, heads=2, encoder_dim=16, encoder_heads=4,
                               encoder_layers=1).double()


def _global_batch() -> dict[str, torch.Tensor]:
    data = CaptionDataset(BATCH, seed=SEED, mix=(1, 0, 1))
    batch = collate([data[i] for i in range(BATCH)])
    return {k: (v.double() if v.is_floating_point() else v) for k, v in batch.items()}


def _shard(batch, rank: int, world: int):
    per = BATCH // world
    return {k: v[rank * per:(rank + 1) * per] for k, v in batch.items()}, rank * per


def _features(model, mode: str, shard, first: int, rank: int, world: int):
    """Per modality: this rank's samples' feature rows (sample by sample), plan facts."""
    import torch.distributed as dist

    from lightning_omni.runtime.lssp_exec import (
        build_exec_plan,
        plan_encoder_lssp,
        run_lssp_microbatch,
    )
    from lightning_omni.runtime.sample_exchange import GroupedReorder

    out, anchors, facts = {}, [], {}
    for name, encoder, _ in model.modalities():
        lengths = shard[f"{name}_len"]
        mine = {first + i: int(n) for i, n in enumerate(lengths.tolist()) if n > 0}
        rows = {first + i: shard[name][i, :n] for i, n in enumerate(lengths.tolist()) if n > 0}
        if mode == "lssp":
            everyone: list = [None] * world
            dist.all_gather_object(everyone, mine)
            all_lengths = {s: n for part in everyone for s, n in part.items()}
            owner = {s: r for r, part in enumerate(everyone) for s in part}
            plan = plan_encoder_lssp([all_lengths], COST, world, encoder.heads, MEMORY_CAP)
            ex = build_exec_plan(plan.microbatches[0], all_lengths, owner)
            res = run_lssp_microbatch(encoder, ex, rows, list(range(world)))
            feats, anchor = res.features, res.anchor
            facts[name] = [len(g.ranks) for g in plan.microbatches[0].sp_groups]
        else:
            ex = GroupedReorder([0] * world, cost=lambda n: COST.item(0, n).seconds)
            gp = ex.plan(mine)
            to_encode = ex.exchange(gp, rows, (shard[name].shape[2],), torch.float64)
            from lightning_omni.runtime.lssp_exec import encoder_many

            sids = sorted(to_encode)
            enc = dict(zip(sids, encoder_many(encoder, [to_encode[s] for s in sids]),
                           strict=True))
            feats, anchor = ex.return_features(gp, enc, (model.hparams.hidden,), torch.float64)
            facts[name] = gp.plan.imbalance_before, gp.plan.imbalance_after
        order = sorted(mine)
        out[name] = (torch.cat([feats[s] for s in order]) if order
                     else torch.zeros(0, model.hparams.hidden, dtype=torch.float64))
        anchors.append(anchor)
    return out, anchors, facts


def _worker(rank: int, world: int):
    import torch.distributed as dist

    from lightning_omni.examples.multimodal_model import _scatter

    results = {}
    for mode in ("lssp", "reorder"):
        model = _model()
        shard, first = _shard(_global_batch(), rank, world)
        feats, anchors, facts = _features(model, mode, shard, first, rank, world)
        tokens = shard["tokens"]
        h = model.embed(tokens)
        for name, _, token_id in model.modalities():
            h = _scatter(h, tokens, token_id, feats[name])
        for block in model.blocks:
            h = block(h)
        total, count = caption_loss(model.head(h), shard)
        global_count = count.double().clone()
        dist.all_reduce(global_count)
        loss = total / global_count + sum(a.sum() * 0 for a in anchors)
        loss.backward()
        grads = {n: p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                 for n, p in model.named_parameters()}
        results[mode] = (float(loss.detach()), grads, facts)
    return results


@pytest.fixture(scope="module")
def results():
    return run_spmd(_worker, 2, timeout=300)


@pytest.mark.parametrize("mode", ["lssp", "reorder"])
def test_equals_single_process(results, mode):
    model = _model()
    batch = _global_batch()
    logits = model(batch)  # what training_step computes, without its logging
    total, count = caption_loss(logits, batch)
    loss = total / count
    loss.backward()
    assert sum(r[mode][0] for r in results) == pytest.approx(float(loss.detach()), rel=1e-10)
    for n, p in model.named_parameters():
        got = sum(r[mode][1][n] for r in results)
        torch.testing.assert_close(got, p.grad, rtol=1e-7, atol=1e-10, msg=f"grad of {n}")


def test_the_runs_used_sp_and_moved_load(results):
    facts = results[0]["lssp"][2]
    assert any(d == 2 for degrees in facts.values() for d in degrees)  # Ulysses really ran
    before, after = results[0]["reorder"][2]["audio"]
    assert after < before
