"""Schedule IR: per rank, the ordered actions of one training step.

A schedule is plain data. The simulator executes it and the runtime will execute it, so one
list is both the prediction and the plan. Sends are buffered (isend-like) and receives block;
a schedule is valid when every receive has exactly one matching send, messages of one payload
between two ranks are posted in the same order on both sides (a runtime gives each payload its
own channel: a communicator or a tag, so FIFO matching holds per channel), and program order
plus send->receive edges form an acyclic graph (``check_schedule`` verifies all three).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from .costs import _require


class Kind(str, Enum):  # noqa: UP042 - requires-python allows 3.10 (no StrEnum)
    """What an action does."""

    def __str__(self) -> str:
        return self.value

    LLM_FWD = "llm_fwd"
    LLM_BWD = "llm_bwd"
    ENC_FWD = "enc_fwd"
    ENC_BWD = "enc_bwd"
    SEND = "send"
    RECV = "recv"
    ALLREDUCE = "allreduce"
    ALLTOALL = "alltoall"


COMPUTE_KINDS = frozenset({Kind.LLM_FWD, Kind.LLM_BWD, Kind.ENC_FWD, Kind.ENC_BWD})
COLLECTIVE_KINDS = frozenset({Kind.ALLREDUCE, Kind.ALLTOALL})


class Payload(str, Enum):  # noqa: UP042
    """What a message carries; each payload is its own FIFO channel."""

    def __str__(self) -> str:
        return self.value

    ACTIVATION = "act"          # stage s -> s+1, forward
    GRADIENT = "grad"           # stage s+1 -> s, backward
    FEATURES = "feat"           # encoder rank -> stage 0
    FEATURE_GRAD = "feat_grad"  # stage 0 -> encoder rank
    WEIGHT_GRADS = "weight_grads"
    SAMPLES = "samples"         # grouped reordering's sample exchange


@dataclass(frozen=True, slots=True)
class Action:
    """One step of one rank. ``share`` is the fraction of a microbatch's encoder work."""

    kind: Kind
    microbatch: int = -1
    stage: int = -1
    peer: int = -1
    payload: Payload | None = None
    share: float = 1.0

    def __str__(self) -> str:
        if self.kind in (Kind.SEND, Kind.RECV):
            return f"{self.kind}({self.payload},mb={self.microbatch},peer={self.peer})"
        if self.kind in (Kind.ENC_FWD, Kind.ENC_BWD):
            return f"{self.kind}(mb={self.microbatch},share={self.share:.3g})"
        return f"{self.kind}(mb={self.microbatch},stage={self.stage})"


def message_key(rank: int, action: Action) -> tuple[str, int, int, int]:
    """(payload, microbatch, src, dst): what pairs a send with its receive."""
    if action.kind == Kind.SEND:
        return (str(action.payload), action.microbatch, rank, action.peer)
    if action.kind == Kind.RECV:
        return (str(action.payload), action.microbatch, action.peer, rank)
    raise ValueError(f"action: expected a SEND or RECV, got {action}")


@dataclass(frozen=True)
class Schedule:
    """Per-rank action lists of one step for one pipeline replica."""

    name: str
    num_stages: int
    num_microbatches: int
    stage_ranks: tuple[int, ...]
    encoder_ranks: tuple[int, ...]
    actions: tuple[tuple[Action, ...], ...]
    llm_in_flight_bound: tuple[int, ...]
    encoder_in_flight_bound: tuple[int, ...]

    @property
    def num_ranks(self) -> int:
        return len(self.actions)

    def stage_of(self, rank: int) -> int:
        """LLM stage hosted by ``rank``, or -1 for an encoder-only rank."""
        return self.stage_ranks.index(rank) if rank in self.stage_ranks else -1


def _check_sizes(num_stages: int, num_microbatches: int) -> None:
    _require(isinstance(num_stages, int) and num_stages >= 1, "num_stages", "an int >= 1",
             num_stages)
    _require(isinstance(num_microbatches, int) and num_microbatches >= 1, "num_microbatches",
             "an int >= 1", num_microbatches)


def one_f_one_b_order(num_stages: int, num_microbatches: int, stage: int) -> list[tuple[str, int]]:
    """('F', m) / ('B', m) order of one stage under 1F1B (PipeDream-flush)."""
    warmup = min(num_stages - stage - 1, num_microbatches)
    order = [("F", m) for m in range(warmup)]
    for i in range(num_microbatches - warmup):
        order += [("F", warmup + i), ("B", i)]
    order += [("B", m) for m in range(num_microbatches - warmup, num_microbatches)]
    return order


