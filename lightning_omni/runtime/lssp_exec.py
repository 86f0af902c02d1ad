"""LSSP at run time: one microbatch's encoder work on one group of ranks, as ``plan_lssp`` says.

Short samples run data parallel (each whole on one rank, batched with padding); every long sample
runs Ulysses sequence parallel over its SP group, each member holding one equal chunk. Three
exchanges move the data, all planned from metadata every rank has (so no size headers):

1. inputs: each sample's rows go from the rank that owns it to the rank(s) that encode it
   (an SP sample is padded to ``degree`` equal chunks);
2. inside each SP group, Ulysses' all-to-alls around every attention layer;
3. features: the valid output rows go back to the owner through an autograd-aware all-to-all,
   so the owner's loss sends feature gradients back to the encoding ranks.

The pure part (``build_exec_plan``, ``lssp_actions``, ``plan_encoder_lssp``) imports no torch
collectives; ``run_lssp_microbatch`` executes it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from lightning_omnilab.validate import non_negative_int

from ..plan.lssp import DP, SP, LsspPlan, MicrobatchSplit, WorkItem, plan_lssp, sp_degrees
from ..plan.schedule import Action, Kind, Payload
from .alltoall import SubgroupCache, all_to_all_rows, default_cache
from .encoder_lanes import EncoderLanes, assign_to_lanes, gather_lanes, scatter_rows
from .splittable import splittable_heads
from .ulysses import check_sp_heads, pad_length, ulysses_for


@dataclass(frozen=True)
class EncoderCost:
    """Per-sample encoder price of a token count L: seconds = L*a + L^2*b, activation bytes =
    L*m1 + L^2*m2, one Ulysses all-to-all round of all layers = L*x seconds."""

    seconds_per_token: float
    seconds_per_token_pair: float = 0.0
    bytes_per_token: float = 1.0
    bytes_per_token_pair: float = 0.0
    alltoall_seconds_per_token: float = 0.0

    def item(self, sample_id: int, length: int) -> WorkItem:
        return WorkItem(sample_id,
                        length * self.seconds_per_token + length**2 * self.seconds_per_token_pair,
                        length * self.bytes_per_token + length**2 * self.bytes_per_token_pair,
                        length * self.alltoall_seconds_per_token)


def plan_encoder_lssp(lengths: Sequence[Mapping[int, int]], cost: EncoderCost, group_size: int,
                      heads: int, memory_cap: float) -> LsspPlan:
    """``plan_lssp`` over token counts (``lengths[m]``: sample id -> tokens of microbatch m),
    refusing any sample whose activations exceed ``memory_cap`` even at the largest SP degree
    the group and head count allow. ``heads``: ``splittable_heads(encoder)``; 0 (an encoder
    that may not be split) plans every sample whole, balanced over the group."""
    non_negative_int("heads", heads, why="0: samples are never split")
    degrees = sp_degrees(group_size, max(heads, 1))
    top = degrees[-1]
    why = "" if heads else ": the encoder is not splittable"
    for m, mb in enumerate(lengths):
        for sid, n in mb.items():
            if n < 1:
                raise ValueError(f"lengths[{m}][{sid}]: expected >= 1 token, got {n}")
            mem = cost.item(sid, n).memory_bytes
            if mem / top > memory_cap:
                raise ValueError(
                    f"sample {sid} (microbatch {m}, {n} tokens): needs {mem:.4g} bytes of encoder "
                    f"activations, {mem / top:.4g} per rank at the largest SP degree {top} "
                    f"allowed ({group_size} ranks, {heads} heads{why}); over memory_cap="
                    f"{memory_cap:.4g}")
    items = [[cost.item(sid, n) for sid, n in sorted(mb.items())] for mb in lengths]
    return plan_lssp(items, group_size, max(heads, 1), memory_cap)  # 1 head: degree 1 only


@dataclass(frozen=True, slots=True)
class Piece:
    """Rows ``[start, start + rows)`` of one sample moving from ``src`` to ``dst`` (ranks of the
    group, 0-based)."""

    sample_id: int
    src: int
    dst: int
    start: int
    rows: int


@dataclass(frozen=True)
class LsspExecPlan:
    """Everything a rank of the group needs to run one microbatch; identical on every rank."""

    split: MicrobatchSplit
    lengths: Mapping[int, int]
    owner: Mapping[int, int]
    chunk: Mapping[int, int]  # SP sample -> rows per member (after padding)
    inputs: tuple[Piece, ...]
    outputs: tuple[Piece, ...]

    @property
    def group_size(self) -> int:
        return len(self.split.dp_samples)

    def sends(self, rank: int, pieces: Sequence[Piece]) -> list[Piece]:
        return sorted((p for p in pieces if p.src == rank),
                      key=lambda p: (p.dst, p.sample_id, p.start))

    def recvs(self, rank: int, pieces: Sequence[Piece]) -> list[Piece]:
        return sorted((p for p in pieces if p.dst == rank),
                      key=lambda p: (p.src, p.sample_id, p.start))

    def splits(self, rank: int, pieces: Sequence[Piece]) -> tuple[list[int], list[int]]:
        n = self.group_size
        send, recv = [0] * n, [0] * n
        for p in pieces:
            if p.src == rank:
                send[p.dst] += p.rows
            if p.dst == rank:
                recv[p.src] += p.rows
        return send, recv


def build_exec_plan(split: MicrobatchSplit, lengths: Mapping[int, int],
                    owner: Mapping[int, int]) -> LsspExecPlan:
    """Who sends which rows to whom for ``split`` (``owner``: sample -> rank holding its input
    and wanting its features)."""
    n = len(split.dp_samples)
    planned = [s for ranks in split.dp_samples for s in ranks] + [g.sample_id
                                                                  for g in split.sp_groups]
    if sorted(planned) != sorted(lengths):
        raise ValueError(f"lengths: expected exactly the split's samples {sorted(planned)}, got "
                         f"{sorted(lengths)}")
    for sid in planned:
        if not 0 <= owner.get(sid, -1) < n:
            raise ValueError(f"owner[{sid}]: expected a rank in [0, {n}), got {owner.get(sid)}")
    owner = {sid: owner[sid] for sid in planned}
    inputs, outputs, chunk = [], [], {}
    for r, sids in enumerate(split.dp_samples):
        for sid in sids:
            inputs.append(Piece(sid, owner[sid], r, 0, lengths[sid]))
            outputs.append(Piece(sid, r, owner[sid], 0, lengths[sid]))
    for g in split.sp_groups:
        c, _ = pad_length(lengths[g.sample_id], len(g.ranks))
        chunk[g.sample_id] = c
        for i, r in enumerate(g.ranks):
            inputs.append(Piece(g.sample_id, owner[g.sample_id], r, i * c, c))
            valid = max(0, min(c, lengths[g.sample_id] - i * c))
            outputs.append(Piece(g.sample_id, r, owner[g.sample_id], i * c, valid))
    return LsspExecPlan(split, dict(lengths), owner, chunk, tuple(inputs), tuple(outputs))


def lssp_actions(plan: LsspExecPlan, rank: int, global_ranks: Sequence[int], microbatch: int,
                 in_row_bytes: int, out_row_bytes: int, hidden_bytes: int, layers: int,
                 cost: EncoderCost | None = None) -> list[Action]:
    """This rank's forward program for the microbatch in the plan IR: the input all-to-all
    (SAMPLES), the DP and SP encoder work in phase order (each SP sample's Ulysses all-to-alls
    as one ALLTOALL per sample over its group, ``counts`` in bytes for all 4 x ``layers``
    rounds), and the feature all-to-all (FEATURES). ``counts`` are bytes sent to each member.
    ``share`` is the fraction of the microbatch's encoder seconds under ``cost`` (default: of
    its tokens)."""
    n = plan.group_size
    group = tuple(global_ranks)

    def work(sid: int) -> float:
        n_tok = plan.lengths[sid]
        return cost.item(sid, n_tok).seconds if cost is not None else float(n_tok)

    def counts(pieces: Sequence[Piece], row_bytes: int) -> tuple[int, ...]:
        send, _ = plan.splits(rank, pieces)
        return tuple(s * row_bytes if d != rank else 0 for d, s in enumerate(send))

    split = plan.split
    total = sum(work(s) for s in plan.lengths) or 1.0
    out = [Action(Kind.ALLTOALL, microbatch, payload=Payload.SAMPLES, group=group,
                  counts=counts(plan.inputs, in_row_bytes))]
    for phase in split.phase_order:
        if phase == DP and split.dp_samples[rank]:
            mine = split.dp_samples[rank]
            out.append(Action(Kind.ENC_FWD, microbatch,
                              share=sum(work(s) for s in mine) / total,
                              samples=tuple(sorted(mine))))
        elif phase == SP:
            for g in split.sp_groups:
                if rank not in g.ranks:
                    continue
                k = len(g.ranks)
                share = work(g.sample_id) / total / k
                out.append(Action(Kind.ENC_FWD, microbatch, share=share, samples=(g.sample_id,)))
                per_peer = 4 * layers * plan.chunk[g.sample_id] * hidden_bytes // k
                members = tuple(group[r] for r in g.ranks)
                out.append(Action(Kind.ALLTOALL, microbatch, payload=Payload.SP_ATTENTION,
                                  samples=(g.sample_id,), group=members,
                                  counts=tuple(0 if r == rank else per_peer for r in g.ranks)))
    out.append(Action(Kind.ALLTOALL, microbatch, payload=Payload.FEATURES, group=group,
                      counts=counts(plan.outputs, out_row_bytes)))
    assert len(out[0].counts) == n
    return out


@dataclass
class LsspResult:
    """Features of the samples this rank owns; ``anchor`` is the whole received buffer: add
    ``anchor.sum() * 0`` to the loss of a rank that may own no features, so that its backward
    still joins the gradient all-to-all."""

    features: dict[int, torch.Tensor]
    anchor: torch.Tensor
    bytes_sent: int
    sp_samples: int
    sp_degrees: tuple[int, ...]
    rows_encoded: int = 0  # input rows this process ran through the encoder


def run_lssp_microbatch(encoder: torch.nn.Module, plan: LsspExecPlan,
                        inputs: Mapping[int, torch.Tensor], global_ranks: Sequence[int],
                        cache: SubgroupCache | None = None, backend: str = "auto",
                        in_dim: int | None = None, out_dim: int | None = None,
                        dtype: torch.dtype | None = None,
                        row_shape: Sequence[int] | None = None,
                        encoder_tp: int = 1,
                        lanes: EncoderLanes | None = None) -> LsspResult:
    """Run the microbatch's encoder work on this rank (see the module docstring).

    ``encoder(x [B, L, *row_shape], lengths [B]) -> [B, L, out]`` must treat rows
    independently except in attention and accept ``attention=`` (``TokenEncoder`` does; see
    ``splittable_heads``); ``inputs`` holds the ``[L, *row_shape]`` rows of the samples this
    rank owns. A row may have any shape (``[3, 4]`` as well as ``[in_dim]``): rows travel flat
    and the encoder sees them in their own shape. Every rank of the group calls this with the
    same plan. ``row_shape``/``dtype`` (input rows) and ``out_dim`` (feature rows) are read
    off the inputs and the encoder (``in_dim``, ``out_dim``) when not given, but a rank that
    owns no sample must be told the row shape the others send: pass ``row_shape`` (``in_dim``
    is the same for rows of one dimension). ``encoder_tp``: the encoder's TP degree (its
    attention sees ``heads // encoder_tp`` heads; ``global_ranks`` are the processes of
    this TP rank). ``lanes``: this process's encoder lane (``encoder_lanes``): the lanes of
    the rank share its whole samples, lane 0 runs its sequence-parallel pieces, and every lane
    ends with all of the rank's features.
    """
    if plan.split.sp_groups:  # the LSSP contract: only a splittable encoder is split
        heads = splittable_heads(encoder, encoder_tp)
        if heads == 0:
            raise ValueError(
                f"{type(encoder).__name__}: the plan splits samples "
                f"{[g.sample_id for g in plan.split.sp_groups]} over ranks, but the encoder "
                "does not declare `splittable_rows = True` (lightning_omni.runtime.splittable); "
                "plan with heads=splittable_heads(encoder, encoder_tp)")
        for g in plan.split.sp_groups:
            check_sp_heads(heads, len(g.ranks), f"encoder (sample {g.sample_id})")
    cache = cache or default_cache()
    me = dist.get_rank()
    if me not in global_ranks:
        raise ValueError(f"global_ranks: this rank ({me}) is not in {tuple(global_ranks)}")
    rank = list(global_ranks).index(me)
    group = cache.get(global_ranks)
    members = tuple(global_ranks)
    mb = plan.split.microbatch
    for sid, o in plan.owner.items():
        if o == rank and sid not in inputs:
            raise ValueError(f"inputs: this rank owns sample {sid} but its rows are missing")
    ref = next(iter(inputs.values()), None)
    param = next(encoder.parameters())
    if row_shape is not None:
        shape = tuple(int(n) for n in row_shape)
    elif ref is not None:
        shape = tuple(ref.shape[1:])
    else:
        shape = (int(in_dim or encoder.in_dim),)
    dtype = ref.dtype if ref is not None else (dtype or param.dtype)
    width = math.prod(shape)  # elements of one input row

    # 1. inputs to the encoding ranks (data: no gradient), rows flattened to [rows, width]
    sends = plan.sends(rank, plan.inputs)
    rows = []
    for p in sends:
        x = inputs[p.sample_id]
        if x.shape[0] != plan.lengths[p.sample_id]:
            raise ValueError(f"inputs[{p.sample_id}]: expected {plan.lengths[p.sample_id]} rows "
                             f"(the planned length), got {x.shape[0]}")
        if tuple(x.shape[1:]) != shape:
            raise ValueError(f"inputs[{p.sample_id}]: expected rows of shape {shape} (the "
                             f"group's row shape), got {tuple(x.shape[1:])}")
        x = x.reshape(x.shape[0], width)
        end = p.start + p.rows
        if end > x.shape[0]:  # the last SP chunks carry padding
            x = torch.nn.functional.pad(x, (0, 0, 0, end - x.shape[0]))
        rows.append(x[p.start:end])
    buf = torch.cat(rows) if rows else torch.zeros(0, width, dtype=dtype, device=param.device)
    send_split, recv_split = plan.splits(rank, plan.inputs)
    got = all_to_all_rows(buf, send_split, recv_split, group, differentiable=False,
                          what=f"LSSP inputs of microbatch {mb} over group {members}")
    got = got.reshape(got.shape[0], *shape)
    recvd = plan.recvs(rank, plan.inputs)
    pieces = dict(zip(((p.sample_id, p.start) for p in recvd),
                      got.split([p.rows for p in recvd]), strict=True))
    bytes_sent = sum(s for d, s in enumerate(send_split) if d != rank) * width * \
        got.element_size()

    # 2. encoder work in the planned phase order (lanes: each its share, see ``_lane_work``)
    split = plan.split
    mine_dp, sp_here = _lane_work(plan, rank, lanes)
    outs: dict[tuple[int, int], torch.Tensor] = {}
    degrees = []
    for phase in split.phase_order:
        if phase == DP:
            feats = encoder_many(encoder, [pieces[(s, 0)] for s in mine_dp])
            outs.update(((s, 0), f) for s, f in zip(mine_dp, feats, strict=True))
        else:
            for g in sp_here:
                i = g.ranks.index(rank)
                c, length = plan.chunk[g.sample_id], plan.lengths[g.sample_id]
                pg = cache.get(tuple(global_ranks[r] for r in g.ranks))
                att = ulysses_for(pg, causal=getattr(encoder, "causal", False), backend=backend)
                label = f"LSSP sample {g.sample_id} of microbatch {mb}"

                def attention(q, k, v, att=att, length=length, label=label):
                    return att(q, k, v, valid_length=length, what=label)

                x = pieces[(g.sample_id, i * c)]
                valid = max(0, min(c, length - i * c))
                y = encoder(x[None], None, attention=attention)[0]
                outs[(g.sample_id, i * c)] = y[:valid]
                degrees.append(len(g.ranks))
    if lanes is not None and lanes.count > 1:
        outs = _gather_lane_outputs(plan, rank, outs, lanes, out_dim or encoder.out_dim,
                                    param)

    # 3. features back to the owners (autograd: the owners' gradients come back here)
    sends = plan.sends(rank, plan.outputs)
    send_split, recv_split = plan.splits(rank, plan.outputs)
    if sends:
        buf = torch.cat([outs[(p.sample_id, p.start)] for p in sends])
    else:  # keep this rank in the backward all-to-all even when it sends nothing
        out_dim = out_dim or encoder.out_dim
        buf = param.reshape(-1)[:0].reshape(0, 1).expand(0, out_dim)
    got = all_to_all_rows(buf, send_split, recv_split, group,
                          what=f"LSSP features of microbatch {mb} over group {members}")
    bytes_sent += sum(s for d, s in enumerate(send_split) if d != rank) * buf.shape[1] * \
        got.element_size()
    recvd = plan.recvs(rank, plan.outputs)
    parts: dict[int, list[tuple[int, torch.Tensor]]] = {}
    for p, t in zip(recvd, got.split([p.rows for p in recvd]), strict=True):
        parts.setdefault(p.sample_id, []).append((p.start, t))
    features = {sid: torch.cat([t for _, t in sorted(ps, key=lambda x: x[0])])
                for sid, ps in parts.items()}
    encoded = sum(plan.lengths[s] for s in mine_dp) + sum(plan.chunk[g.sample_id]
                                                          for g in sp_here)
    return LsspResult(features, got, bytes_sent, len(degrees), tuple(degrees), encoded)


def _lane_work(plan: LsspExecPlan, rank: int, lanes: EncoderLanes | None
               ) -> tuple[list[int], list]:
    """The whole samples and the sequence-parallel groups this process encodes: all of the
    rank's without lanes; with lanes, lane 0 takes the SP pieces (Ulysses runs between the
    members' lane-0 processes) and the whole samples are spread over the lanes by rows."""
    dp = list(plan.split.dp_samples[rank])
    sp = [g for g in plan.split.sp_groups if rank in g.ranks]
    if lanes is None or lanes.count == 1:
        return dp, sp
    sp_rows = float(sum(plan.chunk[g.sample_id] for g in sp))
    lane_of = assign_to_lanes([plan.lengths[s] for s in dp], lanes.count, (sp_rows,))
    return ([s for s, lane in zip(dp, lane_of, strict=True) if lane == lanes.index],
            sp if lanes.index == 0 else [])


