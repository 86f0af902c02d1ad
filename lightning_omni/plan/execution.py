"""The blocking rules of a plan, in one place: the order check and the simulator run on them.

A RECV proceeds once its SEND has run; a WAIT once its message has been received; a collective
with a ``group`` once every member has reached its matching collective (the n-th of one
(kind, payload, group) on each member); everything else proceeds at once. ``ProgramRun`` runs
the per-rank programs under these rules in round-robin passes over the ranks, each running
until it blocks; a rank is revisited only when what blocks it has happened, in the pass it
would be revisited in anyway, so the order (``plan.messages`` derives the tag-free posting
order from it) is deterministic and cheap. What an action costs is for subclasses to say
(``simulate``); by default actions take no time.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from .actions import COLLECTIVE_KINDS, Action, Kind, message_key

MessageKey = tuple[str, int, int, int]
_MESSAGE_KINDS = frozenset({Kind.SEND, Kind.RECV, Kind.WAIT})
_NEEDS = {Kind.RECV: Kind.SEND, Kind.WAIT: Kind.RECV}


class ScheduleError(ValueError):
    """A schedule that cannot run: unmatched messages, crossed order or a deadlock."""


def _collective_key(a: Action) -> tuple:
    return (str(a.kind), str(a.payload), a.group)


class Rendezvous:
    """Collectives with a ``group``: a member passes its n-th collective of one (kind, payload,
    group) once every member has reached its n-th; it starts at the latest member's arrival."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, tuple], int] = {}
        self.arrived: dict[tuple, dict[int, float]] = {}

    def arrive(self, rank: int, a: Action, when: float = 0.0) -> float | None:
        """The collective's start once every member has arrived (None before): the latest
        ``when`` any member arrived with."""
        ck = _collective_key(a)
        key = ck + (self.seen.get((rank, ck), 0),)
        arrived = self.arrived.setdefault(key, {})
        arrived.setdefault(rank, when)
        if not set(a.group) <= arrived.keys():
            return None
        self.seen[rank, ck] = key[-1] + 1
        return max(arrived.values())

    def passes(self, rank: int, a: Action) -> bool:
        return self.arrive(rank, a) is not None


class ProgramRun:
    """One run of per-rank programs under the blocking rules. The hooks are called as each
    action runs; values returned by ``on_send``/``on_recv`` are handed to the matching
    RECV/WAIT (the simulator's arrival and taking times)."""

    def __init__(self, programs: Sequence[Sequence[Action]]) -> None:
        self.programs = programs
        self.pcs = [0] * len(programs)

    # -- hooks ----------------------------------------------------------------------------
    def on_compute(self, rank: int, a: Action) -> None:
        """A compute action ran."""

    def on_send(self, rank: int, a: Action, key: MessageKey) -> float:
        return 0.0

    def on_recv(self, rank: int, a: Action, key: MessageKey, sent: float) -> float:
        return 0.0

    def on_wait(self, rank: int, a: Action, key: MessageKey, taken: float) -> None:
        """A WAIT passed: the receiver has taken the message."""

    def arrival(self, rank: int, a: Action) -> float:
        """When ``rank`` reaches a collective."""
        return 0.0

    def on_collective(self, rank: int, a: Action, start: float) -> None:
        """A collective passed; ``start``: the latest member's ``arrival``."""

    # -- the rules ------------------------------------------------------------------------
    def run(self) -> list[tuple[int, int]]:
        """Run to completion or deadlock; return (rank, index) where ranks stay blocked."""
        # (SEND or RECV, message) -> the value handed to the action that waits for it
        done: dict[tuple[Kind, MessageKey], float] = {}
        waiting: dict[tuple[Kind, MessageKey], int] = {}  # what a blocked rank waits for
        meet = Rendezvous()
        gathering: set[int] = set()  # ranks blocked at a grouped collective
        turns = [(0, r) for r in range(len(self.programs))]  # (pass, rank), a heap
        while turns:
            turn, rank = heapq.heappop(turns)

            def wake(other: int, turn: int = turn, rank: int = rank) -> None:
                heapq.heappush(turns, (turn if other > rank else turn + 1, other))

            prog, pcs = self.programs[rank], self.pcs
            while pcs[rank] < len(prog):
                a = prog[pcs[rank]]
                if a.kind in _MESSAGE_KINDS:
                    key = message_key(rank, a)
                    value = 0.0
                    if a.kind in _NEEDS:  # RECV needs its SEND, WAIT its RECV
                        event = (_NEEDS[a.kind], key)
                        if event not in done:
                            waiting[event] = rank
                            break
                        value = done.pop(event)
                    if a.kind == Kind.SEND:
                        done[Kind.SEND, key] = self.on_send(rank, a, key)
                    elif a.kind == Kind.RECV:
                        done[Kind.RECV, key] = self.on_recv(rank, a, key, value)
                    else:
                        self.on_wait(rank, a, key, value)
                    if (a.kind, key) in waiting:
                        wake(waiting.pop((a.kind, key)))
                elif a.kind in COLLECTIVE_KINDS:
                    start = self.arrival(rank, a)
                    if a.group:
                        begin = meet.arrive(rank, a, start)
                        if begin is None:
                            gathering.add(rank)
                            break  # the last member to arrive wakes everyone
                        start = begin
                        for member in a.group:
                            if member in gathering:
                                gathering.discard(member)
                                wake(member)
                    self.on_collective(rank, a, start)
                else:
                    self.on_compute(rank, a)
                pcs[rank] += 1
        return [(r, pc) for r, pc in enumerate(self.pcs) if pc < len(self.programs[r])]


class _SendOrder(ProgramRun):
    def __init__(self, programs: Sequence[Sequence[Action]],
                 sends: list[tuple[int, Action]] | None) -> None:
        super().__init__(programs)
        self.sends = sends

    def on_send(self, rank: int, a: Action, key: MessageKey) -> float:
        if self.sends is not None:
            self.sends.append((rank, a))
        return 0.0


def execute_order(programs: Sequence[Sequence[Action]],
                  sends: list[tuple[int, Action]] | None = None) -> list[tuple[int, int]]:
    """Run the programs in dependency order; return (rank, index) where ranks stay blocked.
    ``sends`` (if given) receives every (rank, SEND action) in the order they run."""
    return _SendOrder(programs, sends).run()
