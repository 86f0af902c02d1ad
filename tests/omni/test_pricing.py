"""Closed-form checks of how a step is priced, on tiny configurations: every DP replica, the
gradient all-reduce, feature transfers, Ulysses all-to-alls, placement and static memory."""

import numpy as np
import pytest

from lightning_omni.plan.costs import BYTES_BF16, H100_80G, CostModel, TransformerConfig
from lightning_omni.plan.lssp import WorkItem
from lightning_omni.plan.schedule import Action, Kind, Payload
from lightning_omni.plan.simulate import simulate
from lightning_omni.plan.systems import ParallelConfig, Scenario, StepData, StepPricer, predict
from lightning_omni.plan.workload import image_text_mixture

ENC = TransformerConfig("enc", layers=2, hidden=64, heads=4, ffn_hidden=256, causal=False)
LLM = TransformerConfig("llm", layers=4, hidden=128, heads=4, ffn_hidden=512, vocab=1000)


def _data(gpus=8, batch=8, seq=512, ratio=0.5, seed=0, **kw):
    sc = Scenario("tiny", ENC, LLM, H100_80G, gpus, batch, seq, image_text_mixture(ratio),
                  seed=seed, **kw)
    return StepData(sc, CostModel(H100_80G))


@pytest.fixture(scope="module")
def data():
    return _data()


@pytest.mark.parametrize("system, cfg", [
    ("megatron", ParallelConfig(1, 2, 4, encoder_tp=1)),
    ("omni", ParallelConfig(1, 2, 4, encoder_tp=1)),
    ("disaggregated", ParallelConfig(1, 1, 4, encoder_gpus=2, encoder_tp=1)),
])
def test_step_is_the_slowest_replica_and_memory_the_fullest(data, system, cfg):
    per = []
    for r in range(cfg.dp):
        pr = StepPricer(data, system, cfg, r).build()
        per.append(simulate(pr.schedule, pr.costs))
    times = [s.step_seconds for s in per]
    assert max(times) > min(times) * 1.01  # the replicas really differ
    pred = predict(system, data.scenario, cfg, data.cost, data, simulate_replicas=None)
    assert pred.step_seconds == pytest.approx(max(times))
    assert pred.slowest_replica == int(np.argmax(times))
    for rank in range(len(pred.stage_peak_memory_gb)):
        assert pred.stage_peak_memory_gb[rank] == pytest.approx(
            max(s.peak_memory_bytes[rank] for s in per) / 1e9)


def test_pp1_step_is_compute_plus_the_dp_gradient_allreduce(data):
    cfg = ParallelConfig(1, 1, 4, encoder_tp=1)
    pricer = StepPricer(data, "megatron", cfg, 0)
    pr = pricer.build()
    compute = sum(pr.costs.compute_seconds(0, a) for a in pr.schedule.actions[0]
                  if a.kind in (Kind.LLM_FWD, Kind.LLM_BWD, Kind.ENC_FWD, Kind.ENC_BWD))
    grad_bytes = (LLM.total_params + ENC.total_params) * BYTES_BF16
    hw, g = H100_80G, 4
    # DP group of 4 single-GPU replicas: GPUs 0-3, one node
    allreduce = 2 * (g - 1) / g * grad_bytes / hw.nvlink_bytes_per_s + 2 * (g - 1) * \
        hw.nvlink_latency_s
    assert simulate(pr.schedule, pr.costs).step_seconds == pytest.approx(compute + allreduce)