def _gather_lane_outputs(plan: LsspExecPlan, rank: int, outs: dict, lanes: EncoderLanes,
                         width: int, param: torch.Tensor) -> dict:
    """Every output piece of the rank (whole samples, then SP chunks, in plan order) on every
    lane: each lane's pieces summed over the lane peers, zeros where it encoded none."""
    keys, sizes = [], []
    for s in plan.split.dp_samples[rank]:
        keys.append((s, 0))
        sizes.append(plan.lengths[s])
    for g in plan.split.sp_groups:
        if rank in g.ranks:
            c, length = plan.chunk[g.sample_id], plan.lengths[g.sample_id]
            start = g.ranks.index(rank) * c
            keys.append((g.sample_id, start))
            sizes.append(max(0, min(c, length - start)))
    offsets = [sum(sizes[:k]) for k in range(len(sizes))]
    parts = [(torch.arange(o, o + n), outs[key]) for key, o, n
             in zip(keys, offsets, sizes, strict=True) if key in outs]
    rows = scatter_rows(sum(sizes), width, parts, param.detach().new_empty(0))
    if not parts:  # keep this process in the backward all-to-all of the features
        rows = rows + param.reshape(-1)[:1].sum() * 0
    full = gather_lanes(rows, lanes)
    return dict(zip(keys, full.split(sizes), strict=True))


