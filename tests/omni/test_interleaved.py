"""Interleaved (virtual-stage) pipelines: closed forms on tiny cases, validity, encoder placement
and the errors for layouts that cannot interleave."""

import itertools
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_omni.plan.costs import BYTES_BF16, H100_80G, CostModel, TransformerConfig
from lightning_omni.plan.interleaved import (
    build_interleaved,
    check_interleaving,
    interleave,
    interleaved_order,
    warmup_forwards,
)
from lightning_omni.plan.messages import check_schedule
from lightning_omni.plan.schedule import (
    BUILDERS,
    Kind,
    Payload,
    assign_encoder_samples,
    for_replicas,
    max_in_flight,
    one_f_one_b,
    one_f_one_b_order,
    with_completion_points,
)
from lightning_omni.plan.search import rank_peaks
from lightning_omni.plan.simulate import simulate, uniform_costs
from lightning_omni.plan.systems import (
    Grid,
    ParallelConfig,
    Scenario,
    StepData,
    StepPricer,
    candidate_configs,
    predict,
)
from lightning_omni.plan.workload import image_text_mixture

SHAPES = [(p, v, p * g) for p, v, g in itertools.product((2, 3, 4), (1, 2, 3), (1, 2, 3))]


def test_one_chunk_is_plain_1f1b():
    for p, n in ((1, 3), (2, 4), (4, 8), (3, 3)):
        for s in range(p):
            assert interleaved_order(p, n, s, 1) == [
                (op, m, 0) for op, m in one_f_one_b_order(p, n, s)]
    for name in BUILDERS:
        base = BUILDERS[name](4, 8)
        assert build_interleaved(name, 4, 8, 1) == base
        assert interleave(base, 1) is base


@pytest.mark.parametrize("p,v,n", SHAPES)
def test_step_and_bubble_match_the_closed_form(p, v, n):
    """Unit forward f and backward b per stage, split into v chunks of f/v and b/v, free
    messages: step = m (f + b) + (P - 1)(f + b) / v, so the bubble over the ideal is
    (P - 1) / (v m) (Narayanan et al. 2021, sec. 2.2.2)."""
    f, b = 1.0, 2.0
    sched = build_interleaved("1f1b", p, n, v)
    res = simulate(sched, uniform_costs(f / v, b / v))
    ideal = n * (f + b)
    assert res.step_seconds == pytest.approx(ideal + (p - 1) * (f + b) / v)
    assert (res.step_seconds - ideal) / ideal == pytest.approx((p - 1) / (v * n))
    assert res.busy_seconds == pytest.approx([ideal] * p)


@pytest.mark.parametrize("p,v,n", SHAPES)
def test_chunks_in_flight_follow_megatrons_warmup(p, v, n):
    """Rank r holds its warm-up forwards plus one: 2 (P - r - 1) + (v - 1) P + 1 chunks for
    v > 1 (capped by the m v chunks of the step). On the first rank, with m > P, that is
    P (1 + (P - 1) / (P v)) stages' worth of activations (Korthikanti et al. 2022, sec. 4.2.3)."""
    llm, _ = max_in_flight(build_interleaved("1f1b", p, n, v))
    expect = [min(n * v, (2 * (p - r - 1) + (v - 1) * p if v > 1 else p - r - 1) + 1)
              for r in range(p)]
    assert llm == expect
    assert [min(n * v, warmup_forwards(p, n, r, v) + 1) for r in range(p)] == expect
    if n > p and v > 1:
        assert llm[0] / v == pytest.approx(p * (1 + (p - 1) / (p * v)))


@pytest.mark.parametrize("p,v,n", SHAPES)
def test_every_builder_stays_valid_interleaved(p, v, n):
    for name in BUILDERS:
        sched = build_interleaved(name, p, n, v, grad_sync=True)
        check_schedule(sched)
        check_schedule(with_completion_points(sched))
        assert sched.num_chunks == v
        # every virtual stage runs each microbatch's forward and backward once, on its rank
        seen = Counter()
        for rank, prog in enumerate(sched.actions):
            for a in prog:
                if a.kind in (Kind.LLM_FWD, Kind.LLM_BWD):
                    assert sched.stage_ranks[a.stage % p] == rank
                    seen[a.kind, a.stage, a.microbatch] += 1
        assert set(seen.values()) == {1} and len(seen) == 2 * p * v * n
    if v > 1 and p == 2:
        both = for_replicas([build_interleaved("uniform_insertion", p, n, v)] * 2)
        check_schedule(with_completion_points(both))
        assert both.num_chunks == v


