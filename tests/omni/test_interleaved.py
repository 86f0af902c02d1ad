"""Interleaved (virtual-stage) pipelines: closed forms on tiny cases, validity, encoder placement
and the errors for layouts that cannot interleave."""

import itertools
from collections import Counter

import pytest

from lightning_omni.plan.interleaved import (
    build_interleaved,
    check_interleaving,
    interleave,
    interleaved_order,
    warmup_forwards,
)
from lightning_omni.plan.schedule import (
    BUILDERS,
    Kind,
    Payload,
    check_schedule,
    for_replicas,
    max_in_flight,
    one_f_one_b,
    one_f_one_b_order,
    with_completion_points,
)
from lightning_omni.plan.simulate import simulate, uniform_costs

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
