import pytest

from lightning_omni.plan.schedule import (
    Action,
    Kind,
    Payload,
    Schedule,
    encoder_first_stage,
    one_f_one_b,
    uniform_insertion,
)
from lightning_omni.plan.simulate import StepCosts, simulate, uniform_costs


def test_peak_activation_memory_follows_one_f_one_b_depth():
    p, n = 4, 12
    sim = simulate(one_f_one_b(p, n), uniform_costs(1, 2, activation_bytes=10.0))
    assert sim.peak_memory_bytes == (40.0, 30.0, 20.0, 10.0)


def test_uniform_insertion_halves_stage0_memory_against_encoder_first_stage():
    p, n = 8, 32
    costs = uniform_costs(1, 2, 1, 2, activation_bytes=1.0, encoder_activation_bytes=4.0)
    first = simulate(encoder_first_stage(p, n), costs).peak_memory_bytes[0]
    spread = simulate(uniform_insertion(p, n), costs).peak_memory_bytes[0]
    assert first == pytest.approx(p * 1.0 + p * 4.0)
    assert spread < first / 2


def test_oom_flag_and_busy_fractions():
    sim = simulate(one_f_one_b(2, 4), uniform_costs(1, 1, activation_bytes=5,
                                                     memory_cap_bytes=7))
    assert sim.oom == (True, False)
    assert all(0 < b <= 1 for b in sim.busy_fraction)
    assert sim.bubble_fraction[0] == pytest.approx(1 - sim.busy_fraction[0])
    assert sim.busy_seconds == (8.0, 8.0)
    assert sim.step_seconds == pytest.approx(10.0)


def test_sends_serialize_on_the_senders_link():
    prog0 = (Action(Kind.SEND, 0, 0, 1, Payload.ACTIVATION),
             Action(Kind.SEND, 1, 0, 1, Payload.ACTIVATION))
    prog1 = (Action(Kind.RECV, 0, 1, 0, Payload.ACTIVATION),
             Action(Kind.RECV, 1, 1, 0, Payload.ACTIVATION),
             Action(Kind.LLM_FWD, 0, 1))
    s = Schedule("links", 2, 2, (0, 1), (), (prog0, prog1), (1, 1), (0, 0))
    costs = uniform_costs(1.0, 1.0, transfer=3.0)
    sim = simulate(s, costs)
    assert sim.rank_end_seconds == (0.0, 7.0)  # two 3 s transfers back to back, then 1 s


def test_collectives_and_static_memory_are_priced():
    s = one_f_one_b(2, 2, grad_sync=True)
    costs = StepCosts(lambda r, a: 1.0, lambda r, a: 0.0, lambda r, a: 5.0,
                      lambda r, a: 0.0, lambda r: 100.0 * (r + 1), 150.0)
    sim = simulate(s, costs, record_timeline=True)
    assert sim.step_seconds == pytest.approx(3 * 2 + 5)
    assert sim.peak_memory_bytes == (100.0, 200.0)
    assert sim.oom == (False, True)
    assert sim.timeline[0][-1].kind == Kind.ALLREDUCE


def test_sample_exchange_is_a_collective_priced_up_front():
    s = uniform_insertion(2, 4, sample_exchange=True)
    assert all(prog[0].kind == Kind.ALLTOALL for prog in s.actions)
    base = uniform_costs(1, 2)
    priced = StepCosts(base.compute_seconds, base.transfer_seconds, lambda r, a: 0.5,
                       base.memory_delta_bytes, base.static_memory_bytes, base.memory_cap_bytes)
    without = simulate(uniform_insertion(2, 4), base).step_seconds
    assert simulate(s, priced).step_seconds == pytest.approx(without + 0.5)