def _llm_forward(stage: int, num_stages: int, m: int, ranks: Sequence[int]) -> list[Action]:
    out = []
    if stage > 0:
        out.append(Action(Kind.RECV, m, stage, ranks[stage - 1], Payload.ACTIVATION))
    out.append(Action(Kind.LLM_FWD, m, stage))
    if stage < num_stages - 1:
        out.append(Action(Kind.SEND, m, stage, ranks[stage + 1], Payload.ACTIVATION))
    return out


def _llm_backward(stage: int, num_stages: int, m: int, ranks: Sequence[int]) -> list[Action]:
    out = []
    if stage < num_stages - 1:
        out.append(Action(Kind.RECV, m, stage, ranks[stage + 1], Payload.GRADIENT))
    out.append(Action(Kind.LLM_BWD, m, stage))
    if stage > 0:
        out.append(Action(Kind.SEND, m, stage, ranks[stage - 1], Payload.GRADIENT))
    return out


def _grad_sync(programs: list[list[Action]], grad_sync: bool) -> None:
    if grad_sync:
        for prog in programs:
            prog.append(Action(Kind.ALLREDUCE, payload=Payload.WEIGHT_GRADS))


def one_f_one_b(num_stages: int, num_microbatches: int, grad_sync: bool = False) -> Schedule:
    """LLM-only 1F1B over ``num_stages`` ranks (rank s hosts stage s)."""
    _check_sizes(num_stages, num_microbatches)
    ranks = tuple(range(num_stages))
    programs: list[list[Action]] = []
    for s in range(num_stages):
        prog: list[Action] = []
        for op, m in one_f_one_b_order(num_stages, num_microbatches, s):
            build = _llm_forward if op == "F" else _llm_backward
            prog += build(s, num_stages, m, ranks)
        programs.append(prog)
    _grad_sync(programs, grad_sync)
    bound = tuple(min(num_stages - s, num_microbatches) for s in range(num_stages))
    return Schedule("1f1b", num_stages, num_microbatches, ranks, (), _freeze(programs), bound,
                    (0,) * num_stages)


def encoder_first_stage(num_stages: int, num_microbatches: int,
                        grad_sync: bool = False) -> Schedule:
    """Megatron-like: stage 0 runs every microbatch's whole encoder forward and backward."""
    _check_sizes(num_stages, num_microbatches)
    ranks = tuple(range(num_stages))
    programs: list[list[Action]] = []
    for s in range(num_stages):
        prog: list[Action] = []
        for op, m in one_f_one_b_order(num_stages, num_microbatches, s):
            if op == "F":
                if s == 0:
                    prog.append(Action(Kind.ENC_FWD, m, 0, share=1.0))
                prog += _llm_forward(s, num_stages, m, ranks)
            else:
                prog += _llm_backward(s, num_stages, m, ranks)
                if s == 0:
                    prog.append(Action(Kind.ENC_BWD, m, 0, share=1.0))
        programs.append(prog)
    _grad_sync(programs, grad_sync)
    bound = tuple(min(num_stages - s, num_microbatches) for s in range(num_stages))
    enc_bound = (bound[0],) + (0,) * (num_stages - 1)
    return Schedule("encoder_first_stage", num_stages, num_microbatches, ranks, (0,),
                    _freeze(programs), bound, enc_bound)


def encoder_disaggregated(num_stages: int, num_microbatches: int, prefetch: int | None = None,
                          grad_sync: bool = False) -> Schedule:
    """DistMM-like: a separate encoder rank (index ``num_stages``) feeds stage 0.

    The encoder runs ``prefetch`` microbatches ahead (default: the pipeline depth, what stage 0
    consumes during warm-up), then alternates one forward ahead with one backward behind.
    """
    _check_sizes(num_stages, num_microbatches)
    prefetch = num_stages if prefetch is None else prefetch
    # Stage 0 runs F(0..P-1) before B(0) returns the first feature gradient: with fewer
    # features in flight the encoder would wait for B(0) while stage 0 waits for features.
    _require(prefetch >= max(1, num_stages - 1), "prefetch",
             f">= max(1, num_stages - 1) = {max(1, num_stages - 1)} (else it deadlocks)",
             prefetch)
    ranks = tuple(range(num_stages))
    enc = num_stages
    programs: list[list[Action]] = []
    for s in range(num_stages):
        prog: list[Action] = []
        for op, m in one_f_one_b_order(num_stages, num_microbatches, s):
            if op == "F":
                if s == 0:
                    prog.append(Action(Kind.RECV, m, 0, enc, Payload.FEATURES))
                prog += _llm_forward(s, num_stages, m, ranks)
            else:
                prog += _llm_backward(s, num_stages, m, ranks)
                if s == 0:
                    prog.append(Action(Kind.SEND, m, 0, enc, Payload.FEATURE_GRAD))
        programs.append(prog)
    eprog: list[Action] = []
    ahead = min(prefetch, num_microbatches)
    for m in range(ahead):
        eprog += [Action(Kind.ENC_FWD, m), Action(Kind.SEND, m, -1, 0, Payload.FEATURES)]
    for m in range(num_microbatches):
        if m + ahead < num_microbatches:
            eprog += [Action(Kind.ENC_FWD, m + ahead),
                      Action(Kind.SEND, m + ahead, -1, 0, Payload.FEATURES)]
        eprog += [Action(Kind.RECV, m, -1, 0, Payload.FEATURE_GRAD), Action(Kind.ENC_BWD, m)]
    programs.append(eprog)
    _grad_sync(programs, grad_sync)
    bound = tuple(min(num_stages - s, num_microbatches) for s in range(num_stages)) + (0,)
    enc_bound = (0,) * num_stages + (min(ahead + 1, num_microbatches),)
    return Schedule("encoder_disaggregated", num_stages, num_microbatches, ranks, (enc,),
                    _freeze(programs), bound, enc_bound)


