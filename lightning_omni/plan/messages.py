"""When each rank posts its point-to-point messages: one order per pair of ranks, no tags.

NCCL ignores message tags. Between two ranks it matches sends and receives in the order they
are posted and runs both directions on one stream per pair, where each operation waits for the
peer's matching one. So the two ranks of a pair must post their messages to each other in one
and the same order. Without it, 1F1B's steady state, where an activation goes one way while a
gradient comes the other, has each rank start with its send and both wait forever; a rank
that receives features in another order than they were sent matches the wrong tensors.

The plan is known to every rank, so both sides derive that order from it here: per pair, the
order in which the sends run in one deterministic simulated run of the plan. A rank posts a
send when its program reaches it, after first posting every receive that comes earlier in the
pair's order (receive buffers are sized from the plan, so a receive can be posted before its
RECV action, which then only waits). Posted that way no crossing remains and no batched
(``batch_isend_irecv``) call is needed. The runtime posts like this on every backend, gloo with
no tags at all, so the CPU tests exercise exactly the order NCCL needs; ``check_posts`` proves
the plan runs to completion under NCCL's rule (an operation of a pair completes only with the
peer's matching one and after every earlier operation of that pair).
"""

from __future__ import annotations

from functools import lru_cache

from .actions import COLLECTIVE_KINDS, Kind, message_key
from .costs import _require
from .execution import Rendezvous, ScheduleError, execute_order
from .schedule import Schedule

# per rank: (program index, indices of the SEND/RECV actions posted there, in order)
Posts = tuple[tuple[tuple[int, tuple[int, ...]], ...], ...]


def _pair(a: int, b: int) -> tuple[int, int]:
    return (a, b) if a < b else (b, a)


def check_schedule(schedule: Schedule) -> None:
    """Raise ScheduleError unless messages match one-to-one, in the same order per channel
    (source, destination, payload), each WAIT follows its SEND, and the schedule runs to
    completion: receives block, a WAIT blocks until the receiver has taken its message, a
    collective with a ``group`` blocks until every member reaches its matching collective;
    and it also runs with tag-free posting under NCCL's pairwise order (``check_posts``)."""
    sends: dict[tuple[int, int, str], list[int]] = {}
    recvs: dict[tuple[int, int, str], list[int]] = {}
    for rank, prog in enumerate(schedule.actions):
        sent: set[tuple[str, int, int, int]] = set()
        for a in prog:
            if a.kind in (Kind.SEND, Kind.RECV, Kind.WAIT):
                _require(0 <= a.peer < schedule.num_ranks and a.peer != rank, "peer",
                         f"another rank in [0, {schedule.num_ranks})", (rank, str(a)))
            if a.kind == Kind.WAIT:
                if message_key(rank, a) not in sent:
                    raise ScheduleError(f"rank {rank}: {a} waits for a send it has not posted")
                sent.discard(message_key(rank, a))
            elif a.kind in (Kind.SEND, Kind.RECV):
                payload, mb, src, dst = message_key(rank, a)
                if a.kind == Kind.SEND:
                    sent.add(message_key(rank, a))
                table = sends if a.kind == Kind.SEND else recvs
                table.setdefault((src, dst, payload), []).append(mb)
            elif a.kind in COLLECTIVE_KINDS and a.group:
                _require(rank in a.group, "group", f"a group containing rank {rank}",
                         (rank, a.group))
    for pair in set(sends) | set(recvs):
        s, r = sends.get(pair, []), recvs.get(pair, [])
        if s != r:
            raise ScheduleError(f"{pair[2]} messages {pair[0]}->{pair[1]}: sends for microbatches "
                                f"{s[:8]} and receives for {r[:8]} differ in content or order")
    stuck = execute_order(schedule.actions)
    if stuck:
        where = [(r, str(schedule.actions[r][pc])) for r, pc in stuck]
        raise ScheduleError(f"deadlock: ranks blocked at {where}")
    check_posts(schedule)


