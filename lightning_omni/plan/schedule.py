"""Schedule IR: per rank, the ordered actions of one training step.

A schedule is plain data. The simulator executes it and the runtime (``lightning_omni.runtime``)
executes it, so one list is both the prediction and the plan. A SEND posts a non-blocking send
(isend); a RECV blocks until its message is there; a WAIT is the completion point of one of the
rank's earlier sends: it blocks until the receiver has taken the message, and only then is the
send buffer free (``with_completion_points`` places them). A schedule is valid when every receive
has exactly one matching send, messages of one payload between two ranks are posted in the same
order on both sides, it runs to completion, and it also runs when messages carry no tags and
each pair of ranks posts them in one order (``plan.messages.check_schedule`` verifies all).

What the runtime needs beyond the order of actions, and where it is:

- which samples' encoder work a rank does: ``Action.samples`` on ENC_FWD / ENC_BWD and on the
  FEATURES / FEATURE_GRAD messages (indices into the microbatch, ascending);
- receive shapes: every rank of a replica holds that replica's microbatches, so a message's shape
  is a function of the plan and the batch: ACTIVATION and GRADIENT carry the packed microbatch
  ``[samples, tokens, hidden]``; FEATURES and FEATURE_GRAD carry, per modality in order, the
  feature rows of ``samples`` (those that have the modality), sample by sample. Stage 0 scatters
  them into its packed sequence at the modality's placeholder tokens, in sample order;
- collectives name their ranks: ``Action.group``; ALLTOALL's ``counts`` lists what this rank
  sends to each group member;
- plans for all data-parallel replicas: ``for_replicas`` joins one schedule per replica.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from lightning_omnilab.validate import non_negative_int, positive_int

from .actions import COLLECTIVE_KINDS as COLLECTIVE_KINDS  # re-exported: the IR's vocabulary
from .actions import COMPUTE_KINDS, Action, Kind, Payload, message_key
from .costs import _require
from .execution import ScheduleError as ScheduleError
from .execution import execute_order

# the encoder placements the runtime runs: stage 0 encodes everything (Megatron-like), or the
# encoder work spread over every stage (Omni)
SCHEDULES = ("encoder_first_stage", "uniform_insertion")


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
    num_replicas: int = 1  # data-parallel replicas in ``actions`` (see ``for_replicas``)
    num_chunks: int = 1  # model chunks per LLM rank (virtual pipeline stages; interleaved.py)

    @property
    def num_ranks(self) -> int:
        return len(self.actions)

    def stage_of(self, rank: int) -> int:
        """LLM stage hosted by ``rank``, or -1 for an encoder-only rank."""
        if rank not in self.stage_ranks:
            return -1
        return self.stage_ranks.index(rank) % self.num_stages

    def replica_of(self, rank: int) -> int:
        """Data-parallel replica ``rank`` belongs to (ranks are numbered replica by replica)."""
        return rank // (self.num_ranks // self.num_replicas)


def _check_sizes(num_stages: int, num_microbatches: int) -> None:
    positive_int("num_stages", num_stages)
    positive_int("num_microbatches", num_microbatches)


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


def encoder_first_stage(num_stages: int, num_microbatches: int, grad_sync: bool = False,
                        samples: Sequence[Sequence[int]] | None = None) -> Schedule:
    """Megatron-like: stage 0 runs every microbatch's whole encoder forward and backward.

    ``samples[m]``: the samples of microbatch m with encoder input (a microbatch without any
    gets no encoder actions); None: every microbatch has encoder work, samples unspecified."""
    _check_sizes(num_stages, num_microbatches)
    if samples is not None:
        _require(len(samples) == num_microbatches, "samples",
                 f"{num_microbatches} rows (one per microbatch)", len(samples))
    ranks = tuple(range(num_stages))
    programs: list[list[Action]] = []
    for s in range(num_stages):
        prog: list[Action] = []
        for op, m in one_f_one_b_order(num_stages, num_microbatches, s):
            work = samples is None or len(samples[m]) > 0
            mine = tuple(samples[m]) if samples is not None else ()
            if op == "F":
                if s == 0 and work:
                    prog.append(Action(Kind.ENC_FWD, m, 0, share=1.0, samples=mine))
                prog += _llm_forward(s, num_stages, m, ranks)
            else:
                prog += _llm_backward(s, num_stages, m, ranks)
                if s == 0 and work:
                    prog.append(Action(Kind.ENC_BWD, m, 0, share=1.0, samples=mine))
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
    pp, n = num_stages, num_microbatches
    tail = [0.0] + [1.0 / (pp - 1)] * (pp - 1) if pp > 1 else [1.0]
    return [[1.0 / pp] * pp if m < n - pp else list(tail) for m in range(n)]


def assign_encoder_samples(sample_costs: Sequence[Sequence[float]], num_stages: int,
                           skip_stage0_drain: bool = True,
                           ) -> tuple[list[list[tuple[int, ...]]], list[list[float]]]:
    """Which samples' encoder work each rank of a pipeline does, and the resulting shares.

    ``sample_costs[m][i]`` is sample i of microbatch m's encoder cost (0: no encoder input).
    Longest-processing-time first over the ranks; with ``skip_stage0_drain`` the last
    ``num_stages`` microbatches skip stage 0 (see ``default_shares``; with
    ``uniform_insertion(inline_stage0=True)`` stage 0 need not skip them). Returns
    ``(samples, shares)`` for ``uniform_insertion``; a microbatch without encoder work gets
    empty sample tuples and zero shares.
    """
    positive_int("num_stages", num_stages)
    pp, n = num_stages, len(sample_costs)
    samples: list[list[tuple[int, ...]]] = []
    shares: list[list[float]] = []
    for m, costs in enumerate(sample_costs):
        _require(all(c >= 0 for c in costs), f"sample_costs[{m}]", "non-negative costs",
                 list(costs))
        skip = skip_stage0_drain and pp > 1 and m >= n - pp
        ranks = list(range(1, pp)) if skip else list(range(pp))
        load = dict.fromkeys(ranks, 0.0)
        picked: dict[int, list[int]] = {r: [] for r in ranks}
        for i in sorted((i for i, c in enumerate(costs) if c > 0), key=lambda i: (-costs[i], i)):
            r = min(ranks, key=lambda r: (load[r], r))
            load[r] += costs[i]
            picked[r].append(i)
        total = sum(load.values())
        samples.append([tuple(sorted(picked.get(r, []))) for r in range(pp)])
        shares.append([load.get(r, 0.0) / total if total else 0.0 for r in range(pp)])
    return samples, shares


class EncoderTiming(str, Enum):  # noqa: UP042 - requires-python allows 3.10 (no StrEnum)
    """Where a rank's encoder work of microbatch m sits in its 1F1B program."""

    # forward of m before the rank's F(m-P), so the features reach stage 0 before its F(m);
    # backward of m before F(m+P), after stage 0's B(m) returned the feature gradients; the
    # last P microbatches' backwards in the drain, after the rank's own B(m+r+1)
    AHEAD = "ahead"
    # forward of m right before F(m), backward right after B(m): stage 0's own share needs
    # no message, so it need not run ahead (and holds about half the encoder activations)
    INLINE = "inline"