def encoder_many(encoder: torch.nn.Module, samples: Sequence[torch.Tensor],
                 bucket_ratio: float = 0.75) -> list[torch.Tensor]:
    """Encode variable-length samples; the valid rows of each, in order.

    Samples are batched with padding in length buckets (a bucket closes when a sample is
    shorter than ``bucket_ratio`` times its longest), so a short sample never pays for a long
    one's attention: one padded batch of a 32- and a 512-token sample would cost two 512s.
    """
    if not samples:
        return []
    lengths = [s.shape[0] for s in samples]
    order = sorted(range(len(samples)), key=lambda i: -lengths[i])
    buckets: list[list[int]] = []
    for i in order:
        if buckets and lengths[i] >= bucket_ratio * lengths[buckets[-1][0]]:
            buckets[-1].append(i)
        else:
            buckets.append([i])
    out: list[torch.Tensor | None] = [None] * len(samples)
    for idx in buckets:
        n = torch.tensor([lengths[i] for i in idx])
        batch = torch.nn.utils.rnn.pad_sequence([samples[i] for i in idx], batch_first=True)
        y = encoder(batch, n)
        keep = torch.arange(batch.shape[1])[None, :] < n[:, None]
        for i, f in zip(idx, y[keep].split(n.tolist()), strict=True):
            out[i] = f
    return out  # type: ignore[return-value]


def lssp_metrics(plan: LsspPlan) -> dict[str, float]:
    """Long samples and SP degrees of a step's plan, for logging."""
    degrees = [len(g.ranks) for mb in plan.microbatches for g in mb.sp_groups]
    return {"lssp/long_samples": float(len(degrees)),
            "lssp/sp_degree_max": float(max(degrees, default=1)),
            "lssp/sp_degree_mean": float(sum(degrees) / len(degrees)) if degrees else 1.0,
            "lssp/mode_switches": float(plan.mode_switches)}
