"""LSSP execution on 2 gloo ranks: features and encoder gradients equal a single-process run of
the same samples (float64), with long samples sequence parallel and short ones data parallel."""

from __future__ import annotations

import pytest
import torch
from _omni_spawn import run_spmd

from lightning_omni.plan.schedule import Kind, Payload
from lightning_omni.runtime.lssp_exec import (
    EncoderCost,
    build_exec_plan,
    encoder_many,
    lssp_actions,
    lssp_metrics,
    plan_encoder_lssp,
)
from lightning_omni.runtime.token_encoder import TokenEncoder

IN_DIM, OUT_DIM = 6, 8
# microbatch 0: one long sample by cost (21 tokens, odd: padded); microbatch 1: two long by
# memory (16 and 15 tokens over the cap of 140 bytes)
MICROBATCHES = [{0: 3, 1: 21, 2: 5, 3: 4}, {4: 16, 5: 2, 6: 15, 7: 3, 8: 1}]
OWNER = {0: 1, 1: 0, 2: 0, 3: 1, 4: 1, 5: 0, 6: 1, 7: 1, 8: 1}
CONFIGS = [(False, "auto"), (True, "torch")]  # auto: DeepSpeed's Ulysses when installed
COST = EncoderCost(seconds_per_token=1.0, seconds_per_token_pair=0.2, bytes_per_token=10.0)


def _encoder(causal: bool) -> TokenEncoder:
    torch.manual_seed(0)
    return TokenEncoder(IN_DIM, dim=16, heads=4, layers=2, out_dim=OUT_DIM,
                        causal=causal).double()


def _sample(sid: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + sid)
    return (torch.randn(n, IN_DIM, generator=g, dtype=torch.float64),
            torch.randn(n, OUT_DIM, generator=g, dtype=torch.float64))


def _plan():
    return plan_encoder_lssp(MICROBATCHES, COST, group_size=2, heads=4, memory_cap=140)


def _worker(rank: int, world: int):
    return {cfg: _run(rank, world, *cfg) for cfg in CONFIGS}


def _run(rank: int, world: int, causal: bool, backend: str):
    from lightning_omni.runtime.lssp_exec import run_lssp_microbatch

    enc = _encoder(causal)
    plan = _plan()
    feats, loss, sent, degrees = {}, 0.0, 0, []
    for m, lengths in enumerate(MICROBATCHES):
        ex = build_exec_plan(plan.microbatches[m], lengths, OWNER)
        inputs = {s: _sample(s, n)[0] for s, n in lengths.items() if OWNER[s] == rank}
        res = run_lssp_microbatch(enc, ex, inputs, list(range(world)), backend=backend)
        part = res.anchor.sum() * 0
        for s, f in res.features.items():
            part = part + (f * _sample(s, lengths[s])[1]).sum()
            feats[s] = f.detach()
        part.backward()
        loss += float(part.detach())
        sent += res.bytes_sent
        degrees += res.sp_degrees
    grads = {n: p.grad.clone() for n, p in enc.named_parameters()}
    return feats, grads, loss, sent, degrees


def _reference(causal: bool):
    enc = _encoder(causal)
    feats, loss = {}, 0.0
    for lengths in MICROBATCHES:
        sids = sorted(lengths)
        outs = encoder_many(enc, [_sample(s, lengths[s])[0] for s in sids])
        part = sum((f * _sample(s, lengths[s])[1]).sum() for s, f in zip(sids, outs, strict=True))
        part.backward()
        loss += float(part.detach())
        feats.update((s, f.detach()) for s, f in zip(sids, outs, strict=True))
    return feats, {n: p.grad for n, p in enc.named_parameters()}, loss


def test_plan_has_long_and_short_samples():
    plan = _plan()
    longs = [g.sample_id for mb in plan.microbatches for g in mb.sp_groups]
    assert longs == [1, 4, 6]
    assert plan.microbatches[0].phase_order == ("sp", "dp")
    assert plan.microbatches[1].phase_order == ("dp", "sp")
    m = lssp_metrics(plan)
    assert m["lssp/long_samples"] == 3 and m["lssp/sp_degree_max"] == 2


@pytest.fixture(scope="module")
def spmd_results():
    return run_spmd(_worker, 2, timeout=240)


@pytest.mark.parametrize("causal,backend", CONFIGS)
def test_lssp_matches_single_process(spmd_results, causal, backend):
    results = [res[(causal, backend)] for res in spmd_results]
    ref_feats, ref_grads, ref_loss = _reference(causal)
    owned = {s: r for r, res in enumerate(results) for s in res[0]}
    assert owned == OWNER  # every sample's features came back to its owner, only there
    for s, r in owned.items():
        torch.testing.assert_close(results[r][0][s], ref_feats[s], rtol=1e-9, atol=1e-12)
    assert sum(res[2] for res in results) == pytest.approx(ref_loss, rel=1e-10)
    for name, g in ref_grads.items():
        got = sum(res[1][name] for res in results)
        torch.testing.assert_close(got, g, rtol=1e-9, atol=1e-12, msg=f"grad of {name}")
    # the SP work really ran on both ranks, and data moved between them
    assert results[0][4] == results[1][4] == [2, 2, 2]
    assert all(res[3] > 0 for res in results)


