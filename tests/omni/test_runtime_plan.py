"""The plan IR as the runtime needs it: sample placement, completion points, replica groups."""

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightning_omni.plan.messages import check_schedule
from lightning_omni.plan.schedule import (
    Action,
    Kind,
    Payload,
    Schedule,
    ScheduleError,
    assign_encoder_samples,
    encoder_first_stage,
    for_replicas,
    one_f_one_b,
    uniform_insertion,
    with_completion_points,
)
from lightning_omni.plan.simulate import simulate, uniform_costs


@st.composite
def sample_costs(draw):
    p = draw(st.integers(1, 4))
    n = draw(st.integers(1, 8))
    rows = [draw(st.lists(st.sampled_from([0.0, 1.0, 2.5, 4.0]), min_size=1, max_size=6))
            for _ in range(n)]
    return p, n, rows


@given(sample_costs())
def test_every_sample_is_encoded_once_and_empty_microbatches_have_no_encoder_actions(case):
    p, n, costs = case
    samples, shares = assign_encoder_samples(costs, p)
    for sched in (uniform_insertion(p, n, shares, samples=samples),
                  encoder_first_stage(p, n, samples=[sum(row, ()) for row in samples])):
        check_schedule(sched)
        fwd = Counter()
        for prog in sched.actions:
            for a in prog:
                if a.kind == Kind.ENC_FWD:
                    assert a.samples, "an encoder action without samples"
                    fwd.update((a.microbatch, i) for i in a.samples)
                if a.kind in (Kind.SEND, Kind.RECV) and a.payload in (Payload.FEATURES,
                                                                       Payload.FEATURE_GRAD):
                    assert a.samples
        want = Counter((m, i) for m, row in enumerate(costs) for i, c in enumerate(row) if c > 0)
        assert fwd == want
        bwd = Counter((a.microbatch, i) for prog in sched.actions for a in prog
                      if a.kind == Kind.ENC_BWD for i in a.samples)
        assert bwd == want


def test_drain_microbatches_skip_stage_zero_and_lpt_balances():
    samples, shares = assign_encoder_samples([[4, 3, 3, 2], [0, 0], [1, 1]], 2)
    assert samples[0] == [(0, 3), (1, 2)]  # LPT: 4+2 vs 3+3
    assert shares[0] == [0.5, 0.5]
    assert samples[1] == [(), ()] and shares[1] == [0.0, 0.0]
    assert samples[2] == [(), (0, 1)]  # a drain microbatch: stage 0 gets nothing
    with pytest.raises(ValueError, match="sample_costs"):
        assign_encoder_samples([[-1.0]], 2)


@pytest.mark.parametrize("p,n", [(2, 4), (3, 5), (4, 8), (2, 1)])
@pytest.mark.parametrize("lag", [0, 1, 3])
def test_completion_points_make_blocking_waits_deadlock_free(p, n, lag):
    for sched in (one_f_one_b(p, n, grad_sync=True), encoder_first_stage(p, n),
                  uniform_insertion(p, n)):
        done = with_completion_points(sched, lag)
        check_schedule(done)
        for prog in done.actions:
            sends = Counter((a.payload, a.microbatch, a.peer) for a in prog if a.kind == Kind.SEND)
            waits = Counter((a.payload, a.microbatch, a.peer) for a in prog if a.kind == Kind.WAIT)
            assert sends == waits
            # each wait comes after its send
            seen = set()
            for a in prog:
                if a.kind == Kind.SEND:
                    seen.add((a.payload, a.microbatch, a.peer))
                if a.kind == Kind.WAIT:
                    assert (a.payload, a.microbatch, a.peer) in seen


