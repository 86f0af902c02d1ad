from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightning_omni.plan.messages import check_schedule
from lightning_omni.plan.schedule import (
    BUILDERS,
    Action,
    Kind,
    Payload,
    Schedule,
    ScheduleError,
    encoder_disaggregated,
    encoder_first_stage,
    max_in_flight,
    one_f_one_b,
    uniform_insertion,
)
from lightning_omni.plan.simulate import simulate, uniform_costs

stages = st.integers(1, 8)
microbatches = st.integers(1, 20)


@st.composite
def random_shares(draw):
    p = draw(stages)
    n = draw(microbatches)
    rows = []
    for _ in range(n):
        w = draw(st.lists(st.integers(0, 5), min_size=p, max_size=p))
        if sum(w) == 0:
            w[draw(st.integers(0, p - 1))] = 1
        rows.append([x / sum(w) for x in w])
    return p, n, rows


def _all_builders(p, n):
    return [one_f_one_b(p, n), encoder_first_stage(p, n), encoder_disaggregated(p, n),
            uniform_insertion(p, n),
            encoder_disaggregated(p, n, prefetch=max(1, p - 1), grad_sync=True)]


def _assert_valid(s: Schedule) -> None:
    check_schedule(s)
    llm, enc = max_in_flight(s)
    assert all(a <= b for a, b in zip(llm, s.llm_in_flight_bound, strict=True))
    assert all(a <= b for a, b in zip(enc, s.encoder_in_flight_bound, strict=True))
    # every LLM stage runs forward and backward of every microbatch exactly once
    counts = Counter((a.kind, a.stage, a.microbatch) for prog in s.actions for a in prog
                     if a.kind in (Kind.LLM_FWD, Kind.LLM_BWD))
    assert set(counts.values()) == {1}
    assert len(counts) == 2 * s.num_stages * s.num_microbatches
    # an LLM stage lives on one rank only
    for stage, rank in enumerate(s.stage_ranks):
        assert all(a.stage == stage for a in s.actions[rank] if a.kind == Kind.LLM_FWD)
    # encoder work of each microbatch is done exactly once in total (shares sum to one), and
    # every forward share has its backward on the same rank
    if s.encoder_ranks:
        for kind in (Kind.ENC_FWD, Kind.ENC_BWD):
            total = Counter()
            for prog in s.actions:
                for a in prog:
                    if a.kind == kind:
                        total[a.microbatch] += a.share
            assert sorted(total) == list(range(s.num_microbatches))
            assert all(v == pytest.approx(1.0) for v in total.values())
        for prog in s.actions:
            f = sorted((a.microbatch, a.share) for a in prog if a.kind == Kind.ENC_FWD)
            b = sorted((a.microbatch, a.share) for a in prog if a.kind == Kind.ENC_BWD)
            assert f == b


@given(stages, microbatches)
def test_every_builder_emits_a_valid_schedule(p, n):
    for s in _all_builders(p, n):
        _assert_valid(s)


@given(random_shares())
def test_uniform_insertion_with_uneven_shares_is_valid(case):
    p, n, rows = case
    _assert_valid(uniform_insertion(p, n, rows))


@given(stages, microbatches, st.floats(0.1, 3.0), st.floats(0.0, 4.0), st.floats(0.0, 0.5))
def test_encoder_timing_dependencies_hold_in_simulation(p, n, f, e, link):
    """Stage 0's forward of m starts after every encoder forward of m ends; every encoder
    backward of m starts after stage 0's backward of m ends."""
    costs = uniform_costs(f, 2 * f, e, 2 * e, transfer=link)
    for s in (encoder_first_stage(p, n), encoder_disaggregated(p, n), uniform_insertion(p, n)):
        sim = simulate(s, costs, record_timeline=True)
        spans = [(rank, iv) for rank, tl in enumerate(sim.timeline) for iv in tl]
        stage0 = s.stage_ranks[0]
        f0 = {iv.microbatch: iv for r, iv in spans if r == stage0 and iv.kind == Kind.LLM_FWD}
        b0 = {iv.microbatch: iv for r, iv in spans if r == stage0 and iv.kind == Kind.LLM_BWD}
        for _, iv in spans:
            if iv.kind == Kind.ENC_FWD:
                assert iv.end <= f0[iv.microbatch].start + 1e-9
            if iv.kind == Kind.ENC_BWD:
                assert iv.start >= b0[iv.microbatch].end - 1e-9