@dataclass(frozen=True)
class _EncoderWork:
    """Who encodes what: ``shares[m][r]`` is rank r's fraction of microbatch m's encoder work,
    ``samples[m][r]`` (if given) the samples behind it. A rank acts where it has samples (or,
    without samples, a positive share), and only there are feature messages."""

    num_stages: int
    shares: Sequence[Sequence[float]]
    samples: Sequence[Sequence[Sequence[int]]] | None

    def works(self, r: int, m: int) -> bool:
        return bool(self.samples[m][r]) if self.samples is not None else self.shares[m][r] > 0

    def mine(self, r: int, m: int) -> tuple[int, ...]:
        return tuple(self.samples[m][r]) if self.samples is not None else ()

    def forward(self, r: int, m: int) -> list[Action]:
        """Rank r's encoder forward of m and, off stage 0, its features to stage 0."""
        if not self.works(r, m):
            return []
        share, mine = self.shares[m][r], self.mine(r, m)
        out = [Action(Kind.ENC_FWD, m, r, share=share, samples=mine)]
        if r != 0:
            out.append(Action(Kind.SEND, m, r, 0, Payload.FEATURES, share, mine))
        return out

    def backward(self, r: int, m: int) -> list[Action]:
        """Rank r's encoder backward of m, after (off stage 0) its feature gradients."""
        if not self.works(r, m):
            return []
        share, mine = self.shares[m][r], self.mine(r, m)
        out = []
        if r != 0:
            out.append(Action(Kind.RECV, m, r, 0, Payload.FEATURE_GRAD, share, mine))
        return out + [Action(Kind.ENC_BWD, m, r, share=share, samples=mine)]

    def stage0_messages(self, kind: Kind, payload: Payload, m: int) -> list[Action]:
        """Stage 0's receives of m's features (or sends of their gradients), rank by rank."""
        return [Action(kind, m, 0, peer, payload, self.shares[m][peer], self.mine(peer, m))
                for peer in range(1, self.num_stages) if self.works(peer, m)]