def test_wait_at_the_wrong_place_is_a_deadlock():
    # rank 0 waits for its send before receiving, rank 1 sends before receiving: fine; but rank 1
    # waiting for its own send before it receives rank 0's message deadlocks.
    send = Action(Kind.SEND, 0, 0, 1, Payload.ACTIVATION)
    recv = Action(Kind.RECV, 0, 0, 0, Payload.ACTIVATION)
    back = Action(Kind.SEND, 0, 1, 0, Payload.GRADIENT)
    back_recv = Action(Kind.RECV, 0, 0, 1, Payload.GRADIENT)

    def sched(p0, p1):
        return Schedule("t", 2, 1, (0, 1), (), (tuple(p0), tuple(p1)), (1, 1), (0, 0))

    wait0 = Action(Kind.WAIT, 0, 0, 1, Payload.ACTIVATION)
    wait1 = Action(Kind.WAIT, 0, 1, 0, Payload.GRADIENT)
    check_schedule(sched([send, back_recv, wait0], [back, recv, wait1]))
    with pytest.raises(ScheduleError, match="deadlock"):
        check_schedule(sched([send, wait0, back_recv], [back, wait1, recv]))
    with pytest.raises(ScheduleError, match="has not posted"):
        check_schedule(sched([wait0, send, back_recv], [back, recv, wait1]))


def test_simulator_counts_unfinished_sends_and_waits_for_the_receiver():
    # rank 0 sends 10 bytes at t=0 and waits; rank 1 computes 5 s before receiving.
    prog0 = (Action(Kind.SEND, 0, 0, 1, Payload.ACTIVATION),
             Action(Kind.WAIT, 0, 0, 1, Payload.ACTIVATION),
             Action(Kind.LLM_FWD, 1, 0))
    prog1 = (Action(Kind.LLM_FWD, 0, 1), Action(Kind.RECV, 0, 1, 0, Payload.ACTIVATION))
    sched = Schedule("t", 2, 2, (0, 1), (), (prog0, prog1), (1, 1), (0, 0))
    res = simulate(sched, uniform_costs(5.0, 5.0, activation_bytes=1.0, message_bytes=10.0))
    # the send buffer (10) is held until t=5; then one activation (1) is live
    assert res.peak_memory_bytes[0] == 10.0
    assert res.rank_end_seconds == (10.0, 5.0)
    # without the WAIT the send counts nothing (buffered elsewhere) and rank 0 does not block
    no_wait = Schedule("t", 2, 2, (0, 1), (), ((prog0[0], prog0[2]), prog1), (1, 1), (0, 0))
    res = simulate(no_wait, uniform_costs(5.0, 5.0, activation_bytes=1.0, message_bytes=10.0))
    assert res.peak_memory_bytes[0] == 1.0 and res.rank_end_seconds == (5.0, 5.0)


def test_grouped_collectives_start_with_the_last_member():
    def prog(mb):
        return (Action(Kind.LLM_FWD, mb, 0),
                Action(Kind.ALLREDUCE, payload=Payload.WEIGHT_GRADS, group=(0, 1)))

    sched = Schedule("t", 1, 1, (0, 1), (), (prog(0), prog(1)), (1, 1), (0, 0), 2)
    costs = uniform_costs(1.0, 1.0)

    def compute(rank, a):
        return 1.0 if rank == 0 else 3.0

    costs = type(costs)(compute, costs.transfer_seconds, lambda r, a: 0.5,
                        costs.memory_delta_bytes, costs.static_memory_bytes, costs.memory_cap_bytes)
    res = simulate(sched, costs)
    assert res.rank_end_seconds == (3.5, 3.5)