@pytest.mark.parametrize("p,v,n", [(2, 2, 4), (4, 2, 8), (4, 3, 4), (3, 2, 6)])
def test_v_times_the_pipeline_messages(p, v, n):
    """A microbatch crosses P v - 1 virtual-stage boundaries each way: v times the plain
    pipeline's P - 1, plus the v - 1 wrap-arounds from the last rank back to the first."""
    sched = build_interleaved("1f1b", p, n, v)
    sends = Counter(a.payload for prog in sched.actions for a in prog if a.kind == Kind.SEND)
    assert sends[Payload.ACTIVATION] == sends[Payload.GRADIENT] == n * (p * v - 1)
    wraps = [a for a in sched.actions[p - 1] if a.kind == Kind.SEND and a.peer == 0
             and a.payload == Payload.ACTIVATION]
    assert len(wraps) == n * (v - 1)


@pytest.mark.parametrize("name", ["encoder_first_stage", "encoder_disaggregated",
                                  "uniform_insertion"])
@pytest.mark.parametrize("p,v,n", [(2, 2, 4), (4, 2, 8), (4, 3, 8), (3, 2, 9)])
def test_encoder_work_keeps_its_placement(name, p, v, n):
    """The plain builder's encoder actions all survive; stage 0 has each microbatch's
    features before its first chunk's forward and returns feature gradients (or runs its
    encoder backward) only after that chunk's backward; a rank's encoder backward follows
    its own chunk-0 backward of that microbatch."""
    base = BUILDERS[name](p, n)
    sched = build_interleaved(name, p, n, v)
    for rank, (old, new) in enumerate(zip(base.actions, sched.actions, strict=True)):
        def other(prog):
            return Counter(a for a in prog if a.kind not in (Kind.LLM_FWD, Kind.LLM_BWD)
                           and a.payload not in (Payload.ACTIVATION, Payload.GRADIENT))
        assert other(old) == other(new), rank
    for rank in sched.stage_ranks:
        prog = sched.actions[rank]
        at = {(a.kind, a.microbatch, a.stage): i for i, a in enumerate(prog)}
        first = rank % p  # virtual stage of chunk 0 on this rank
        for i, a in enumerate(prog):
            if a.kind == Kind.ENC_BWD or (a.kind == Kind.RECV
                                          and a.payload == Payload.FEATURE_GRAD):
                assert i > at[Kind.LLM_BWD, a.microbatch, first], (rank, str(a))
            if rank == 0 and (a.kind == Kind.ENC_FWD and a.share == 1.0 or a.kind == Kind.RECV
                              and a.payload == Payload.FEATURES):
                assert i < at[Kind.LLM_FWD, a.microbatch, 0], str(a)
            if rank == 0 and a.kind == Kind.SEND and a.payload == Payload.FEATURE_GRAD:
                assert i > at[Kind.LLM_BWD, a.microbatch, 0], str(a)


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_sample_plans_interleave_without_deadlock(data):
    """Uniform insertion from per-sample encoder costs (microbatches without encoder input,
    ranks without samples), with or without stage 0 inline, as pricing and the runtime build
    it: the interleaved schedule still runs to completion with completion points."""
    p = data.draw(st.integers(2, 4))
    n = p * data.draw(st.integers(1, 3))
    v = data.draw(st.integers(2, 3))
    inline = data.draw(st.booleans())
    costs = [data.draw(st.lists(st.sampled_from([0.0, 1.0, 2.5, 7.0]), min_size=1, max_size=4))
             for _ in range(n)]
    samples, shares = assign_encoder_samples(costs, p, skip_stage0_drain=not inline)
    sched = build_interleaved("uniform_insertion", p, n, v, shares=shares, samples=samples,
                              inline_stage0=inline, sample_exchange=True, grad_sync=True)
    check_schedule(with_completion_points(sched))


