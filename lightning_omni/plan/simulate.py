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

from collections.abc import Callable
from dataclasses import dataclass, field

from .actions import Action, Kind, message_key
from .execution import MessageKey, ProgramRun, ScheduleError
from .schedule import Schedule


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


class _Simulation(ProgramRun):
    """The blocking rules of ``execution`` with a clock, a link and a memory count per rank."""

    def __init__(self, schedule: Schedule, costs: StepCosts, record_timeline: bool) -> None:
        super().__init__(schedule.actions)
        n = schedule.num_ranks
        self.costs, self.record = costs, record_timeline
        self.clock = [0.0] * n
        self.link_free = [0.0] * n
        self.busy = [0.0] * n
        self.live = [costs.static_memory_bytes(r) for r in range(n)]
        self.peak = list(self.live)
        self.held: dict[MessageKey, float] = {}  # send buffers awaiting their WAIT
        self.awaited = {message_key(r, a) for r, prog in enumerate(schedule.actions)
                        for a in prog if a.kind == Kind.WAIT}
        self.timeline: list[list[Interval]] = [[] for _ in range(n)]

    def _hold(self, rank: int, nbytes: float) -> None:
        self.live[rank] += nbytes
        if self.live[rank] > self.peak[rank]:
            self.peak[rank] = self.live[rank]

    def on_compute(self, rank: int, a: Action) -> None:
        dur = self.costs.compute_seconds(rank, a)
        if self.record:
            self.timeline[rank].append(Interval(self.clock[rank], self.clock[rank] + dur,
                                                a.kind, a.microbatch))
        self.clock[rank] += dur
        self.busy[rank] += dur
        self._hold(rank, self.costs.memory_delta_bytes(rank, a))

    def on_send(self, rank: int, a: Action, key: MessageKey) -> float:
        """Sends serialize on the sender's link; the message arrives when its transfer ends."""
        start = max(self.clock[rank], self.link_free[rank])
        self.link_free[rank] = start + self.costs.transfer_seconds(rank, a)
        if key in self.awaited:
            self.held[key] = self.costs.message_bytes(rank, a)
            self._hold(rank, self.held[key])
        return self.link_free[rank]

    def on_recv(self, rank: int, a: Action, key: MessageKey, sent: float) -> float:
        self.clock[rank] = max(self.clock[rank], sent)
        return self.clock[rank]

    def on_wait(self, rank: int, a: Action, key: MessageKey, taken: float) -> None:
        self.clock[rank] = max(self.clock[rank], taken)
        self._hold(rank, -self.held.pop(key))

    def arrival(self, rank: int, a: Action) -> float:
        return max(self.clock[rank], self.link_free[rank])

    def on_collective(self, rank: int, a: Action, start: float) -> None:
        dur = self.costs.collective_seconds(rank, a)
        if self.record:
            self.timeline[rank].append(Interval(start, start + dur, a.kind, -1))
        self.clock[rank] = start + dur


def simulate(schedule: Schedule, costs: StepCosts, record_timeline: bool = False) -> SimResult:
    """Run the schedule; raise ScheduleError if some rank can never proceed."""
    sim = _Simulation(schedule, costs, record_timeline)
    stuck = [(r, str(schedule.actions[r][pc])) for r, pc in sim.run()]
    if stuck:
        raise ScheduleError(f"deadlock in {schedule.name}: ranks blocked at {stuck}")
    clock = sim.clock
    return SimResult(
        step_seconds=max(clock) if clock else 0.0,
        rank_end_seconds=tuple(clock),
        busy_seconds=tuple(sim.busy),
        peak_memory_bytes=tuple(sim.peak),
        memory_cap_bytes=costs.memory_cap_bytes,
        timeline=tuple(tuple(t) for t in sim.timeline),
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