@given(stages, st.integers(1, 30), st.floats(0.1, 2.0), st.floats(0.1, 2.0))
def test_one_f_one_b_matches_the_closed_form(p, n, f, b):
    sim = simulate(one_f_one_b(p, n), uniform_costs(f, b))
    assert sim.step_seconds == pytest.approx((n + p - 1) * (f + b))


@given(st.integers(2, 8), st.integers(8, 32), st.floats(0.5, 4.0))
def test_uniform_insertion_spreads_the_encoder_bottleneck(p, n, enc_ratio):
    f, e = 1.0, enc_ratio
    costs = uniform_costs(f, 2 * f, e, 2 * e)
    first = simulate(encoder_first_stage(p, n), costs).step_seconds
    uniform = simulate(uniform_insertion(p, n), costs).step_seconds
    assert uniform < first
    # each stage costs about (f + b) + (e_f + e_b) / P per microbatch, plus fill and drain
    per_mb = 3 * f + 3 * e / p
    assert uniform <= (n + 2 * p) * per_mb + 3 * e


def test_check_schedule_catches_missing_crossed_and_deadlocked_messages():
    good = one_f_one_b(2, 2)
    first_send = next(i for i, a in enumerate(good.actions[0]) if a.kind == Kind.SEND)
    dropped = good.actions[0][:first_send] + good.actions[0][first_send + 1:]
    missing = Schedule("missing", 2, 2, (0, 1), (), (dropped, good.actions[1]),
                       good.llm_in_flight_bound, good.encoder_in_flight_bound)
    with pytest.raises(ScheduleError, match="differ"):
        check_schedule(missing)
    recv_first = (Action(Kind.RECV, 0, 0, 1, Payload.GRADIENT),
                  Action(Kind.SEND, 0, 0, 1, Payload.ACTIVATION))
    recv_first_1 = (Action(Kind.RECV, 0, 1, 0, Payload.ACTIVATION),
                    Action(Kind.SEND, 0, 1, 0, Payload.GRADIENT))
    cyc = Schedule("cycle", 2, 1, (0, 1), (), (recv_first, recv_first_1), (1, 1), (0, 0))
    with pytest.raises(ScheduleError, match="deadlock"):
        check_schedule(cyc)
    with pytest.raises(ScheduleError, match="deadlock"):
        simulate(cyc, uniform_costs(1, 1))
    crossed = (Action(Kind.SEND, 1, 0, 1, Payload.ACTIVATION),
               Action(Kind.SEND, 0, 0, 1, Payload.ACTIVATION))
    crossed_1 = (Action(Kind.RECV, 0, 1, 0, Payload.ACTIVATION),
                 Action(Kind.RECV, 1, 1, 0, Payload.ACTIVATION))
    with pytest.raises(ScheduleError, match="order"):
        check_schedule(Schedule("x", 2, 2, (0, 1), (), (crossed, crossed_1), (2, 2), (0, 0)))


def test_builders_reject_bad_sizes_and_shares():
    with pytest.raises(ValueError, match="num_stages: expected an int >= 1, got 0"):
        one_f_one_b(0, 4)
    with pytest.raises(ValueError, match="num_microbatches"):
        encoder_first_stage(2, 0)
    with pytest.raises(ValueError, match=r"shares\[0\]"):
        uniform_insertion(2, 1, [[0.7, 0.7]])
    with pytest.raises(ValueError, match="shares"):
        uniform_insertion(2, 2, [[0.5, 0.5]])
    with pytest.raises(ValueError, match="prefetch.*deadlocks"):
        encoder_disaggregated(4, 8, prefetch=2)


def test_builders_are_deterministic():
    for name, build in BUILDERS.items():
        assert build(4, 9) == build(4, 9), name