def _encoder_work(num_stages: int, num_microbatches: int,
                  shares: Sequence[Sequence[float]] | None,
                  samples: Sequence[Sequence[Sequence[int]]] | None) -> _EncoderWork:
    """Check ``shares`` and ``samples`` (see ``uniform_insertion``); derive shares from sample
    counts where only samples are given, else default to ``default_shares``."""
    pp, n = num_stages, num_microbatches
    if samples is not None:
        _require(len(samples) == n, "samples", f"{n} rows (one per microbatch)", len(samples))
        for m, row in enumerate(samples):
            _require(len(row) == pp, f"samples[{m}]", f"{pp} entries (one per stage)", len(row))
        if shares is None:
            counts = [[len(x) for x in row] for row in samples]
            shares = [[c / sum(row) if sum(row) else 0.0 for c in row] for row in counts]
    if shares is None:
        shares = default_shares(pp, n)
    _require(len(shares) == n, "shares", f"{n} rows (one per microbatch)", len(shares))
    for m, row in enumerate(shares):
        _require(len(row) == pp, f"shares[{m}]", f"{pp} entries (one per stage)", len(row))
        empty = samples is not None and not any(samples[m])
        _require(all(x >= 0 for x in row) and (empty or abs(sum(row) - 1.0) < 1e-6),
                 f"shares[{m}]", "non-negative entries summing to 1", list(row))
    return _EncoderWork(pp, shares, samples)


def _insertion_program(r: int, num_microbatches: int, work: _EncoderWork,
                       timing: EncoderTiming, sample_exchange: bool) -> list[Action]:
    """Rank r's 1F1B program with its encoder work inserted as ``timing`` says."""
    pp, n = work.num_stages, num_microbatches
    ranks = tuple(range(pp))
    prog: list[Action] = []
    if sample_exchange:
        prog.append(Action(Kind.ALLTOALL, payload=Payload.SAMPLES))
    # microbatch whose LLM backward each encoder backward follows (the rest ride on an F)
    after_backward: dict[int, list[int]] = {}
    if timing is EncoderTiming.INLINE:
        after_backward = {m: [m] for m in range(n)}
    else:
        for m in range(min(pp, n)):
            prog += work.forward(r, m)
        # drain microbatches (no F(m+P) to ride on): after this rank's B(m+r+1), about when
        # stage 0's B(m) has returned its feature gradients
        for m in range(max(0, n - pp), n):
            after_backward.setdefault(min(m + r + 1, n - 1), []).append(m)
    for op, m in one_f_one_b_order(pp, n, r):
        if op == "F":
            if timing is EncoderTiming.INLINE:
                prog += work.forward(r, m)
            else:
                if m - pp >= 0:
                    prog += work.backward(r, m - pp)
                if m + pp < n:
                    prog += work.forward(r, m + pp)
            if r == 0:
                prog += work.stage0_messages(Kind.RECV, Payload.FEATURES, m)
            prog += _llm_forward(r, pp, m, ranks)
        else:
            prog += _llm_backward(r, pp, m, ranks)
            if r == 0:
                prog += work.stage0_messages(Kind.SEND, Payload.FEATURE_GRAD, m)
            for pending in after_backward.pop(m, []):
                prog += work.backward(r, pending)
    return prog


