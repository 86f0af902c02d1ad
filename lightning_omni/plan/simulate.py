"""Discrete-event execution of a Schedule's per-rank action lists.

The simulator runs exactly the actions the builders emit; only durations, transfer times and
memory deltas come from outside (a ``StepCosts``), so the same schedule can be priced with the
analytic model, a fitted profile or measured numbers. Receives block until the matching send's
data arrives; sends serialize on the sender's outgoing link. A send's buffer counts towards the
sender's memory (``StepCosts.message_bytes``) until its WAIT, which blocks until the receiver
has taken the message; sends without a WAIT are treated as buffered elsewhere (not counted). A
collective with a ``group`` starts when the last member reaches it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .schedule import (
    COLLECTIVE_KINDS,
    COMPUTE_KINDS,
    Action,
    Kind,
    Schedule,
    ScheduleError,
    message_key,
)


@dataclass(frozen=True)
class StepCosts:
    """Prices of one schedule's actions. All callables take (rank, action); collectives
    (all-reduce, all-to-all) are priced per rank, for the group the rank belongs to."""

    compute_seconds: Callable[[int, Action], float]
    transfer_seconds: Callable[[int, Action], float]
    collective_seconds: Callable[[int, Action], float]
    memory_delta_bytes: Callable[[int, Action], float]
    static_memory_bytes: Callable[[int], float]
    memory_cap_bytes: float
    message_bytes: Callable[[int, Action], float] = field(default=lambda rank, a: 0.0)


@dataclass(frozen=True, slots=True)
class Interval:
    """One busy span of a rank, for timelines."""

    start: float
    end: float
    kind: Kind
    microbatch: int


@dataclass(frozen=True)
class SimResult:
    step_seconds: float
    rank_end_seconds: tuple[float, ...]
    busy_seconds: tuple[float, ...]
    peak_memory_bytes: tuple[float, ...]
    memory_cap_bytes: float
    timeline: tuple[tuple[Interval, ...], ...]

    @property
    def busy_fraction(self) -> tuple[float, ...]:
        return tuple(b / self.step_seconds if self.step_seconds else 0.0
                     for b in self.busy_seconds)

    @property
    def bubble_fraction(self) -> tuple[float, ...]:
        return tuple(1.0 - f for f in self.busy_fraction)

    @property
    def oom(self) -> tuple[bool, ...]:
        return tuple(p > self.memory_cap_bytes for p in self.peak_memory_bytes)


def simulate(schedule: Schedule, costs: StepCosts, record_timeline: bool = False) -> SimResult:
    """Run the schedule; raise ScheduleError if some rank can never proceed."""
    n = schedule.num_ranks
    clock = [0.0] * n
    link_free = [0.0] * n
    busy = [0.0] * n
    live = [costs.static_memory_bytes(r) for r in range(n)]
    peak = list(live)
    pcs = [0] * n
    arrivals: dict[tuple[str, int, int, int], float] = {}
    taken: dict[tuple[str, int, int, int], float] = {}  # when the receiver took the message
    held: dict[tuple[str, int, int, int], float] = {}  # send buffers awaiting their WAIT
    waiting: dict[tuple[str, int, int, int], int] = {}
    waiting_taken: dict[tuple[str, int, int, int], int] = {}
    # grouped collectives: key -> {rank: arrival time}; ordinal per (rank, kind, payload, group)
    gathered: dict[tuple, dict[int, float]] = {}
    ordinal: dict[tuple, int] = {}
    released: dict[tuple[int, tuple], float] = {}
    awaited = {message_key(r, a) for r, prog in enumerate(schedule.actions) for a in prog
               if a.kind == Kind.WAIT}
    timeline: list[list[Interval]] = [[] for _ in range(n)]
    ready = deque(range(n))
    while ready:
        rank = ready.popleft()
        prog = schedule.actions[rank]
        while pcs[rank] < len(prog):
            a = prog[pcs[rank]]
            kind = a.kind
            if kind in COMPUTE_KINDS:
                dur = costs.compute_seconds(rank, a)
                if record_timeline:
                    timeline[rank].append(Interval(clock[rank], clock[rank] + dur, kind,
                                                   a.microbatch))
                clock[rank] += dur
                busy[rank] += dur
                live[rank] += costs.memory_delta_bytes(rank, a)
                if live[rank] > peak[rank]:
                    peak[rank] = live[rank]
            elif kind == Kind.SEND:
                key = message_key(rank, a)
                start = max(clock[rank], link_free[rank])
                link_free[rank] = start + costs.transfer_seconds(rank, a)
                arrivals[key] = link_free[rank]
                if key in awaited:
                    held[key] = costs.message_bytes(rank, a)
                    live[rank] += held[key]
                if key in waiting:
                    ready.append(waiting.pop(key))
            elif kind == Kind.RECV:
                key = message_key(rank, a)
                if key not in arrivals:
                    waiting[key] = rank
                    break
                clock[rank] = max(clock[rank], arrivals.pop(key))
                taken[key] = clock[rank]
                if key in waiting_taken:
                    ready.append(waiting_taken.pop(key))
            elif kind == Kind.WAIT:
                key = message_key(rank, a)
                if key not in taken:
                    waiting_taken[key] = rank
                    break
                clock[rank] = max(clock[rank], taken.pop(key))
                live[rank] -= held.pop(key)
            elif kind in COLLECTIVE_KINDS:
                dur = costs.collective_seconds(rank, a)
                start = max(clock[rank], link_free[rank])
                if a.group:
                    base = (str(kind), str(a.payload), a.group)
                    key = base + (ordinal.get((rank, base), 0),)
                    if (rank, key) not in released:
                        arrived = gathered.setdefault(key, {})
                        arrived[rank] = start
                        if not set(a.group) <= set(arrived):
                            break  # the last member to arrive wakes everyone
                        begin = max(arrived.values())
                        for member in a.group:
                            released[member, key] = begin
                            if member != rank:
                                ready.append(member)
                        del gathered[key]
                    start = released.pop((rank, key))
                    ordinal[rank, base] = key[-1] + 1
                if record_timeline:
                    timeline[rank].append(Interval(start, start + dur, kind, -1))
                clock[rank] = start + dur
            else:  # pragma: no cover - the enum is closed
                raise ScheduleError(f"action: unknown kind {kind}")
            if live[rank] > peak[rank]:
                peak[rank] = live[rank]
            pcs[rank] += 1
    stuck = [(r, str(schedule.actions[r][pc])) for r, pc in enumerate(pcs)
             if pc < len(schedule.actions[r])]
    if stuck:
        raise ScheduleError(f"deadlock in {schedule.name}: ranks blocked at {stuck}")
    return SimResult(
        step_seconds=max(clock) if clock else 0.0,
        rank_end_seconds=tuple(clock),
        busy_seconds=tuple(busy),
        peak_memory_bytes=tuple(peak),
        memory_cap_bytes=costs.memory_cap_bytes,
        timeline=tuple(tuple(t) for t in timeline),
    )


def uniform_costs(llm_fwd: float, llm_bwd: float, enc_fwd: float = 0.0, enc_bwd: float = 0.0,
                  transfer: float = 0.0, activation_bytes: float = 0.0,
                  encoder_activation_bytes: float = 0.0,
                  memory_cap_bytes: float = float("inf"),
                  message_bytes: float = 0.0) -> StepCosts:
    """Constant per-action prices; encoder prices scale with the action's share. For tests and
    back-of-envelope studies."""

    def compute(rank: int, a: Action) -> float:
        return {Kind.LLM_FWD: llm_fwd, Kind.LLM_BWD: llm_bwd,
                Kind.ENC_FWD: enc_fwd * a.share, Kind.ENC_BWD: enc_bwd * a.share}[a.kind]

    def memory(rank: int, a: Action) -> float:
        sign = 1.0 if a.kind in (Kind.LLM_FWD, Kind.ENC_FWD) else -1.0
        size = activation_bytes if a.kind in (Kind.LLM_FWD, Kind.LLM_BWD) else (
            encoder_activation_bytes * a.share)
        return sign * size

    return StepCosts(compute, lambda r, a: transfer, lambda r, a: 0.0, memory, lambda r: 0.0,
                     memory_cap_bytes, lambda r, a: message_bytes)