def default_shares(num_stages: int, num_microbatches: int) -> list[list[float]]:
    """1/P of every microbatch per rank, except the last P microbatches, whose encoder work
    skips stage 0: their backwards can only run after stage 0's last LLM backwards, so a share
    on stage 0 would extend the step while the other ranks already idle in the drain."""
    p, n = num_stages, num_microbatches
    tail = [0.0] + [1.0 / (p - 1)] * (p - 1) if p > 1 else [1.0]
    return [[1.0 / p] * p if m < n - p else list(tail) for m in range(n)]


def uniform_insertion(num_stages: int, num_microbatches: int,
                      shares: Sequence[Sequence[float]] | None = None,
                      grad_sync: bool = False, sample_exchange: bool = False) -> Schedule:
    """Omni: each microbatch's encoder work is spread over the pipeline's ranks.

    ``shares[m][r]`` is rank r's fraction of microbatch m's encoder work (default:
    ``default_shares``; a zero share means no action and no message). Rank r computes
    encoder forward of m before its LLM forward of m-P (so features reach stage 0 before its
    F(m)) and encoder backward of m before its LLM forward of m+P (after stage 0's B(m)
    returned the feature gradients). The last P microbatches' encoder backwards run in the
    drain, after the rank's own B(m+r+1). ``sample_exchange`` starts every rank with the
    grouped-reordering all-to-all.
    """
    _check_sizes(num_stages, num_microbatches)
    p, n = num_stages, num_microbatches
    if shares is None:
        shares = default_shares(p, n)
    _require(len(shares) == n, "shares", f"{n} rows (one per microbatch)", len(shares))
    for m, row in enumerate(shares):
        _require(len(row) == p, f"shares[{m}]", f"{p} entries (one per stage)", len(row))
        _require(all(x >= 0 for x in row) and abs(sum(row) - 1.0) < 1e-6, f"shares[{m}]",
                 "non-negative entries summing to 1", list(row))
    ranks = tuple(range(p))

    def enc_fwd(r: int, m: int) -> list[Action]:
        if shares[m][r] <= 0:
            return []
        out = [Action(Kind.ENC_FWD, m, r, share=shares[m][r])]
        if r != 0:
            out.append(Action(Kind.SEND, m, r, 0, Payload.FEATURES, shares[m][r]))
        return out

    def enc_bwd(r: int, m: int) -> list[Action]:
        if shares[m][r] <= 0:
            return []
        out = []
        if r != 0:
            out.append(Action(Kind.RECV, m, r, 0, Payload.FEATURE_GRAD, shares[m][r]))
        return out + [Action(Kind.ENC_BWD, m, r, share=shares[m][r])]

    programs: list[list[Action]] = []
    for r in range(p):
        prog: list[Action] = []
        if sample_exchange:
            prog.append(Action(Kind.ALLTOALL, payload=Payload.SAMPLES))
        for m in range(min(p, n)):
            prog += enc_fwd(r, m)
        # Drain microbatches (no F(m+P) to ride on): encoder backward of m goes after this
        # rank's B(m+r+1), about when stage 0's B(m) has returned its feature gradients.
        drain = range(max(0, n - p), n)
        after_backward: dict[int, list[int]] = {}
        for m in drain:
            after_backward.setdefault(min(m + r + 1, n - 1), []).append(m)
        for op, m in one_f_one_b_order(p, n, r):
            if op == "F":
                if m - p >= 0:
                    prog += enc_bwd(r, m - p)
                if m + p < n:
                    prog += enc_fwd(r, m + p)
                if r == 0:
                    for src in range(1, p):
                        if shares[m][src] > 0:
                            prog.append(Action(Kind.RECV, m, 0, src, Payload.FEATURES,
                                               shares[m][src]))
                prog += _llm_forward(r, p, m, ranks)
            else:
                prog += _llm_backward(r, p, m, ranks)
                if r == 0:
                    for dst in range(1, p):
                        if shares[m][dst] > 0:
                            prog.append(Action(Kind.SEND, m, 0, dst, Payload.FEATURE_GRAD,
                                               shares[m][dst]))
                for pending in after_backward.pop(m, []):
                    prog += enc_bwd(r, pending)
        programs.append(prog)
    _grad_sync(programs, grad_sync)
    bound = tuple(min(p - s, n) for s in range(p))
    enc_bound = tuple(min(2 * p, n) for _ in range(p))
    return Schedule("uniform_insertion", p, n, ranks, ranks, _freeze(programs), bound, enc_bound)