@lru_cache(maxsize=64)
def message_order(schedule: Schedule) -> dict[tuple[int, int], tuple[tuple, ...]]:
    """Per pair of ranks (low, high): its messages' keys in the one order both post them."""
    sends: list = []
    stuck = execute_order(schedule.actions, sends)
    if stuck:
        raise ScheduleError(f"deadlock: ranks blocked at "
                            f"{[(r, str(schedule.actions[r][pc])) for r, pc in stuck]}")
    order: dict[tuple[int, int], list[tuple]] = {}
    for rank, a in sends:
        order.setdefault(_pair(rank, a.peer), []).append(message_key(rank, a))
    return {pair: tuple(keys) for pair, keys in order.items()}


@lru_cache(maxsize=64)
def message_posts(schedule: Schedule) -> Posts:
    """Every rank's posting points (see the module doc)."""
    order = message_order(schedule)
    position = {key: k for keys in order.values() for k, key in enumerate(keys)}
    out = []
    for rank, prog in enumerate(schedule.actions):
        index = {message_key(rank, a): i for i, a in enumerate(prog)
                 if a.kind in (Kind.SEND, Kind.RECV)}
        done: dict[tuple[int, int], int] = {}  # per pair: elements of its order posted
        at = []
        for i, a in enumerate(prog):
            if a.kind not in (Kind.SEND, Kind.RECV):
                continue
            pair = _pair(rank, a.peer)
            keys = order.get(pair, ())
            k = position.get(message_key(rank, a), -1)
            if k < 0:
                raise ScheduleError(f"rank {rank}: {a} has no matching send in the plan")
            group = []
            while done.get(pair, 0) <= k:
                key = keys[done.get(pair, 0)]
                j = index[key]
                if prog[j].kind == Kind.SEND and j != i:
                    raise ScheduleError(f"rank {rank}: {prog[j]} must be posted before {a}, "
                                        "but comes later in its program")
                group.append(j)
                done[pair] = done.get(pair, 0) + 1
            if group:
                at.append((i, tuple(group)))
        out.append(tuple(at))
    return tuple(out)


def check_posts(schedule: Schedule) -> None:
    """Raise ScheduleError unless the plan runs to completion with the tag-free posting order
    under NCCL's rule: the n-th operation of a pair completes once both ranks have posted their
    first n (a RECV and a send's WAIT block until then), collectives as in ``check_schedule``."""
    stuck = blocked_under_pair_order(schedule, message_posts(schedule))
    if stuck:
        raise ScheduleError(f"deadlock with tag-free posting (NCCL's pairwise order): ranks "
                            f"blocked at {stuck}")


def blocked_under_pair_order(schedule: Schedule, posts: Posts) -> list[tuple[int, str]]:
    """(rank, action) where ranks stay blocked when they post as ``posts`` says and each pair
    matches its operations in posting order: the n-th completes once both ranks have posted n
    operations to each other and the first n agree (a mismatch never completes)."""
    posted: dict[tuple[int, int], list[tuple]] = {}  # (rank, peer): keys posted, in order
    at = [dict(p) for p in posts]
    meet = Rendezvous()
    pcs = [0] * schedule.num_ranks

    def complete(rank: int, peer: int, key: tuple) -> bool:
        mine, theirs = posted.get((rank, peer), []), posted.get((peer, rank), [])
        if key not in mine:
            return False
        n = mine.index(key) + 1
        return len(theirs) >= n and mine[:n] == theirs[:n]

    progressed = True
    while progressed:
        progressed = False
        for rank, prog in enumerate(schedule.actions):
            while pcs[rank] < len(prog):
                pc = pcs[rank]
                for j in at[rank].pop(pc, ()):
                    posted.setdefault((rank, prog[j].peer), []).append(
                        message_key(rank, prog[j]))
                a = prog[pc]
                if a.kind in (Kind.RECV, Kind.WAIT) and \
                        not complete(rank, a.peer, message_key(rank, a)):
                    break
                if a.kind in COLLECTIVE_KINDS and a.group and not meet.passes(rank, a):
                    break
                pcs[rank] += 1
                progressed = True
    return [(r, str(schedule.actions[r][pc])) for r, pc in enumerate(pcs)
            if pc < len(schedule.actions[r])]
