"""Evaluation plans: the training plan without its backward half still runs to completion, with
every forward of the training plan, in the same order, and nothing of the backward."""

from hypothesis import given
from hypothesis import strategies as st

from lightning_omni.plan.messages import check_schedule
from lightning_omni.plan.schedule import Kind, Payload, forward_only
from lightning_omni.runtime.engine import SCHEDULES, build_plan

BACKWARD = {Kind.LLM_BWD, Kind.ENC_BWD, Kind.ALLREDUCE}


@given(schedule=st.sampled_from(SCHEDULES), pipeline=st.integers(1, 4),
       replicas=st.integers(1, 2), micro=st.integers(1, 6), data=st.data())
def test_forward_only_keeps_every_forward_and_runs(schedule, pipeline, replicas, micro, data):
    per = st.lists(st.sampled_from([0.0, 1.0, 3.0, 7.0]), min_size=2, max_size=2)
    costs = tuple(tuple(tuple(data.draw(per)) for _ in range(micro)) for _ in range(replicas))
    full = build_plan(schedule, pipeline, costs)
    fwd = forward_only(full)
    check_schedule(fwd)
    for prog, prog_fwd in zip(full.actions, fwd.actions, strict=True):
        kept = [a for a in prog if a.kind in (Kind.LLM_FWD, Kind.ENC_FWD)
                or (a.kind in (Kind.SEND, Kind.RECV)
                    and a.payload in (Payload.ACTIVATION, Payload.FEATURES))]
        assert [a for a in prog_fwd if a.kind != Kind.WAIT] == kept
        assert not any(a.kind in BACKWARD or a.payload in (Payload.GRADIENT,
                                                           Payload.FEATURE_GRAD)
                       for a in prog_fwd)
