"""Execute one rank's action list of a step over torch.distributed point-to-point messages.

Why our own executor instead of torch.distributed.pipelining: its schedule actions are a closed
enum (no encoder actions, no feature messages to stage 0), custom actions exist only as private
API, and it sizes receive buffers from the first microbatch, so every microbatch would need one
shape. Our plans already say, per rank, every compute, message and completion point; running
them is a short loop (see docs/omni/runtime.md).

Messages carry no tags (NCCL ignores them). Both ranks of a pair post their messages to each
other in one order derived from the plan (``lightning_omni.plan.messages``): a SEND posts its
``isend`` when reached, after posting the receives that come before it in the pair's order; a
RECV waits for an ``irecv`` posted at or before it; a WAIT completes a send. Shapes come from
the plan and the microbatch (see ``lightning_omni.plan.schedule``), so no size headers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from ..plan.lssp_schedule import GroupedPlan
from ..plan.messages import message_posts
from ..plan.schedule import Action, Kind, Payload, Schedule, message_key
from ..spec import OmniSpec, Probe, scatter_features, valid_rows
from .alltoall import SubgroupCache
from .encoder_lanes import EncoderLanes, assign_to_lanes, gather_lanes, scatter_rows
from .failures import OmniRuntimeError, communicating, timed_out
from .lssp_exec import build_exec_plan, run_lssp_microbatch
from .memory import SavedTensorMeter
from .parallel_dims import check_microbatches
from .recompute import checkpointed, encoder_layers
from .step_state import ChunkKey, Posted, StepMode, StepState
from .tensor_parallel import full_logits, like, local
from .tp_stage import sharded_grad

if TYPE_CHECKING:
    from .parallelize import Parallelized

__all__ = ["StageExecutor", "StepMode", "StepRecord", "rows_of", "split_microbatches"]


@dataclass
class StepRecord:
    """What one rank measured in one step."""

    loss: float
    count: float
    seconds: float
    busy_seconds: float
    peak_saved_bytes: int
    timings: list[tuple[Action, float, float]] = field(default_factory=list)
    cuda_peak_bytes: int = 0  # allocator peak on GPU (0 on CPU)
    bytes_sent: int = 0  # encoder group exchanges: bytes this rank sent to other ranks
    rows_encoded: int = 0  # encoder input rows this process encoded (its lane's share)

    @property
    def bubble_fraction(self) -> float:
        return 1.0 - self.busy_seconds / self.seconds if self.seconds > 0 else 0.0


def split_microbatches(batch: dict[str, Tensor], num: int) -> list[dict[str, Tensor]]:
    """Equal microbatches along dim 0 (accumulating them equals one large batch)."""
    sizes = {k: v.shape[0] for k, v in batch.items() if isinstance(v, Tensor)}
    b = next(iter(sizes.values()))
    if len(set(sizes.values())) != 1:
        raise ValueError(f"batch: expected every tensor to have the same batch size, got {sizes}")
    check_microbatches(b, num)
    per = b // num
    return [{k: (v[i * per:(i + 1) * per] if isinstance(v, Tensor) else v)
             for k, v in batch.items()} for i in range(num)]


def padded_to_longest(inputs: Tensor, lengths: Tensor, samples: Tensor) -> Tensor:
    """``samples``' encoder inputs padded only to their own longest: a microbatch of short
    samples does not pay for the batch's longest (the encoder masks padding, see OmniSpec)."""
    return inputs[samples, :int(lengths[samples].max())]


def rows_of(lengths: Tensor, samples: Tensor) -> Tensor:
    """Indices, in the sample-by-sample row order of all samples, of ``samples``' rows."""
    offsets = torch.cumsum(lengths, 0) - lengths
    n = lengths[samples]
    total = int(n.sum())
    starts = torch.repeat_interleave(offsets[samples] - (torch.cumsum(n, 0) - n), n)
    return starts + torch.arange(total, device=lengths.device)