def test_omni_syncs_llm_over_dp_and_encoder_over_every_replica(data):
    cfg = ParallelConfig(2, 2, 2, encoder_tp=1)
    pr = StepPricer(data, "omni", cfg, 0).build()
    cost, hw = data.cost, H100_80G
    llm_stage0 = (LLM.layers // 2 * LLM.params_per_layer + LLM.embedding_params / 2) \
        * BYTES_BF16 / 2
    enc_bytes = ENC.total_params * BYTES_BF16
    expected = cost.allreduce_seconds(llm_stage0, 2, True) + cost.allreduce_seconds(
        enc_bytes, 2 * 2 * 2, True)
    exchange = cost.exchange_seconds(data.exchange_bytes[2], 2, inside_node=False)
    grad = Action(Kind.ALLREDUCE, payload=Payload.WEIGHT_GRADS)
    assert pr.costs.collective_seconds(0, grad) == pytest.approx(expected)
    samples = Action(Kind.ALLTOALL, payload=Payload.SAMPLES)
    assert exchange > 0
    assert pr.costs.collective_seconds(0, samples) == pytest.approx(exchange)
    assert hw.gpus_per_node == 8


def test_feature_transfers_are_priced(data):
    cfg = ParallelConfig(1, 1, 4, encoder_gpus=4, encoder_tp=1)
    r, m = next((r, m) for r, rep in enumerate(data.loader_replicas(4))
                for m, mb in enumerate(rep) if data.enc_llm_tokens[mb].sum() > 0)
    pricer = StepPricer(data, "disaggregated", cfg, r)
    pr = pricer.build()
    tokens = data.enc_llm_tokens[pricer.mbs[m]].sum()
    send = Action(Kind.SEND, m, -1, 0, Payload.FEATURES)
    # the pool sits on GPUs 4-7 of the same node as the LLM's GPUs 0-3
    assert pr.costs.transfer_seconds(1, send) == pytest.approx(
        data.cost.p2p_seconds(tokens * LLM.hidden * BYTES_BF16, inside_node=True))
    assert pr.costs.transfer_seconds(1, send) > H100_80G.nvlink_latency_s
    # Omni: stage 1's share of a microbatch's features goes to stage 0
    feats = []
    for r in range(2):
        omni = StepPricer(data, "omni", ParallelConfig(1, 2, 2, encoder_tp=1), r)
        opr = omni.build()
        feats = [a for a in opr.schedule.actions[1] if a.kind == Kind.SEND
                 and a.payload == Payload.FEATURES]
        if feats:
            break
    assert feats
    for a in feats:
        assert a.samples
        assigned = [omni.mbs[a.microbatch][i] for i in a.samples]
        expected = data.cost.p2p_seconds(
            data.enc_llm_tokens[assigned].sum() * LLM.hidden * BYTES_BF16, inside_node=True)
        assert opr.costs.transfer_seconds(1, a) == pytest.approx(expected)


def test_omni_prices_the_runtimes_encoder_plan(data):
    """Pricing places Omni's encoder work with the runtime's own call
    (``runtime.engine.build_plan``): the same samples on the same ranks in the same order."""
    from lightning_omni.runtime.engine import build_plan

    cfg = ParallelConfig(1, 2, 2, encoder_tp=1)
    pricers = [StepPricer(data, "omni", cfg, r) for r in range(cfg.dp)]
    costs = tuple(tuple(tuple(float(data.enc_unit[i]) for i in mb) for mb in p.mbs)
                  for p in pricers)
    plan = build_plan("uniform_insertion", cfg.pp, costs)
    per = plan.num_ranks // plan.num_replicas

    def encoder_work(prog):
        return [(str(a.kind), a.microbatch, a.samples) for a in prog
                if a.kind in (Kind.ENC_FWD, Kind.ENC_BWD)]

    for d, pricer in enumerate(pricers):
        priced = pricer.build().schedule
        for rank in range(cfg.pp):
            assert encoder_work(priced.actions[rank]) == encoder_work(
                plan.actions[d * per + rank])


def test_ulysses_alltoall_is_priced():
    d = _data()
    pricer = StepPricer(d, "omni", ParallelConfig(4, 1, 2, encoder_tp=1), 0)
    lens = np.array([1000.0, 3000.0])
    expected = ENC.layers * 4 * lens * ENC.hidden * BYTES_BF16 / H100_80G.nvlink_bytes_per_s
    assert pricer.ulysses_alltoall_seconds(lens, 1) == pytest.approx(expected)
    item = WorkItem(0, seconds=8.0, memory_bytes=1.0, alltoall_seconds=2.0)
    assert item.sp_seconds(4) == pytest.approx(8.0 / 4 + 2.0 * 3 / 16)
    idx = [i for mb in pricer.mbs for i in mb if d.enc_tokens[i] > 0][:3]
    items, _ = pricer.enc_items(idx, 1, 1000.0)
    assert [it.alltoall_seconds for it in items] == pytest.approx(
        list(pricer.ulysses_alltoall_seconds(d.enc_tokens[idx], 1)))


def test_megatron_rank_order_puts_stages_in_other_nodes():
    d = _data(gpus=32)
    # TP2 DP4: a stage's 8 GPUs fill a node, so the next stage is in the next node
    pricer = StepPricer(d, "megatron", ParallelConfig(2, 4, 4, encoder_tp=2), 0)
    assert [pricer.stage_gpu(s) for s in range(4)] == [0, 8, 16, 24]
    assert not pricer.inside_node(0, 1)
    pr = pricer.build()
    send = next(a for a in pr.schedule.actions[0] if a.kind == Kind.SEND)
    tokens = d.llm_moments("loader", 4, 0)[1][send.microbatch]
    nbytes = tokens * LLM.hidden * BYTES_BF16 / 2
    hw = H100_80G
    assert pr.costs.transfer_seconds(0, send) == pytest.approx(
        hw.ib_latency_s + nbytes / hw.ib_bytes_per_s)
    # TP1 DP2: four stages of a replica fit in one node
    small = StepPricer(d, "megatron", ParallelConfig(1, 4, 2, encoder_tp=1), 1)
    assert [small.stage_gpu(s) for s in range(4)] == [1, 3, 5, 7]
    assert small.inside_node(0, 3)


def test_pool_gradient_allreduce_crosses_nodes_by_the_pools_own_size():
    d = _data(gpus=32)
    # LLM on 16 GPUs (2 nodes), pool of 8 GPUs at GPUs 16-23: one node, 8 lanes
    cfg = ParallelConfig(1, 1, 16, encoder_gpus=8, encoder_tp=1)
    pr = StepPricer(d, "disaggregated", cfg, 0).build()
    grad = Action(Kind.ALLREDUCE, payload=Payload.WEIGHT_GRADS)
    assert pr.costs.collective_seconds(1, grad) == pytest.approx(
        d.cost.allreduce_seconds(ENC.total_params * BYTES_BF16, 8, inside_node=True))
    # 16 single-GPU LLM replicas span two nodes
    llm_bytes = LLM.total_params * BYTES_BF16
    assert pr.costs.collective_seconds(0, grad) == pytest.approx(
        d.cost.allreduce_seconds(llm_bytes, 16, inside_node=False))


def test_untied_head_and_embedding_are_both_counted_at_pp1(data):
    one = StepPricer(data, "megatron", ParallelConfig(1, 1, 4, encoder_tp=1), 0)
    two = StepPricer(data, "megatron", ParallelConfig(1, 2, 4, encoder_tp=1), 0)
    cost = data.cost
    emb = cost.param_bytes(LLM.vocab * LLM.hidden, 1, 4)
    assert one.llm_static_bytes(0) - cost.runtime_overhead_bytes == pytest.approx(
        cost.param_bytes(LLM.total_params, 1, 4))
    assert two.llm_static_bytes(0) + two.llm_static_bytes(1) - 2 * \
        cost.runtime_overhead_bytes == pytest.approx(cost.param_bytes(LLM.total_params, 1, 4))
    assert two.llm_static_bytes(1) - cost.runtime_overhead_bytes == pytest.approx(
        cost.param_bytes(2 * LLM.params_per_layer, 1, 4) + emb)


def test_recompute_working_set_is_counted_once_not_per_microbatch(data):
    cfg = ParallelConfig(1, 1, 2, recompute=True, encoder_tp=1)
    pricer = StepPricer(data, "megatron", cfg, 0)
    _, tokens, _ = data.llm_moments("loader", 2, 0)
    assert len(tokens) >= 2
    plain = StepPricer(data, "megatron", ParallelConfig(1, 1, 2, encoder_tp=1), 0)
    assert pricer.llm_static_bytes(0) - plain.llm_static_bytes(0) == pytest.approx(
        data.cost.recompute_working_bytes(LLM, tokens.max(), 1))
    act = pricer.llm_activation_all(0)
    # each layer's bf16 input, plus the last stage's fp32 logits
    assert act == pytest.approx(tokens * LLM.layers * 2 * LLM.hidden + tokens * LLM.vocab * 4)


def test_megatron_separate_encoder_stage_has_its_own_tp():
    d = _data(gpus=16)
    cfg = ParallelConfig(4, 2, 3, encoder_tp=1, stage0_layer_fraction=0.0)
    pricer = StepPricer(d, "megatron", cfg, 0)
    assert pricer.separate_encoder_stage()
    assert pricer.stage_width(0) == 1 and pricer.llm_gpus() == 3 * (1 + 4)
    pr = pricer.build()
    m = next(i for i, mb in enumerate(pricer.mbs) if d.enc_tokens[mb].sum() > 0)
    lens = d.enc_tokens[pricer.mbs[m]]
    assert pr.enc_fwd[0, m] == pytest.approx(
        d.cost.stack_seconds(ENC, lens[lens > 0], ENC.layers, 1))
    pred = predict("megatron", d.scenario, cfg, d.cost, d)
    assert pred.step_seconds > 0