def uniform_insertion(num_stages: int, num_microbatches: int,
                      shares: Sequence[Sequence[float]] | None = None,
                      grad_sync: bool = False, sample_exchange: bool = False,
                      samples: Sequence[Sequence[Sequence[int]]] | None = None,
                      inline_stage0: bool = False) -> Schedule:
    """Omni: each microbatch's encoder work is spread over the pipeline's ranks.

    ``shares[m][r]`` is rank r's fraction of microbatch m's encoder work (default:
    ``default_shares``; a zero share means no action and no message). ``samples[m][r]`` names
    the samples behind that share (``assign_encoder_samples`` makes both); with ``samples`` a
    rank acts only where it has samples, so a microbatch without encoder input has no encoder
    actions and no feature messages. Every rank places its work ``EncoderTiming.AHEAD``,
    except stage 0 with ``inline_stage0`` (``EncoderTiming.INLINE``). ``sample_exchange``
    starts every rank with the grouped-reordering all-to-all.
    """
    _check_sizes(num_stages, num_microbatches)
    pp, n = num_stages, num_microbatches
    work = _encoder_work(pp, n, shares, samples)
    programs = [_insertion_program(
        r, n, work, EncoderTiming.INLINE if inline_stage0 and r == 0 else EncoderTiming.AHEAD,
        sample_exchange) for r in range(pp)]
    _grad_sync(programs, grad_sync)
    ranks = tuple(range(pp))
    bound = tuple(min(pp - s, n) for s in range(pp))
    enc_bound = tuple(bound[0] if inline_stage0 and r == 0 else min(2 * pp, n)
                      for r in range(pp))
    return Schedule("uniform_insertion", pp, n, ranks, ranks, _freeze(programs), bound, enc_bound)


def _freeze(programs: list[list[Action]]) -> tuple[tuple[Action, ...], ...]:
    return tuple(tuple(prog) for prog in programs)


BUILDERS = {
    "1f1b": one_f_one_b,
    "encoder_first_stage": encoder_first_stage,
    "encoder_disaggregated": encoder_disaggregated,
    "uniform_insertion": uniform_insertion,
}


def with_completion_points(schedule: Schedule, lag: int = 1) -> Schedule:
    """Give every SEND a WAIT: after the sender's next ``lag`` compute actions, or later where
    that would deadlock (a WAIT blocks until the receiver takes the message), at the latest at
    the end of the program. Sends that already have a WAIT keep it."""
    non_negative_int("lag", lag)
    programs = [list(p) for p in schedule.actions]
    # per rank: index of the action each send's wait goes *before* (len(prog): at the end)
    places: list[dict[tuple, int]] = []
    for rank, prog in enumerate(programs):
        waited = {message_key(rank, a) for a in prog if a.kind == Kind.WAIT}
        where: dict[tuple, int] = {}
        for i, a in enumerate(prog):
            if a.kind != Kind.SEND or message_key(rank, a) in waited:
                continue
            seen, j = 0, i + 1
            while j < len(prog) and seen < lag:
                seen += prog[j].kind in COMPUTE_KINDS
                j += 1
            where[message_key(rank, a)] = j
        places.append(where)

    def build() -> Schedule:
        out = []
        for rank, prog in enumerate(programs):
            at: dict[int, list[Action]] = {}
            for a in prog:
                if a.kind == Kind.SEND and message_key(rank, a) in places[rank]:
                    at.setdefault(places[rank][message_key(rank, a)], []).append(
                        Action(Kind.WAIT, a.microbatch, a.stage, a.peer, a.payload,
                               chunk=a.chunk))
            new: list[Action] = []
            for i in range(len(prog) + 1):
                new += at.get(i, [])
                if i < len(prog):
                    new.append(prog[i])
            out.append(tuple(new))
        return _replace_actions(schedule, tuple(out))

    while True:
        candidate = build()
        stuck = execute_order(candidate.actions)
        moved = False
        for rank, pc in stuck:
            a = candidate.actions[rank][pc]
            if a.kind == Kind.WAIT and places[rank][message_key(rank, a)] < len(programs[rank]):
                places[rank][message_key(rank, a)] = len(programs[rank])
                moved = True
        if not stuck or not moved:
            return candidate


