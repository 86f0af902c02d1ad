"""Grouped reordering's sample exchange on 2 gloo ranks: features and encoder gradients equal
the no-exchange computation (float64), and the load really moves."""

from __future__ import annotations

import pytest
import torch
from _omni_spawn import run_spmd

from lightning_omni.runtime.lssp_exec import encoder_many
from lightning_omni.runtime.sample_exchange import locality_groups
from lightning_omni.runtime.token_encoder import TokenEncoder

IN_DIM, OUT_DIM = 5, 6
# rank 0 loads the long samples, rank 1 the short ones; or rank 0 loads everything
SPLIT = [{0: 12, 1: 10, 2: 9}, {3: 2, 4: 3, 5: 2, 6: 1}]
ALL_ON_0 = [{**SPLIT[0], **SPLIT[1]}, {}]
CONFIGS = {"one group": ((0, 0), SPLIT), "one rank per group": ((0, 1), SPLIT),
           "empty shard": ((0, 0), ALL_ON_0)}


def _encoder() -> TokenEncoder:
    torch.manual_seed(0)
    return TokenEncoder(IN_DIM, dim=8, heads=2, layers=1, out_dim=OUT_DIM).double()


def _sample(sid: int, n: int):
    g = torch.Generator().manual_seed(7 + sid)
    return (torch.randn(n, IN_DIM, generator=g, dtype=torch.float64),
            torch.randn(n, OUT_DIM, generator=g, dtype=torch.float64))


def _worker(rank: int, world: int):
    return {name: _one(rank, groups, shards[rank]) for name, (groups, shards) in CONFIGS.items()}


def _one(rank: int, groups, loaded):
    from lightning_omni.runtime.sample_exchange import GroupedReorder, reorder_metrics

    enc = _encoder()
    ex = GroupedReorder(groups)
    gp = ex.plan(loaded)
    inputs = ex.exchange(gp, {s: _sample(s, n)[0] for s, n in loaded.items()}, (IN_DIM,),
                         torch.float64)
    mine = sorted(inputs)
    feats = dict(zip(mine, encoder_many(enc, [inputs[s] for s in mine]), strict=True))
    back, anchor = ex.return_features(gp, feats, (OUT_DIM,), torch.float64)
    loss = anchor.sum() * 0
    for s, f in back.items():
        loss = loss + (f * _sample(s, loaded[s])[1]).sum()
    loss.backward()
    return ({s: f.detach() for s, f in back.items()},
            {n: p.grad.clone() for n, p in enc.named_parameters()},
            float(loss.detach()), mine, reorder_metrics(gp), ex.bytes_sent)


def _reference():
    enc = _encoder()
    lengths = {s: n for shard in SPLIT for s, n in shard.items()}
    sids = sorted(lengths)
    outs = encoder_many(enc, [_sample(s, lengths[s])[0] for s in sids])
    loss = sum((f * _sample(s, lengths[s])[1]).sum() for s, f in zip(sids, outs, strict=True))
    loss.backward()
    return (dict(zip(sids, [o.detach() for o in outs], strict=True)),
            {n: p.grad for n, p in enc.named_parameters()}, float(loss.detach()))


@pytest.fixture(scope="module")
def results():
    return run_spmd(_worker, 2, timeout=240)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_exchange_matches_no_exchange(results, config):
    groups, shards = CONFIGS[config]
    results = [res[config] for res in results]
    ref_feats, ref_grads, ref_loss = _reference()
    for r, res in enumerate(results):
        assert sorted(res[0]) == sorted(shards[r])  # features came back to the loading rank
        for s, f in res[0].items():
            torch.testing.assert_close(f, ref_feats[s], rtol=1e-10, atol=1e-12)
    assert sum(res[2] for res in results) == pytest.approx(ref_loss, rel=1e-12)
    for name, g in ref_grads.items():
        torch.testing.assert_close(sum(res[1][name] for res in results), g, rtol=1e-10,
                                   atol=1e-12, msg=f"grad of {name}")
    metrics = results[0][4]
    if len(set(groups)) == 1:
        # the long samples were spread out: lower imbalance, bytes really moved
        assert metrics["reorder/imbalance_after"] < metrics["reorder/imbalance_before"]
        assert metrics["reorder/imbalance_after"] <= 1.1
        assert metrics["reorder/samples_moved"] > 0
        assert sum(res[5] for res in results) > 0
        assert results[1][3]  # rank 1 encodes something
        assert results[0][3] != sorted(shards[0])
    else:  # each rank alone in its group: nothing moves
        assert metrics["reorder/samples_moved"] == 0 and all(res[5] == 0 for res in results)


def test_locality_groups():
    assert locality_groups(8, 4) == (0, 0, 0, 0, 1, 1, 1, 1)
    assert locality_groups(3, 1) == (0, 1, 2)
    with pytest.raises(ValueError, match="ranks_per_group"):
        locality_groups(6, 4)