def test_inline_stage0_interleaves():
    sched = build_interleaved("uniform_insertion", 4, 8, 2, inline_stage0=True,
                              sample_exchange=True)
    check_schedule(with_completion_points(sched))


def test_interleaving_shrinks_the_bubble_of_an_encoder_first_pipeline():
    """Property, not a conclusion about systems: with the same total work, more chunks cut
    the LLM warm-up and drain that the closed form counts."""
    times = [simulate(build_interleaved("encoder_first_stage", 4, 8, v),
                      uniform_costs(1.0 / v, 2.0 / v, 0.2, 0.4)).step_seconds for v in (1, 2)]
    assert times[1] < times[0]


def test_bad_layouts_are_named():
    with pytest.raises(ValueError, match="num_microbatches: expected a multiple of "
                                         "num_stages=4"):
        build_interleaved("1f1b", 4, 6, 2)
    with pytest.raises(ValueError, match="num_chunks: expected an int >= 1"):
        interleave(one_f_one_b(2, 4), 0)
    with pytest.raises(ValueError, match="num_chunks"):
        check_interleaving(2, 4, "2")
    with pytest.raises(ValueError, match="num_stages: expected >= 2"):
        build_interleaved("1f1b", 1, 4, 2)
    with pytest.raises(ValueError, match=r"layers: expected divisible by num_stages \* "
                                         "num_chunks = 8"):
        check_interleaving(4, 8, 2, layers=20)
    with pytest.raises(ValueError, match="name: expected one of"):
        build_interleaved("zero_bubble", 2, 4, 2)
    with pytest.raises(ValueError, match="before for_replicas"):
        interleave(for_replicas([one_f_one_b(2, 4)] * 2), 2)
    with pytest.raises(ValueError, match="without WAIT"):
        interleave(with_completion_points(one_f_one_b(2, 4)), 2)
    check_interleaving(4, 8, 2, layers=40)
    check_interleaving(1, 3, 1, layers=7)


# ---- pricing and search ----------------------------------------------------------------------

ENC = TransformerConfig("enc", layers=2, hidden=64, heads=4, ffn_hidden=256, causal=False)
LLM = TransformerConfig("llm", layers=4, hidden=128, heads=4, ffn_hidden=512, vocab=1000)
SYSTEM_CONFIGS = [("megatron", {}), ("omni", {}), ("disaggregated", {"encoder_gpus": 2})]


@pytest.fixture(scope="module")
def data():
    sc = Scenario("tiny", ENC, LLM, H100_80G, 8, 8, 512, image_text_mixture(0.5))
    return StepData(sc, CostModel(H100_80G))


@pytest.mark.parametrize("system,extra", SYSTEM_CONFIGS)
def test_priced_chunks_split_each_stages_work(data, system, extra):
    """A rank's chunks hold its layers: their seconds sum to the plain stage's (the output
    head on the last virtual stage, on the last rank in both)."""
    plain = StepPricer(data, system, ParallelConfig(1, 2, 2, encoder_tp=1, **extra)).build()
    pricer = StepPricer(data, system, ParallelConfig(1, 2, 2, encoder_tp=1, vpp=2, **extra))
    inter = pricer.build()
    assert pricer.chunk_layers == [1, 1, 1, 1] and pricer.layers == [2, 2]
    assert inter.schedule.num_chunks == 2 and len(inter.llm_fwd) == 4
    for rank in range(2):
        for table_v, table_1 in ((inter.llm_fwd, plain.llm_fwd), (inter.llm_bwd, plain.llm_bwd),
                                 (inter.llm_act, plain.llm_act)):
            np.testing.assert_allclose(table_v[rank] + table_v[rank + 2], table_1[rank])
    assert inter.static == plain.static
    check_schedule(inter.schedule)