class StageExecutor:
    """Runs plans for one rank: its LLM stage, its encoder replicas, its messages."""

    def __init__(self, spec: OmniSpec, built: Parallelized, probe: Probe,
                 device: torch.device, timeout: timedelta,
                 loss_context: Callable[[], AbstractContextManager] = nullcontext) -> None:
        """``built``: what ``parallelize`` made for this process (layout, hosting, process
        groups, encoder groups, TP meshes and lane) and the dims it read (recomputation,
        Ulysses backend, encoder TP degree); ``probe``: the first batch's shapes."""
        layout, hosting, dims = built.layout, built.hosting, built.dims
        self.spec, self.layout, self.groups, self.probe = spec, layout, built.groups, probe
        # entered around the loss and its backward (tensor parallel: e.g. ``loss_parallel``
        # when the head's output is vocabulary-sharded)
        self.loss_context = loss_context
        self.hidden, self.dtype = probe.hidden, probe.feature_dtype
        self.device, self.timeout, self.hosting = device, timeout, hosting
        # this rank's blocks, per model chunk (one chunk unless the pipeline is interleaved)
        bounds = layout.chunk_bounds(layout.stage)
        self.chunks = [list(spec.blocks)[lo:hi] for lo, hi in bounds]
        self.blocks = [b for chunk in self.chunks for b in chunk]
        # per chunk, dtypes of the activations it receives and sends (autocast may change them)
        self.in_dtypes = [probe.block_dtypes[lo - 1] if lo > 0 else probe.feature_dtype
                          for lo, _ in bounds]
        self.out_dtypes = [probe.block_dtypes[hi - 1] for _, hi in bounds]
        self.owns_encoders = built.owns_encoders
        held = hosting.held()
        # each gradient is summed by exactly one collective: the plan's all-reduce of the
        # stage's data-parallel group, the plan's encoder all-reduce, or (parameters shared
        # between stages, e.g. a tied embedding and head) one all-reduce over all holders
        # after the plan (as Megatron's embedding group does)
        llm = {id(p) for mod in self._llm_modules() for p in mod.parameters()}
        stage_group = layout.stage_group(layout.stage)
        self._plan_reduce: dict[tuple[Payload, tuple[int, ...]], list[Tensor]] = {}
        self._shared_reduce: dict[tuple[int, ...], list[Tensor]] = {}
        for holders, params in hosting.by_holders().items():
            for p in params:
                if id(p) in llm and holders == stage_group:
                    key = (Payload.WEIGHT_GRADS, holders)
                elif id(p) not in llm and holders == built.encoder_ranks:
                    key = (Payload.ENCODER_GRADS, holders)
                else:
                    self._shared_reduce.setdefault(holders, []).append(p)
                    continue
                self._plan_reduce.setdefault(key, []).append(p)
        self.meter = SavedTensorMeter(held)
        self._tp_params = [p for p in held if isinstance(p, DTensor)]
        self.cache: SubgroupCache | None = built.encoder_groups  # LSSP / reordering groups
        self.ulysses_backend = dims.ulysses_backend
        self.encoder_tp = dims.encoder_tp  # Ulysses shards each encoder TP rank's heads
        # encoder lanes (encoder TP below the LLM's TP): this process's lane, or None
        self.lanes: EncoderLanes | None = built.tp.lanes if built.tp is not None else None
        self._lane_params: list[Tensor] | None = None  # what the lanes sum (_reduce_lanes)
        # activation recomputation in training steps (runtime/recompute.py): every LLM block
        # of the stage, every encoder layer (or whole encoder call)
        self.recompute, self.encoder_recompute = dims.recompute, dims.encoder_recompute
        self._enc_layers: dict[int, list[nn.Module]] = {}
        self._forward_context: Callable[[], AbstractContextManager] = nullcontext
        self._step = StepState()  # replaced at the start of every ``run``

    @property
    def outputs(self) -> list[Tensor]:
        """PREDICT: the head's output of each microbatch of the last step (last stage)."""
        return self._step.outputs

    def _llm_modules(self) -> list[nn.Module]:
        mods: list[nn.Module] = list(self.blocks)
        if self.layout.is_first:
            mods.insert(0, self.spec.embedding)
        if self.layout.is_last:
            mods.append(self.spec.head)
        return mods

    def owned_params(self) -> list[Tensor]:
        return self.hosting.held()

    # -- one step -------------------------------------------------------------------------
    def run(self, plan: Schedule, mbs: list[dict[str, Tensor]],
            grouped: GroupedPlan | None = None, mode: StepMode = StepMode.TRAIN,
            forward_context: Callable[[], AbstractContextManager] = nullcontext) -> StepRecord:
        """Run this rank's actions of ``plan``; gradients are of the summed (unnormalized)
        loss, and the returned record carries this rank's loss sum and count (last stage)
        for normalizing.
        ``grouped``: the plan's encoder group work (LSSP / grouped reordering), if any.
        ``forward_context``: entered around every forward action (the precision plugin's
        autocast or default dtype), never around a backward, as in a plain training step.
        ``mode``: EVAL and PREDICT run forward-only plans; PREDICT keeps the head's output
        (``self.outputs``, one tensor per microbatch, last stage) and computes no loss."""
        rank = self.layout.rank
        actions = plan.actions[rank]
        posts = dict(message_posts(plan)[rank])
        st = self._step = StepState(mode, mbs, grouped)
        self._forward_context = forward_context  # recomputations run under it too
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        count = torch.zeros((), dtype=torch.float64, device=self.device)
        self.meter.reset_peak()
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        timings: list[tuple[Action, float, float]] = []
        busy = 0.0
        t_step = time.perf_counter()
        for i, a in enumerate(actions):
            t0 = time.perf_counter()
            if a.kind == Kind.SEND:
                st.outbox[message_key(rank, a)] = self._payload_tensor(a).contiguous()
            if i in posts:
                self._post([actions[j] for j in posts[i]])
            if a.kind == Kind.ENC_FWD:
                with self.meter.hooks(), forward_context():
                    (self._group_enc_fwd if grouped is not None else self._enc_fwd)(a)
            elif a.kind == Kind.ENC_BWD:
                (self._group_enc_bwd if grouped is not None else self._enc_bwd)(a)
            elif a.kind == Kind.ALLTOALL and grouped is not None:
                pass  # a group's exchange: performed inside the ENC_FWD/ENC_BWD next to it
            elif a.kind == Kind.LLM_FWD:
                with self.meter.hooks(), forward_context():
                    res = self._llm_fwd(a)
                if res is not None:
                    loss_sum += local(res[0].detach()).to(torch.float64)
                    count += torch.as_tensor(res[1], dtype=torch.float64)
            elif a.kind == Kind.LLM_BWD:
                self._llm_bwd(a)
            elif a.kind == Kind.SEND:
                pass  # posted above, in the pair's order
            elif a.kind == Kind.RECV:
                self._recv(a)
            elif a.kind == Kind.WAIT:
                self._wait(st.pending.pop(message_key(rank, a)))
            elif a.kind == Kind.ALLREDUCE:
                self._allreduce(a)
            else:
                raise OmniRuntimeError(f"action {a}: not supported by this runtime")
            t1 = time.perf_counter()
            timings.append((a, t0, t1))
            if a.kind in (Kind.ENC_FWD, Kind.ENC_BWD, Kind.LLM_FWD, Kind.LLM_BWD):
                busy += t1 - t0
        for posted in list(st.pending.values()):  # plans without completion points
            self._wait(posted)
        st.pending.clear()  # no finished work (and its tensor) outlives the step
        if st.outbox or st.inbox:
            raise OmniRuntimeError(f"messages left unposted {list(st.outbox)[:4]} or "
                                   f"never received {list(st.inbox)[:4]} by the plan")
        if mode == StepMode.TRAIN:
            self._reduce_shared()
            self._reduce_lanes()
            for p in self._tp_params:  # gradients sharded like their parameters
                p.grad = sharded_grad(p)
        seconds = time.perf_counter() - t_step
        return StepRecord(float(loss_sum), float(count), seconds, busy, self.meter.peak,
                          [(a, t0 - t_step, t1 - t_step) for a, t0, t1 in timings],
                          torch.cuda.max_memory_allocated(self.device) if cuda else 0,
                          st.bytes_sent, st.rows_encoded)

    # -- compute --------------------------------------------------------------------------
    def _recomputing(self, on: bool, modules: list[nn.Module]) -> AbstractContextManager:
        if not on or self._step.mode != StepMode.TRAIN:
            return nullcontext()
        return checkpointed(modules, self._forward_context)

    def _encoder_recomputing(self, encoder: nn.Module) -> AbstractContextManager:
        """Checkpoint the encoder's layers, or its whole call (``encoder_layers``)."""
        layers = self._enc_layers.get(id(encoder))
        if layers is None:
            layers = self._enc_layers[id(encoder)] = encoder_layers(encoder) or [encoder]
        return self._recomputing(self.encoder_recompute, layers)

    def _encode(self, mb: dict[str, Tensor], samples: tuple[int, ...]) -> Tensor:
        """Features of ``samples`` (per modality in order, sample by sample). With encoder
        lanes each lane encodes its share of the samples and every lane gets all features."""
        s = torch.tensor(samples, dtype=torch.long, device=self.device)
        lanes = self.lanes if self.lanes is not None and self.lanes.count > 1 else None
        mine = None
        if lanes is not None:  # balanced by each sample's encoder rows, the same on every lane
            rows = sum(mb[m.lengths].cpu()[s.cpu()] for m in self.spec.modalities)
            lane_of = assign_to_lanes([float(r) for r in rows], lanes.count)
            mine = torch.tensor([lane == lanes.index for lane in lane_of], device=self.device)
        chunks, parts, total = [], [], 0
        for m in self.spec.modalities:
            lengths = mb[m.lengths]
            has = lengths[s] > 0
            idx = s[has]
            if idx.numel() == 0:
                continue
            if mine is not None:  # this lane's samples, and where their rows go
                sub = s[has & mine]
                if sub.numel():
                    self._step.rows_encoded += int(lengths[sub].sum())
                    with self._encoder_recomputing(m.encoder):
                        out = m.encoder(padded_to_longest(mb[m.inputs], lengths, sub),
                                        lengths[sub])
                    where = rows_of(lengths[idx], torch.nonzero(mine[has]).flatten()) + total
                    parts.append((where, valid_rows(out, lengths[sub])))
                total += int(lengths[idx].sum())
                continue
            self._step.rows_encoded += int(lengths[idx].sum())
            with self._encoder_recomputing(m.encoder):
                out = m.encoder(padded_to_longest(mb[m.inputs], lengths, idx), lengths[idx])
            chunks.append(valid_rows(out, lengths[idx]))
        if lanes is not None:
            like = torch.empty(0, dtype=self.dtype, device=self.device)
            return gather_lanes(scatter_rows(total, self.hidden, parts, like), lanes)
        if not chunks:
            return torch.zeros(0, self.hidden, dtype=self.dtype, device=self.device)
        return torch.cat(chunks).to(self.dtype)

    def _feature_rows(self, mb: dict[str, Tensor], samples: tuple[int, ...]) -> int:
        s = torch.tensor(samples, dtype=torch.long)
        return int(sum(mb[m.lengths].cpu()[s].sum() for m in self.spec.modalities))

    def _enc_fwd(self, a: Action) -> None:
        out = self._encode(self._step.microbatches[a.microbatch], a.samples)
        self._step.enc_out[a.microbatch] = out
        if self.layout.is_first:
            leaf = out.detach().requires_grad_(self._step.mode == StepMode.TRAIN)
            self._step.local_feat[a.microbatch] = leaf
            self._step.feat_in.setdefault(a.microbatch, []).append((a.samples, leaf))

    def _enc_bwd(self, a: Action) -> None:
        out = self._step.enc_out.pop(a.microbatch)
        if self.layout.is_first:
            leaf = self._step.local_feat.pop(a.microbatch)
            grad = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
        else:
            grad = self._step.feat_grad.pop(a.microbatch)
        if out.requires_grad:  # an encoder lane that encoded none of the samples: nothing
            torch.autograd.backward(out, grad)

    # -- encoder group actions (LSSP / grouped reordering, see plan.lssp_schedule) -----------
    def _group_enc_fwd(self, a: Action) -> None:
        """Run this rank's part of the group's encoder work; keep the features of this
        replica's own samples (in the FEATURES message layout) like ``_enc_fwd`` does."""
        plan = self._step.grouped
        m, rank, replica = a.microbatch, self.layout.rank, self.layout.replica
        w, batch = plan.work(m, rank), plan.batch
        first = replica * batch  # pooled id of this replica's sample 0
        own = tuple(g - first for g in a.samples if first <= g < first + batch)
        mb = self._step.microbatches[m]
        parts, feats = [], []
        j = w.members.index(rank)
        for k, mod in enumerate(self.spec.modalities):
            split = w.splits[k]
            if split is None:
                continue
            ex = build_exec_plan(split, w.lengths[k], w.owner[k])
            mine = sorted(g for g, o in w.owner[k].items() if o == j)
            x = mb[mod.inputs]
            inputs = {g: x[g - first, :w.lengths[k][g]] for g in mine}
            # the group's processes at this TP rank (TP: each TP rank runs the same work, on
            # its shard of a TP-sharded encoder's heads)
            members = self.layout.tp_slice(w.members, self.layout.tp_rank)
            with self._encoder_recomputing(mod.encoder):
                res = run_lssp_microbatch(mod.encoder, ex, inputs, members, cache=self.cache,
                                          backend=self.ulysses_backend, row_shape=x.shape[2:],
                                          out_dim=self.hidden, dtype=x.dtype,
                                          encoder_tp=self.encoder_tp, lanes=self.lanes)
            self._step.bytes_sent += res.bytes_sent
            self._step.rows_encoded += res.rows_encoded
            part = (torch.cat([res.features[g] for g in mine]) if mine else
                    torch.zeros(0, self.hidden, dtype=self.dtype, device=self.device))
            parts.append((part, res.anchor))
            feats.append(part)
        out = (torch.cat(feats).to(self.dtype) if feats else
               torch.zeros(0, self.hidden, dtype=self.dtype, device=self.device))
        self._step.enc_out[m] = out
        self._step.enc_parts[m] = parts
        if self.layout.is_first:
            leaf = out.detach().requires_grad_(self._step.mode == StepMode.TRAIN)
            self._step.local_feat[m] = leaf
            if own:
                self._step.feat_in.setdefault(m, []).append((own, leaf))

    def _group_enc_bwd(self, a: Action) -> None:
        """Backward of the group's encoder work, one modality at a time in the same order on
        every member (each runs the group's reverse all-to-alls); a member without features
        of its own still joins them through the received buffer (``anchor``)."""
        m = a.microbatch
        out = self._step.enc_out.pop(m)
        parts = self._step.enc_parts.pop(m)
        if self.layout.is_first:
            leaf = self._step.local_feat.pop(m)
            grad = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
        else:
            grad = self._step.feat_grad.pop(m, None)
            if grad is None:  # no own samples: no FEATURE_GRAD message
                grad = torch.zeros_like(out)
        grads = grad.split([p.shape[0] for p, _ in parts]) if parts else []
        for (part, anchor), g in zip(parts, grads, strict=True):
            total = anchor.sum() * 0
            if part.shape[0]:
                total = total + (part * g.to(part.dtype)).sum()
            total.backward()

    def _assemble(self, m: int, mb: dict[str, Tensor], h: Tensor) -> Tensor:
        sources = self._step.feat_in.pop(m, [])
        tokens = mb[self.spec.tokens]
        for k, mod in enumerate(self.spec.modalities):
            lengths = mb[mod.lengths]
            parts, index = [], []
            for samples, feat in sources:
                s = torch.tensor(samples, dtype=torch.long, device=self.device)
                # split the source's rows into its per-modality blocks
                sizes = [int(mb[x.lengths][s].sum()) for x in self.spec.modalities]
                block = feat.split(sizes)[k]
                if block.shape[0] == 0:
                    continue
                parts.append(block)
                index.append(rows_of(lengths, s[lengths[s] > 0]))
            if not parts:
                continue
            order = torch.argsort(torch.cat(index))
            h = scatter_features(h, tokens, mod.token_id, torch.cat(parts)[order])
        return h

    def _chunk(self, a: Action) -> tuple[ChunkKey, bool, bool]:
        """An LLM action's or message's (microbatch, chunk), and whether its virtual stage
        (``a.stage``) is the pipeline's first or last."""
        lay = self.layout
        c = lay.chunk_of(a.stage)
        return (a.microbatch, c), lay.is_first and c == 0, lay.is_last and c == lay.vpp - 1

    def _llm_fwd(self, a: Action) -> tuple[Tensor, Tensor] | None:
        mb = self._step.microbatches[a.microbatch]
        key, first, last = self._chunk(a)
        if first:
            h = self.spec.embedding(mb[self.spec.tokens])
            h = self._assemble(a.microbatch, mb, h)
        else:
            h = self._step.act_in.pop(key)
            self._step.stage_in[key] = h
        blocks = self.chunks[key[1]]
        with self._recomputing(self.recompute, blocks):
            for block in blocks:
                h = block(h)
        if not last:
            self._step.stage_out[key] = h
            return None
        logits = self.spec.head(h)
        if self._step.mode == StepMode.PREDICT:
            self._step.outputs.append(full_logits(logits.detach()))
            return None
        with self.loss_context():
            total, count = self.spec.loss(logits, mb)
        if self._step.mode == StepMode.TRAIN:
            self._step.stage_out[key] = total
        with torch.no_grad():
            whole = full_logits(logits.detach()) if self.spec.metrics else None  # TP: gathered once
            for name, fn in self.spec.metrics.items():
                value, n = fn(whole, mb)
                sums = self._step.metric_sums.setdefault(name, [])
                sums.append(torch.stack([torch.as_tensor(value, dtype=torch.float64),
                                         torch.as_tensor(n, dtype=torch.float64)]))
        return total, count

    def metric_sums(self) -> Tensor:
        """``[len(spec.metrics), 2]``: (sum, count) of each metric over this rank's
        microbatches of the last step (zeros off the last stage)."""
        sums = self._step.metric_sums
        rows = [torch.stack(sums[n]).sum(0) if n in sums else
                torch.zeros(2, dtype=torch.float64) for n in self.spec.metrics]
        return (torch.stack(rows) if rows else torch.zeros(0, 2, dtype=torch.float64)
                ).to(self.device)

    def _llm_bwd(self, a: Action) -> None:
        key, _, last = self._chunk(a)
        out = self._step.stage_out.pop(key)
        if last:
            with self.loss_context():
                out.backward()
        else:
            torch.autograd.backward(out, self._step.grad_in.pop(key))

    # -- messages -------------------------------------------------------------------------
    def _payload_tensor(self, a: Action) -> Tensor:
        m = a.microbatch
        if a.payload == Payload.ACTIVATION:
            return self._step.stage_out[self._chunk(a)[0]].detach()
        if a.payload == Payload.GRADIENT:
            leaf = self._step.stage_in.pop(self._chunk(a)[0])
            return leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
        if a.payload == Payload.FEATURES:
            return self._step.enc_out[m].detach()
        if a.payload == Payload.FEATURE_GRAD:
            leaf = self._step.remote_feat.pop((m, a.peer))
            return leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
        raise OmniRuntimeError(f"action {a}: no tensor for payload {a.payload}")

    def _recv_shape(self, a: Action) -> tuple[int, ...]:
        mb = self._step.microbatches[a.microbatch]
        if a.payload in (Payload.ACTIVATION, Payload.GRADIENT):
            return (*mb[self.spec.tokens].shape, self.hidden)
        return (self._feature_rows(mb, a.samples), self.hidden)

    def _recv_dtype(self, a: Action) -> torch.dtype:
        """Messages carry what the plain run hands over at the same point: activations in the
        dtype the previous stage's last block returns (under autocast too), gradients in
        the dtype of the activation they belong to, features in the embedding's dtype."""
        if a.payload == Payload.ACTIVATION:
            return self.in_dtypes[self._chunk(a)[0][1]]
        if a.payload == Payload.GRADIENT:
            return self.out_dtypes[self._chunk(a)[0][1]]
        return self.dtype

    def _what(self, a: Action) -> str:
        way = "from" if a.kind == Kind.RECV else "to"
        kind = "recv" if a.kind == Kind.RECV else "send"
        chunk = f" (model chunk channel {a.chunk})" if a.chunk else ""
        peer = self.layout.to_global(a.peer)  # the process, as torchrun and the logs name it
        plan = f" (pipeline rank {a.peer})" if peer != a.peer else ""
        return (f"{kind} of {a.payload} for microbatch {a.microbatch}{chunk} {way} "
                f"rank {peer}{plan}")

    def _post(self, group: Sequence[Action]) -> None:
        """Post these messages in this order, without tags (see the module doc)."""
        for a in group:
            key = message_key(self.layout.rank, a)
            with communicating(self._what(a), self.timeout):
                peer = self.layout.to_global(a.peer)  # the peer's process at our TP rank
                if a.kind == Kind.SEND:
                    t = self._step.outbox.pop(key)
                    self._step.pending[key] = Posted(dist.isend(t, peer), t, a)
                else:
                    buf = torch.empty(self._recv_shape(a), dtype=self._recv_dtype(a),
                                      device=self.device)
                    self._step.inbox[key] = Posted(dist.irecv(buf, peer), buf, a)

    def _recv(self, a: Action) -> None:
        work, buf, _ = self._step.inbox.pop(message_key(self.layout.rank, a))
        self._wait(Posted(work, buf, a))
        m = a.microbatch
        if a.payload == Payload.ACTIVATION:
            self._step.act_in[self._chunk(a)[0]] = buf.requires_grad_(
                self._step.mode == StepMode.TRAIN)
        elif a.payload == Payload.GRADIENT:
            self._step.grad_in[self._chunk(a)[0]] = buf
        elif a.payload == Payload.FEATURES:
            leaf = buf.requires_grad_(self._step.mode == StepMode.TRAIN)
            self._step.remote_feat[m, a.peer] = leaf
            self._step.feat_in.setdefault(m, []).append((a.samples, leaf))
        elif a.payload == Payload.FEATURE_GRAD:
            self._step.feat_grad[m] = buf

    def _wait(self, posted: Posted) -> None:
        """Wait for an ``isend``/``irecv`` posted for action ``a``."""
        work, _, a = posted
        what = self._what(a) + (" (waiting for the peer to take it)" if a.kind != Kind.RECV
                                else "")
        t0 = time.monotonic()
        with communicating(what, self.timeout):
            ok = work.wait(self.timeout)
        if ok is False:
            raise timed_out(what, time.monotonic() - t0, self.timeout)

    def _allreduce(self, a: Action) -> None:
        if self._step.mode != StepMode.TRAIN:
            return
        params = self._plan_reduce.get((a.payload, tuple(sorted(a.group))), [])
        self._sum_grads(params, a.group, f"{a.payload} all-reduce")

    def _reduce_shared(self) -> None:
        """Parameters held by several stages: sum their gradients over every holder."""
        for holders, params in self._shared_reduce.items():
            self._sum_grads(params, holders, "all-reduce of parameters shared between stages")

    def _reduce_lanes(self) -> None:
        """Encoder lanes: each lane's encoder gradients hold its own samples; sum them."""
        lanes = self.lanes
        if lanes is None or lanes.count == 1 or not self.owns_encoders:
            return
        if self._lane_params is None:  # the encoders' own parameters, once
            llm = {id(p) for mod in self._llm_modules() for p in mod.parameters()}
            params = [p for m in self.spec.modalities for p in m.encoder.parameters()
                      if id(p) not in llm]
            self._lane_params = list({id(p): p for p in params}.values())
        self._all_reduce_grads(self._lane_params, lanes.group,
                               "all-reduce of encoder gradients over the encoder lanes")

    def _sum_grads(self, params: list[Tensor], group: tuple[int, ...], what: str) -> None:
        """Sum the gradients of ``params`` over plan ranks ``group`` (with tensor parallelism:
        each process's local shards, over the processes of its TP rank)."""
        if len(group) <= 1 or not params:
            return
        self._all_reduce_grads(params, self.groups[tuple(group)],
                               f"{what} over ranks {tuple(group)}")

    def _all_reduce_grads(self, params: list[Tensor], group: object, what: str) -> None:
        if not params:
            return
        grads = [local(sharded_grad(p)) if p.grad is not None else torch.zeros_like(local(p))
                 for p in params]
        # one more element per parameter counts the holders that had a gradient: a parameter
        # no holder used keeps ``grad=None`` as in the plain run (a zero gradient would still
        # move it under weight decay and Adam's moments)
        had = torch.tensor([float(p.grad is not None) for p in params], dtype=grads[0].dtype,
                           device=grads[0].device)
        flat = torch.cat([g.reshape(-1) for g in grads] + [had])
        with communicating(what, self.timeout):
            dist.all_reduce(flat, group=group)
        offset = 0
        used = flat[-len(params):].tolist()
        for p, g, holders in zip(params, grads, used, strict=True):
            n = g.numel()
            p.grad = like(flat[offset:offset + n].view_as(g).clone(), p) if holders else None
            offset += n
