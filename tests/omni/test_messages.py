"""Tag-free, NCCL-safe message order: both ranks of a pair post their messages in one order."""
import random

import pytest

from lightning_omni.plan.lssp_schedule import GROUPED_SCHEDULES, GroupOptions, build_grouped_plan
from lightning_omni.plan.messages import (
    blocked_under_pair_order,
    check_posts,
    check_schedule,
    message_posts,
)
from lightning_omni.plan.schedule import (
    Action,
    Kind,
    Payload,
    Schedule,
    ScheduleError,
    forward_only,
    message_key,
    one_f_one_b,
    with_completion_points,
)
from lightning_omni.runtime.engine import build_plan


def _pair_sequences(plan: Schedule) -> dict[tuple[int, int], list[tuple]]:
    """What each rank posts to or from each peer, in posting order: (rank, peer) -> keys."""
    seqs: dict[tuple[int, int], list[tuple]] = {}
    for rank, posts in enumerate(message_posts(plan)):
        for _, group in posts:
            for j in group:
                a = plan.actions[rank][j]
                seqs.setdefault((rank, a.peer), []).append(message_key(rank, a))
    return seqs


def _plans():
    rng = random.Random(0)
    for sched in ("uniform_insertion", "encoder_first_stage"):
        for pp, dp, mb in ((2, 1, 3), (3, 2, 4), (4, 1, 6), (2, 2, 2)):
            costs = tuple(tuple(tuple(rng.choice([0, 0, 1, 2, 5]) for _ in range(rng.randint(1, 3)))
                                for _ in range(mb)) for _ in range(dp))
            plan = build_plan(sched, pp, costs)
            yield f"{sched}-pp{pp}-dp{dp}", plan
            yield f"{sched}-pp{pp}-dp{dp}-fwd", forward_only(plan)
    for sched in GROUPED_SCHEDULES:
        lengths = tuple(tuple(tuple((rng.choice([0, 3, 8, 40]),) for _ in range(2))
                              for _ in range(2)) for _ in range(2))
        opts = GroupOptions(lssp=True, reorder=True, locality=(0,) * 4, heads=(4,))
        yield f"grouped-{sched}", build_grouped_plan(sched, 2, lengths, opts, ("image",)).schedule


@pytest.mark.parametrize("name, plan", list(_plans()), ids=lambda x: x if isinstance(x, str)
                         else "")
def test_both_ranks_of_a_pair_post_one_sequence(name, plan):
    check_schedule(plan)
    seqs = _pair_sequences(plan)
    for (rank, peer), keys in seqs.items():
        assert keys == seqs[peer, rank], (name, rank, peer)
    # every message posted exactly once on each side
    for rank, prog in enumerate(plan.actions):
        posted = [j for _, group in message_posts(plan)[rank] for j in group]
        expected = [j for j, a in enumerate(prog) if a.kind in (Kind.SEND, Kind.RECV)]
        assert sorted(posted) == expected
        # a receive is posted at or before its RECV; a send exactly at its SEND
        for i, group in message_posts(plan)[rank]:
            assert all(j >= i if prog[j].kind == Kind.RECV else j == i for j in group)


def test_crossing_posts_the_receive_before_the_send():
    """1F1B's steady state: stage 0 sends an activation while stage 1 sends a gradient. Each
    rank posting its send first deadlocks under NCCL's pairwise order; the plan's order has
    stage 0 post its receive of the gradient before it sends the next activation."""
    plan = with_completion_points(one_f_one_b(2, 4))
    naive = tuple(tuple((i, (i,)) for i, a in enumerate(prog) if a.kind in (Kind.SEND, Kind.RECV))
                  for prog in plan.actions)
    assert blocked_under_pair_order(plan, naive)
    assert blocked_under_pair_order(plan, message_posts(plan)) == []
    hoisted = [(i, group) for i, group in message_posts(plan)[0] if len(group) > 1]
    assert len(hoisted) == 3  # the steady state's three crossings
    for i, group in hoisted:
        kinds = [plan.actions[0][j].kind for j in group]
        assert kinds == [Kind.RECV, Kind.SEND]
        assert plan.actions[0][group[0]].payload == Payload.GRADIENT
        assert plan.actions[0][i].payload == Payload.ACTIVATION


def test_unmatched_message_is_refused():
    send = Action(Kind.SEND, 0, 0, 1, Payload.ACTIVATION)
    recv = Action(Kind.RECV, 1, 1, 0, Payload.ACTIVATION)  # another microbatch
    plan = Schedule("x", 2, 2, (0, 1), (), ((send,), (recv,)), (1, 1), (0, 0))
    with pytest.raises(ScheduleError):
        check_posts(plan)