@pytest.mark.parametrize("builder", ["encoder_first_stage", "uniform_insertion"])
def test_for_replicas_joins_replicas_with_named_groups(builder):
    p, n, dp = 2, 4, 2
    costs = [[[1.0, 0.0, 2.0], [0.0, 0.0, 0.0], [3.0, 1.0, 1.0], [1.0, 1.0, 0.0]],
             [[0.0, 0.0, 0.0], [2.0, 2.0, 2.0], [1.0, 0.0, 0.0], [0.0, 5.0, 1.0]]]
    reps = []
    for d in range(dp):
        samples, shares = assign_encoder_samples(costs[d], p)
        if builder == "uniform_insertion":
            reps.append(uniform_insertion(p, n, shares, samples=samples))
        else:
            reps.append(encoder_first_stage(p, n, samples=[sum(r, ()) for r in samples]))
    plan = with_completion_points(for_replicas(reps))
    check_schedule(plan)
    assert plan.num_replicas == 2 and plan.num_ranks == 4
    assert [plan.stage_of(r) for r in range(4)] == [0, 1, 0, 1]
    assert [plan.replica_of(r) for r in range(4)] == [0, 0, 1, 1]
    for rank, prog in enumerate(plan.actions):
        for a in prog:
            if a.kind in (Kind.SEND, Kind.RECV):
                assert plan.replica_of(a.peer) == plan.replica_of(rank)
        groups = {a.payload: a.group for a in prog if a.kind == Kind.ALLREDUCE}
        assert groups[Payload.WEIGHT_GRADS] == (rank % p, rank % p + p)
        if builder == "uniform_insertion":
            assert groups[Payload.ENCODER_GRADS] == (0, 1, 2, 3)
        elif rank % p == 0:
            assert groups[Payload.ENCODER_GRADS] == (0, 2)
        else:
            assert Payload.ENCODER_GRADS not in groups
    res = simulate(plan, uniform_costs(1.0, 2.0, 1.0, 2.0))
    assert res.step_seconds > 0
    with pytest.raises(ValueError, match="replicas"):
        for_replicas([reps[0], uniform_insertion(3, n)])


@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [1, 3, 8])
def test_inline_stage0_is_valid_and_holds_fewer_encoder_activations(p, n):
    sched = uniform_insertion(p, n, inline_stage0=True)
    check_schedule(with_completion_points(sched))
    from lightning_omni.plan.schedule import max_in_flight

    _, enc = max_in_flight(sched)
    assert all(a <= b for a, b in zip(enc, sched.encoder_in_flight_bound, strict=True))
    # stage 0 runs its own share just in time: no more in flight than its LLM microbatches
    assert enc[0] <= min(p, n)


def test_inline_stage0_closed_form_two_stages():
    # 2 stages, 8 microbatches of 4 equal samples; F=1, B=2 per stage, encoder F=1, B=2 per
    # microbatch, one unit of activation per LLM microbatch and per whole encoder microbatch.
    samples, shares = assign_encoder_samples([[1.0] * 4] * 8, 2)
    costs = uniform_costs(1, 2, 1, 2, activation_bytes=1, encoder_activation_bytes=1)
    first = simulate(encoder_first_stage(2, 8, samples=[(0, 1, 2, 3)] * 8), costs)
    ahead = simulate(uniform_insertion(2, 8, shares, samples=samples), costs)
    inline = simulate(uniform_insertion(2, 8, shares, samples=samples, inline_stage0=True), costs)
    # stage 0 under encoder_first_stage: 2 LLM + 2 encoder microbatches in flight
    assert first.peak_memory_bytes[0] == 4.0
    # running ahead P microbatches at half share holds as much; inline holds one half share less
    assert ahead.peak_memory_bytes[0] == 4.0
    assert inline.peak_memory_bytes[0] == 3.0
    assert first.step_seconds == 49.0 and inline.step_seconds == 39.0


def test_inline_stage0_without_skipping_the_drain_closed_form():
    # same prices; stage 0 keeps half of every microbatch: every stage costs F + B + (E_f + E_b)/2
    # = 4.5 per microbatch, 8 * 4.5 = 36, plus the 1F1B fill and drain of one stage (1.5)
    samples, shares = assign_encoder_samples([[1.0] * 4] * 8, 2, skip_stage0_drain=False)
    assert all(len(row[0]) == 2 and len(row[1]) == 2 for row in samples)
    costs = uniform_costs(1, 2, 1, 2, activation_bytes=1, encoder_activation_bytes=1)
    res = simulate(uniform_insertion(2, 8, shares, samples=samples, inline_stage0=True), costs)
    assert res.step_seconds == 37.5 and res.rank_end_seconds == (37.5, 37.5)
    assert res.peak_memory_bytes[0] == 3.0