def test_sample_too_long_for_memory_names_sample_and_limit():
    with pytest.raises(ValueError, match=r"sample 1 \(microbatch 0, 21 tokens\).*memory_cap=50"):
        plan_encoder_lssp(MICROBATCHES, COST, group_size=2, heads=4, memory_cap=50)
    # heads allow no split: the cap applies to the whole sample
    with pytest.raises(ValueError, match="largest SP degree 1"):
        plan_encoder_lssp(MICROBATCHES, COST, group_size=2, heads=3, memory_cap=150)


def test_exec_plan_pieces_cover_every_row_once():
    plan = _plan()
    for m, lengths in enumerate(MICROBATCHES):
        ex = build_exec_plan(plan.microbatches[m], lengths, OWNER)
        for sid, n in lengths.items():
            out = sorted((p.start, p.rows) for p in ex.outputs if p.sample_id == sid)
            covered = [r for start, rows in out for r in range(start, start + rows)]
            assert covered == list(range(n))
            assert all(p.dst == OWNER[sid] for p in ex.outputs if p.sample_id == sid)
            assert all(p.src == OWNER[sid] for p in ex.inputs if p.sample_id == sid)
        with pytest.raises(ValueError, match="owner"):
            build_exec_plan(plan.microbatches[m], lengths, {**OWNER, min(lengths): 5})


def test_lssp_actions_in_the_ir():
    plan = _plan()
    ex = build_exec_plan(plan.microbatches[1], MICROBATCHES[1], OWNER)
    progs = [lssp_actions(ex, r, (4, 5), 1, in_row_bytes=48, out_row_bytes=64,
                          hidden_bytes=128, layers=2) for r in range(2)]
    for r, prog in enumerate(progs):
        assert prog[0].kind == Kind.ALLTOALL and prog[0].payload == Payload.SAMPLES
        assert prog[0].group == (4, 5) and prog[0].counts[r] == 0
        assert prog[-1].payload == Payload.FEATURES
        sp = [a for a in prog if a.payload == Payload.SP_ATTENTION]
        assert [a.samples for a in sp] == [(4,), (6,)] and all(a.group == (4, 5) for a in sp)
        # DP phase first in odd microbatches
        assert prog[1].kind == Kind.ENC_FWD
        assert prog[1].samples == tuple(sorted(plan.microbatches[1].dp_samples[r]))
    # bytes sent by rank 0 to rank 1 = rows rank 0 owns and rank 1 encodes, times row bytes
    rows = sum(p.rows for p in ex.inputs if p.src == 0 and p.dst == 1)
    assert progs[0][0].counts[1] == rows * 48


def test_simulated_lssp_program_matches_the_plan():
    """Priced by the simulator with the planner's own costs and free communication, the IR
    program of each microbatch runs each rank's encoder work until exactly when plan_lssp
    says, and the step ends at the plan's makespan."""
    from lightning_omni.plan.schedule import Schedule
    from lightning_omni.plan.simulate import StepCosts, simulate

    plan = _plan()
    for m, lengths in enumerate(MICROBATCHES):
        split = plan.microbatches[m]
        ex = build_exec_plan(split, lengths, OWNER)
        progs = tuple(tuple(lssp_actions(ex, r, (0, 1), m, 48, 64, 128, 2, cost=COST))
                      for r in range(2))
        total = sum(COST.item(s, n).seconds for s, n in lengths.items())
        sched = Schedule("lssp", 1, 1, (), (0, 1), progs, (0, 0), (1, 1))
        costs = StepCosts(
            compute_seconds=lambda r, a, total=total: a.share * total,
            transfer_seconds=lambda r, a: 0.0, collective_seconds=lambda r, a: 0.0,
            memory_delta_bytes=lambda r, a: 0.0, static_memory_bytes=lambda r: 0.0,
            memory_cap_bytes=float("inf"))
        sim = simulate(sched, costs)
        # the feature all-to-all at the end makes every rank wait for the slowest
        assert sim.step_seconds == pytest.approx(split.makespan, rel=1e-12)
        assert sim.rank_end_seconds == pytest.approx((split.makespan,) * 2, rel=1e-12)
        before_return = Schedule("lssp", 1, 1, (), (0, 1), tuple(p[:-1] for p in progs),
                                 (0, 0), (1, 1))
        sim = simulate(before_return, costs)
        assert sim.rank_end_seconds == pytest.approx(split.rank_finish_seconds, rel=1e-12)


def test_encoder_many_buckets_equal_one_by_one():
    enc = _encoder(False)
    xs = [_sample(s, n)[0] for s, n in enumerate((3, 40, 5, 38, 1, 21))]
    got = encoder_many(enc, xs)
    for x, g in zip(xs, got, strict=True):
        torch.testing.assert_close(g, enc(x[None])[0], rtol=1e-10, atol=1e-12)