def _freeze(programs: list[list[Action]]) -> tuple[tuple[Action, ...], ...]:
    return tuple(tuple(p) for p in programs)


BUILDERS = {
    "1f1b": one_f_one_b,
    "encoder_first_stage": encoder_first_stage,
    "encoder_disaggregated": encoder_disaggregated,
    "uniform_insertion": uniform_insertion,
}


class ScheduleError(ValueError):
    """A schedule that cannot run: unmatched messages, crossed order or a deadlock."""


def check_schedule(schedule: Schedule) -> None:
    """Raise ScheduleError unless messages match one-to-one, in the same order per channel
    (source, destination, payload), and the schedule runs to completion with blocking
    receives and buffered sends."""
    sends: dict[tuple[int, int, str], list[int]] = {}
    recvs: dict[tuple[int, int, str], list[int]] = {}
    for rank, prog in enumerate(schedule.actions):
        for a in prog:
            if a.kind in (Kind.SEND, Kind.RECV):
                _require(0 <= a.peer < schedule.num_ranks and a.peer != rank, "peer",
                         f"another rank in [0, {schedule.num_ranks})", (rank, str(a)))
                payload, mb, src, dst = message_key(rank, a)
                table = sends if a.kind == Kind.SEND else recvs
                table.setdefault((src, dst, payload), []).append(mb)
    for pair in set(sends) | set(recvs):
        s, r = sends.get(pair, []), recvs.get(pair, [])
        if s != r:
            raise ScheduleError(f"{pair[2]} messages {pair[0]}->{pair[1]}: sends for microbatches "
                                f"{s[:8]} and receives for {r[:8]} differ in content or order")
    # Execute in dependency order: progress proves the absence of a deadlock.
    posted: set[tuple[str, int, int, int]] = set()
    pcs = [0] * schedule.num_ranks
    progressed = True
    while progressed:
        progressed = False
        for rank, prog in enumerate(schedule.actions):
            while pcs[rank] < len(prog):
                a = prog[pcs[rank]]
                if a.kind == Kind.RECV and message_key(rank, a) not in posted:
                    break
                if a.kind == Kind.SEND:
                    posted.add(message_key(rank, a))
                pcs[rank] += 1
                progressed = True
    stuck = [(r, str(schedule.actions[r][pc])) for r, pc in enumerate(pcs)
             if pc < len(schedule.actions[r])]
    if stuck:
        raise ScheduleError(f"deadlock: ranks blocked at {stuck}")


def max_in_flight(schedule: Schedule) -> tuple[list[int], list[int]]:
    """Per rank, the largest number of microbatches whose LLM (resp. encoder) activations are
    held at once: forward done, backward not yet."""
    llm, enc = [], []
    for prog in schedule.actions:
        live = {Kind.LLM_FWD: 0, Kind.ENC_FWD: 0}
        peak = {Kind.LLM_FWD: 0, Kind.ENC_FWD: 0}
        for a in prog:
            if a.kind in (Kind.LLM_FWD, Kind.ENC_FWD):
                live[a.kind] += 1
                peak[a.kind] = max(peak[a.kind], live[a.kind])
            elif a.kind == Kind.LLM_BWD:
                live[Kind.LLM_FWD] -= 1
            elif a.kind == Kind.ENC_BWD:
                live[Kind.ENC_FWD] -= 1
        llm.append(peak[Kind.LLM_FWD])
        enc.append(peak[Kind.ENC_FWD])
    return llm, enc