def _replace_actions(schedule: Schedule, actions: tuple[tuple[Action, ...], ...]) -> Schedule:
    return Schedule(schedule.name, schedule.num_stages, schedule.num_microbatches,
                    schedule.stage_ranks, schedule.encoder_ranks, actions,
                    schedule.llm_in_flight_bound, schedule.encoder_in_flight_bound,
                    schedule.num_replicas, schedule.num_chunks)


def for_replicas(replicas: Sequence[Schedule]) -> Schedule:
    """One schedule for all data-parallel replicas: replica d's ranks become
    ``d * R + r`` (R ranks per replica) and the gradient all-reduces name their groups: LLM
    stage gradients over the ranks hosting that stage, encoder gradients over every rank that
    holds an encoder replica. The replicas' own ALLREDUCE actions are replaced; an ALLTOALL
    (sample exchange) gets the group of same-position ranks. Replicas may differ in their
    encoder placement (each is built from its own data) but not in shape."""
    _require(len(replicas) >= 1, "replicas", "at least one schedule", len(replicas))
    first = replicas[0]
    for d, rep in enumerate(replicas):
        _require(rep.num_replicas == 1, f"replicas[{d}].num_replicas", "1", rep.num_replicas)
        same = (rep.num_stages, rep.num_ranks, rep.stage_ranks, rep.encoder_ranks)
        _require(same == (first.num_stages, first.num_ranks, first.stage_ranks,
                          first.encoder_ranks), f"replicas[{d}]",
                 "the shape (stages, ranks, encoder ranks) of replicas[0]", rep.name)
    n_rep, per = len(replicas), first.num_ranks
    enc_group = tuple(d * per + r for d in range(n_rep) for r in first.encoder_ranks)
    programs: list[tuple[Action, ...]] = []
    for d, rep in enumerate(replicas):
        for r, prog in enumerate(rep.actions):
            new: list[Action] = []
            for a in prog:
                if a.kind == Kind.ALLREDUCE:
                    continue
                if a.kind == Kind.ALLTOALL:
                    new.append(Action(a.kind, a.microbatch, a.stage, a.peer, a.payload,
                                      a.share, a.samples,
                                      tuple(e * per + r for e in range(n_rep)), a.counts))
                elif a.kind in (Kind.SEND, Kind.RECV, Kind.WAIT):
                    new.append(Action(a.kind, a.microbatch, a.stage, d * per + a.peer,
                                      a.payload, a.share, a.samples, chunk=a.chunk))
                else:
                    new.append(a)
            if r in first.stage_ranks:
                new.append(Action(Kind.ALLREDUCE, payload=Payload.WEIGHT_GRADS,
                                  stage=first.stage_ranks.index(r),
                                  group=tuple(e * per + r for e in range(n_rep))))
            if r in first.encoder_ranks:
                new.append(Action(Kind.ALLREDUCE, payload=Payload.ENCODER_GRADS,
                                  group=enc_group))
            programs.append(tuple(new))
    stage_ranks = tuple(d * per + r for d in range(n_rep) for r in first.stage_ranks)
    return Schedule(first.name, first.num_stages, first.num_microbatches, stage_ranks,
                    enc_group, tuple(programs), first.llm_in_flight_bound * n_rep,
                    first.encoder_in_flight_bound * n_rep, n_rep, first.num_chunks)


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


BACKWARD_PAYLOADS = frozenset({Payload.GRADIENT, Payload.FEATURE_GRAD})


def forward_only(schedule: Schedule) -> Schedule:
    """The same plan without its backward half (validation, test, predict): no backward
    compute, no gradient messages, no gradient all-reduces; completion points placed anew
    (one compute action after each send, later where that would deadlock)."""
    programs = []
    for prog in schedule.actions:
        programs.append(tuple(
            a for a in prog
            if a.kind not in (Kind.LLM_BWD, Kind.ENC_BWD, Kind.ALLREDUCE, Kind.WAIT)
            and not (a.kind in (Kind.SEND, Kind.RECV) and a.payload in BACKWARD_PAYLOADS)))
    return with_completion_points(_replace_actions(schedule, tuple(programs)))
