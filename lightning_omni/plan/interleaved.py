"""Interleaved (virtual-stage) pipelines: Megatron-LM's interleaved 1F1B in the plan IR.

Each of the ``P`` LLM ranks holds ``v`` model chunks; virtual stage ``k = c * P + r`` is chunk
``c`` of rank ``r``, so a microbatch crosses the ranks ``v`` times (a pipeline of depth
``P * v``). The bubble shrinks to about ``(P - 1) / (v * m)`` of the step for ``m``
microbatches, at the price of ``v`` times as many activation / gradient messages and a longer
warm-up (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", sec. 2.2.2). Megatron-LM runs the microbatches in groups of ``P`` (one
group through every chunk before the next group), so ``m`` must be a multiple of ``P``.

The order of a rank (``interleaved_order``) follows Megatron-LM's
``forward_backward_pipelining_with_interleaving``: forward number ``k`` runs chunk
``(k mod P*v) // P`` of microbatch ``(k // (P*v)) * P + k mod P``; backwards visit the chunks
in reverse; rank ``r`` warms up with ``2 (P - r - 1) + (v - 1) P`` forwards, then alternates one
forward and one backward, then drains.

Encoder work is placed by the existing builders of ``schedule.py`` (each system's own rule):
``interleave`` takes a plain (``v = 1``) schedule and re-threads its LLM work into the
interleaved order. An encoder action stays tied to the LLM action it was tied to: what feeds
stage 0's forward of microbatch ``m`` runs before its first chunk's forward of ``m``, what
follows a backward of ``m`` runs after the last chunk's (chunk 0's) backward of ``m``. A rank's
encoder backward of ``m`` waits for the feature gradients stage 0 returns after its chunk-0
backward of ``m``; it is placed after that rank's own chunk-0 backward of ``m`` and ``r + 1``
further backwards (about when stage 0's gradients arrive), never earlier: with the interleaved
order's longer warm-up, the plain builder's "``P`` microbatches later" would deadlock.
"""

from __future__ import annotations

from collections.abc import Sequence

from lightning_omnilab.validate import positive_int

from .costs import _require
from .schedule import (
    BUILDERS,
    Action,
    Kind,
    Payload,
    Schedule,
    max_in_flight,
    one_f_one_b_order,
)

_LLM_MESSAGES = (Payload.ACTIVATION, Payload.GRADIENT)


def check_interleaving(num_stages: int, num_microbatches: int, num_chunks: int,
                       layers: int | None = None, *,
                       names: tuple[str, str, str] = ("num_stages", "num_microbatches",
                                                      "num_chunks")) -> None:
    """Raise ValueError unless ``num_chunks`` model chunks per rank can run: Megatron-LM's
    interleaved schedule needs at least 2 stages, microbatches in groups of ``num_stages``
    and (with ``layers``) an equal number of layers in every chunk. ``names``: what the
    caller calls the first three arguments (the messages name them)."""
    stages, micro, chunks = names
    positive_int(chunks, num_chunks)
    positive_int(stages, num_stages)
    positive_int(micro, num_microbatches)
    if num_chunks == 1:
        return
    _require(num_stages >= 2, stages,
             f">= 2 for {chunks}={num_chunks} model chunks per rank (one stage has nothing to "
             "interleave)", num_stages)
    _require(num_microbatches % num_stages == 0, micro,
             f"a multiple of {stages}={num_stages} for an interleaved schedule (Megatron-LM "
             f"runs microbatches in groups of {stages})", num_microbatches)
    if layers is not None:
        _require(layers % (num_stages * num_chunks) == 0, "layers",
                 f"divisible by {stages} * {chunks} = {num_stages * num_chunks} (equal "
                 "model chunks)", layers)


def warmup_forwards(num_stages: int, num_microbatches: int, stage: int, num_chunks: int) -> int:
    """Forwards rank ``stage`` runs before its first backward (Megatron-LM's count)."""
    total = num_microbatches * num_chunks
    if num_chunks == 1:
        return min(num_stages - stage - 1, total)
    return min(2 * (num_stages - stage - 1) + (num_chunks - 1) * num_stages, total)


def interleaved_order(num_stages: int, num_microbatches: int, stage: int,
                      num_chunks: int) -> list[tuple[str, int, int]]:
    """('F' | 'B', microbatch, chunk) order of one rank; ``num_chunks == 1`` is plain 1F1B."""
    check_interleaving(num_stages, num_microbatches, num_chunks)
    _require(0 <= stage < num_stages, "stage", f"in [0, {num_stages})", stage)
    pp, vpp = num_stages, num_chunks
    if vpp == 1:
        return [(op, m, 0) for op, m in one_f_one_b_order(pp, num_microbatches, stage)]

    def nth(k: int, backward: bool) -> tuple[int, int]:
        group, pos = divmod(k, pp * vpp)
        chunk = pos // pp
        return group * pp + pos % pp, (vpp - 1 - chunk) if backward else chunk

    total = num_microbatches * vpp
    warm = warmup_forwards(pp, num_microbatches, stage, vpp)
    order = [("F", *nth(k, False)) for k in range(warm)]
    for i in range(total - warm):
        order += [("F", *nth(warm + i, False)), ("B", *nth(i, True))]
    order += [("B", *nth(k, True)) for k in range(total - warm, total)]
    return order