@pytest.mark.parametrize("system,extra", SYSTEM_CONFIGS)
def test_every_chunk_message_is_priced_as_a_plain_pipelines(data, system, extra):
    cfg = ParallelConfig(1, 2, 2, encoder_tp=1, vpp=2, **extra)
    pricer = StepPricer(data, system, cfg)
    pr = pricer.build()
    _, tokens, _ = data.llm_moments(pricer.replica_kind, cfg.dp, 0)
    priced = 0
    for rank, prog in enumerate(pr.schedule.actions):
        for a in prog:
            if a.kind == Kind.SEND and a.payload in (Payload.ACTIVATION, Payload.GRADIENT):
                nbytes = float(tokens[a.microbatch]) * LLM.hidden * BYTES_BF16 / cfg.tp
                expect = data.cost.p2p_seconds(nbytes, pricer.inside_node(rank, a.peer))
                assert pr.costs.transfer_seconds(rank, a) == pytest.approx(expect), str(a)
                priced += 1
    assert priced == 2 * pricer.num_mb * (2 * 2 - 1)  # both directions, P v - 1 boundaries


@pytest.mark.parametrize("system,extra", SYSTEM_CONFIGS)
def test_memory_peaks_of_chunks_match_the_simulation(data, system, extra):
    """The closed-form peak (program order, per virtual stage) is what the simulator sees;
    the first rank holds more chunks in flight than a plain pipeline holds microbatches."""
    cfg = ParallelConfig(1, 2, 2, encoder_tp=1, vpp=2, **extra)
    pricer = StepPricer(data, system, cfg)
    pr = pricer.build()
    sim = simulate(pr.schedule, pr.costs)
    assert rank_peaks(pricer, pr) == pytest.approx(list(sim.peak_memory_bytes))
    llm, _ = max_in_flight(pr.schedule)
    assert llm[0] == 2 * (2 - 1) + (2 - 1) * 2 + 1


def test_layouts_that_cannot_interleave_are_named(data):
    sc = data.scenario
    with pytest.raises(ValueError, match="num_stages: expected >= 2"):
        predict("megatron", sc, ParallelConfig(1, 1, 4, vpp=2), data.cost, data)
    with pytest.raises(ValueError, match="layers: expected divisible by num_stages"):
        predict("omni", sc, ParallelConfig(1, 2, 2, vpp=3), data.cost, data)
    with pytest.raises(ValueError, match="num_microbatches: expected a multiple of "
                                         "num_stages=2"):
        predict("omni", sc, ParallelConfig(1, 2, 8, vpp=2), data.cost, data)
    with pytest.raises(ValueError, match="config.dp: expected a divisor of global_batch"):
        predict("omni", sc, ParallelConfig(1, 2, 3, vpp=2), data.cost, data)
    with pytest.raises(ValueError, match="stage0_layer_fraction: expected 1.0 with vpp=2"):
        predict("megatron", sc, ParallelConfig(1, 2, 2, vpp=2, stage0_layer_fraction=0.5),
                data.cost, data)
    with pytest.raises(ValueError, match="config.vpp: expected an int >= 1"):
        predict("megatron", sc, ParallelConfig(1, 2, 2, vpp=0), data.cost, data)


def test_grid_offers_vpp_to_every_system_where_the_layout_allows(data):
    sc = data.scenario
    for system in ("megatron", "disaggregated", "omni"):
        configs = candidate_configs(system, sc, grid=Grid(vpp=(1, 2)))
        inter = [c for c in configs if c.vpp == 2]
        assert inter, system
        for c in inter:
            assert c.pp > 1 and c.stage0_layer_fraction == 1.0
            assert LLM.layers % (c.pp * 2) == 0 and (8 // c.dp) % c.pp == 0 and 8 % c.dp == 0
            assert "VPP2" in str(c)
        plain = candidate_configs(system, sc, grid=Grid(vpp=(1,)))
        assert {replace(c, vpp=1) for c in inter} <= set(plain)
        assert all(c.vpp == 1 for c in plain)
    with pytest.raises(ValueError, match="grid.vpp"):
        candidate_configs("omni", sc, grid=Grid(vpp=(0,)))