def _llm_block(op: str, m: int, chunk: int, rank: int, pp: int, vpp: int,
               ranks: Sequence[int]) -> list[Action]:
    """RECV, compute and SEND of one chunk; ``stage`` is the virtual stage, a message's
    ``chunk`` the chunk of the lower virtual stage of the boundary it crosses."""
    k, last = chunk * pp + rank, pp * vpp - 1
    out: list[Action] = []
    if op == "F":
        if k > 0:
            out.append(Action(Kind.RECV, m, k, ranks[(k - 1) % pp], Payload.ACTIVATION,
                              chunk=(k - 1) // pp))
        out.append(Action(Kind.LLM_FWD, m, k))
        if k < last:
            out.append(Action(Kind.SEND, m, k, ranks[(k + 1) % pp], Payload.ACTIVATION,
                              chunk=k // pp))
    else:
        if k < last:
            out.append(Action(Kind.RECV, m, k, ranks[(k + 1) % pp], Payload.GRADIENT,
                              chunk=k // pp))
        out.append(Action(Kind.LLM_BWD, m, k))
        if k > 0:
            out.append(Action(Kind.SEND, m, k, ranks[(k - 1) % pp], Payload.GRADIENT,
                              chunk=(k - 1) // pp))
    return out


def _is_llm(a: Action) -> bool:
    return a.kind in (Kind.LLM_FWD, Kind.LLM_BWD) or (
        a.kind in (Kind.SEND, Kind.RECV) and a.payload in _LLM_MESSAGES)


def _split(prog: Sequence[Action]) -> tuple[list[tuple[str, int]], list[list[Action]]]:
    """A plain rank program as its LLM ops and the other actions between them:
    ``gaps[g]`` runs after ``g`` LLM ops."""
    ops: list[tuple[str, int]] = []
    gaps: list[list[Action]] = [[]]
    for a in prog:
        if a.kind in (Kind.LLM_FWD, Kind.LLM_BWD):
            ops.append(("F" if a.kind == Kind.LLM_FWD else "B", a.microbatch))
            gaps.append([])
        elif not _is_llm(a):
            gaps[-1].append(a)
    return ops, gaps


def _rethread(prog: Sequence[Action], rank: int, pp: int, n: int, vpp: int,
              ranks: Sequence[int]) -> list[Action]:
    ops, gaps = _split(prog)
    _require(sorted(ops) == sorted([("F", m) for m in range(n)] + [("B", m) for m in range(n)]),
             "schedule", f"rank {rank} running each microbatch's forward and backward once",
             ops[:8])
    before: dict[tuple[str, int], list[Action]] = {}  # runs before F(m) of chunk 0
    after: dict[tuple[str, int], list[Action]] = {}   # runs after op of chunk 0
    backward_wait: list[tuple[int, Action]] = []      # (microbatch, action): see module doc
    for g, gap in enumerate(gaps):
        prev = ops[g - 1] if g > 0 else None
        nxt = ops[g] if g < len(ops) else None
        for a in gap:
            if a.kind == Kind.ENC_BWD or (a.kind == Kind.RECV
                                          and a.payload == Payload.FEATURE_GRAD):
                backward_wait.append((a.microbatch, a))
            elif nxt is not None and nxt[0] == "F" and not (
                    prev is not None and prev[0] == "B" and a.microbatch == prev[1]):
                before.setdefault(nxt, []).append(a)
            else:
                after.setdefault(prev if prev is not None else nxt, []).append(a)
    order = interleaved_order(pp, n, rank, vpp)
    backs = [(m, c) for op, m, c in order if op == "B"]
    at_back = {mc: i for i, mc in enumerate(backs)}
    delay = 0 if rank == ranks[0] else ranks.index(rank) + 1
    pending: dict[int, list[Action]] = {}
    for m, a in backward_wait:
        pending.setdefault(min(at_back[m, 0] + delay, len(backs) - 1), []).append(a)
    out: list[Action] = []
    b_seen = 0
    for op, m, c in order:
        if op == "F" and c == 0:
            out += before.pop((op, m), [])
        out += _llm_block(op, m, c, ranks.index(rank), pp, vpp, ranks)
        if c == 0:
            out += after.pop((op, m), [])
        if op == "B":
            out += pending.pop(b_seen, [])
            b_seen += 1
    return out


def interleave(base: Schedule, num_chunks: int) -> Schedule:
    """``base`` (a plain single-replica schedule from ``schedule.BUILDERS``) with ``num_chunks``
    model chunks per LLM rank; its encoder placement is kept (see the module docstring).
    ``num_chunks == 1`` returns ``base`` itself."""
    _require(isinstance(base, Schedule), "base", "a Schedule", type(base).__name__)
    check_interleaving(base.num_stages, base.num_microbatches, num_chunks)
    if num_chunks == 1:
        return base
    _require(base.num_replicas == 1 and base.num_chunks == 1, "base",
             "a plain single-replica schedule (interleave before for_replicas)",
             (base.num_replicas, base.num_chunks))
    _require(all(a.kind != Kind.WAIT for prog in base.actions for a in prog), "base",
             "a schedule without WAIT actions (add completion points after interleaving)",
             base.name)
    pp, n, vpp = base.num_stages, base.num_microbatches, num_chunks
    ranks = base.stage_ranks
    programs = [tuple(_rethread(prog, r, pp, n, vpp, ranks)) if r in ranks else prog
                for r, prog in enumerate(base.actions)]
    sched = Schedule(f"{base.name}+vpp{vpp}", pp, n, ranks, base.encoder_ranks, tuple(programs),
                     (), (), 1, vpp)
    llm, enc = max_in_flight(sched)
    return Schedule(sched.name, pp, n, ranks, base.encoder_ranks, sched.actions,
                    tuple(llm[r] for r in ranks) + tuple(0 for r in range(len(programs))
                                                        if r not in ranks),
                    tuple(enc), 1, vpp)


def disaggregated_prefetch(num_stages: int, num_microbatches: int, num_chunks: int) -> int:
    """How many microbatches a disaggregated encoder must run ahead of stage 0 so that it
    never waits for a feature gradient that needs features it has not sent: the most
    microbatches stage 0 forwards (chunk 0) beyond ``m`` before its chunk-0 backward of
    ``m``."""
    pp = num_stages
    order = interleaved_order(pp, num_microbatches, 0, num_chunks)
    ahead, seen = max(1, pp - 1), -1
    for op, m, c in order:
        if op == "F" and c == 0:
            seen = max(seen, m)
        elif op == "B" and c == 0:
            ahead = max(ahead, seen - m)
    return max(ahead, pp)


def build_interleaved(name: str, num_stages: int, num_microbatches: int, num_chunks: int,
                      **kwargs) -> Schedule:
    """``schedule.BUILDERS[name](num_stages, num_microbatches, **kwargs)`` with ``num_chunks``
    model chunks per rank. A disaggregated encoder's prefetch defaults to what the
    interleaved order needs (``disaggregated_prefetch``)."""
    _require(name in BUILDERS, "name", f"one of {sorted(BUILDERS)}", name)
    check_interleaving(num_stages, num_microbatches, num_chunks)
    if name == "encoder_disaggregated" and kwargs.get("prefetch") is None:
        kwargs["prefetch"] = disaggregated_prefetch(num_stages, num_microbatches, num_chunks)
    return interleave(BUILDERS[name](num_stages, num_microbatches, **kwargs), num_chunks)


def first_microbatches(plan: Schedule, num_microbatches: int) -> Schedule:
    """A forward-only ``plan`` (``schedule.forward_only``) keeping only its first
    ``num_microbatches`` microbatches. An evaluation batch may not split into a multiple of
    ``num_stages`` microbatches, which the interleaved order needs: the runtime plans the next
    multiple (the extra microbatches empty) and drops them here. In a forward-only plan whose
    collectives each belong to one microbatch (the encoder group actions of
    ``lssp_schedule``), every block waits on actions of the same microbatch: a RECV on its
    SEND, a WAIT on its RECV, a collective on its group's members' matching ones (dropped on
    every member alike). So a run of the whole plan, less the dropped microbatches' actions,
    is a run of the rest."""
    _require(isinstance(plan, Schedule), "plan", "a Schedule", type(plan).__name__)
    positive_int("num_microbatches", num_microbatches)
    _require(num_microbatches <= plan.num_microbatches, "num_microbatches",
             f"at most the plan's {plan.num_microbatches}", num_microbatches)
    bad = sorted({str(a) for prog in plan.actions for a in prog
                  if a.kind in (Kind.LLM_BWD, Kind.ENC_BWD)
                  or (a.kind in (Kind.ALLREDUCE, Kind.ALLTOALL) and a.microbatch < 0)})
    _require(not bad, "plan", "a forward-only plan whose collectives each belong to one "
             "microbatch", bad[:4])
    programs = tuple(tuple(a for a in prog if a.microbatch < num_microbatches)
                     for prog in plan.actions)
    return Schedule(plan.name, plan.num_stages, num_microbatches, plan.stage_ranks,
                    plan.encoder_ranks, programs, plan.llm_in_flight_bound,
                    plan.encoder_in_flight_bound, plan.num_replicas, plan.num_chunks)
