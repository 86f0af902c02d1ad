"""One pipelined step: plan from the batch, execute, normalize, measure.

Every rank builds the same plan for all replicas from the replicas' sample metadata (one small
all-gather per step; none with one process per replica, whose actions need only its own data),
executes its own list, and then divides its gradients by the global number
of loss terms, so the update equals one large-batch step of the plain module. Evaluation and
prediction run the same plan without its backward half.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from datetime import timedelta
from functools import lru_cache
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import Tensor

from lightning_omnilab.validate import one_of

from ..plan.interleaved import first_microbatches, interleave
from ..plan.lssp_schedule import GroupedPlan, GroupOptions, build_grouped_plan
from ..plan.schedule import (
    SCHEDULES,
    Schedule,
    assign_encoder_samples,
    encoder_first_stage,
    for_replicas,
    forward_only,
    uniform_insertion,
    with_completion_points,
)
from ..spec import OmniSpec, OmniSpecError, Probe
from .executor import StageExecutor, StepMode, StepRecord, split_microbatches
from .failures import OmniRuntimeError, communicating, naming_lost_peers
from .hosting import all_buffers, all_parameters
from .tensor_parallel import local, loss_context
from .tp_stage import counted_in_norm

if TYPE_CHECKING:
    from .parallelize import Parallelized

__all__ = ["SCHEDULES", "OmniEngine", "StepResult", "build_forward_plan", "build_plan",
           "sync_parameters"]


@lru_cache(maxsize=64)
def build_plan(schedule: str, pp: int, costs: tuple, vpp: int = 1) -> Schedule:
    """The step's plan for all replicas. ``costs[d][m][i]``: encoder cost of sample i of
    microbatch m in replica d (0: no encoder input). ``vpp`` model chunks per rank: the same
    encoder placement, re-threaded into the interleaved order (``plan.interleaved``), as the
    planner prices it."""
    one_of("schedule", schedule, SCHEDULES)
    reps = []
    for rep_costs in costs:
        n = len(rep_costs)
        if schedule == "uniform_insertion":
            # stage 0 runs its share inline (no run-ahead), so it keeps its share of the
            # drain microbatches too (fewer encoder backwards left after the last B)
            samples, shares = assign_encoder_samples(rep_costs, pp,
                                                     skip_stage0_drain=False)
            base = uniform_insertion(pp, n, shares, samples=samples, inline_stage0=True)
        else:
            own = [tuple(i for i, c in enumerate(row) if c > 0) for row in rep_costs]
            base = encoder_first_stage(pp, n, samples=own)
        reps.append(interleave(base, vpp))
    return with_completion_points(for_replicas(reps))


@lru_cache(maxsize=64)
def build_forward_plan(schedule: str, pp: int, costs: tuple, vpp: int = 1) -> Schedule:
    """``build_plan`` without its backward half (evaluation and prediction)."""
    return forward_only(build_plan(schedule, pp, costs, vpp))


def _with_empty(per_replica: tuple, extra: int) -> tuple:
    """Each replica's per-microbatch metadata with ``extra`` microbatches of zeros (no
    encoder input) of the same shape appended."""
    def zeros(x):
        return tuple(zeros(y) for y in x) if isinstance(x, tuple) else type(x)(0)

    return tuple(rep + (zeros(rep[0]),) * extra for rep in per_replica)


@dataclass
class StepResult:
    loss: Tensor
    record: StepRecord
    plan: Schedule
    tokens: int
    grouped: GroupedPlan | None = None  # encoder group work (LSSP / grouped reordering)
    metrics: dict[str, Tensor] = field(default_factory=dict)  # OmniSpec.metrics, global
    outputs: Tensor | None = None  # PREDICT: the head's output for this replica's batch
    # (mode, this replica's sample costs) when the plan came from them alone (OmniEngine._plan)
    planned_alone: tuple | None = None


def sync_parameters(spec: OmniSpec, timeout: timedelta, rank: int = 0) -> None:
    """Give every rank global rank 0's parameters and buffers (as DDP does at wrap time),
    so stages and replicas start from the one module the plain run would build, even
    when each rank built it from its own random state. Called before any rank shards or
    drops what it hosts, and before a checkpoint is restored."""
    tensors = [*all_parameters(spec), *all_buffers(spec)]
    with torch.no_grad():
        for dtype in dict.fromkeys(t.dtype for t in tensors):
            same = [t for t in tensors if t.dtype == dtype]
            flat = torch.cat([t.detach().reshape(-1) for t in same])
            with communicating(f"rank {rank}: broadcast of rank 0's parameters", timeout):
                dist.broadcast(flat, src=0)
            offset = 0
            for t in same:
                t.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()


class OmniEngine:
    """Owns this rank's executor and the per-step protocol around it. Made by
    ``parallelize`` (``runtime/parallelize.py``), which shards the stage, derives hosting and
    creates the process groups first; the executor is built at the first batch, with all of
    it and that batch's shapes."""

    def __init__(self, spec: OmniSpec, built: Parallelized, device: torch.device,
                 timeout: timedelta) -> None:
        self.spec, self.built, self.dims = spec, built, built.dims
        self.layout, self.hosting, self.groups = built.layout, built.hosting, built.groups
        self.schedule, self.num_microbatches = built.dims.schedule, built.dims.num_microbatches
        self.device, self.timeout = device, timeout
        self.executor: StageExecutor | None = None
        self.probe: Probe | None = None
        self.steps = 0  # steps run by this engine (any mode), for error messages
        self.planned_alone: tuple | None = None  # the last plan's, see StepResult
        self.check_finite = True  # refuse NaN/inf inputs (OmniStrategy(check_finite=...))
        # LSSP / grouped reordering: encoder work as group actions of each stage's
        # data-parallel group (see plan.lssp_schedule); None keeps the per-replica plans.
        # The first batch adds the byte sizes its ALLTOALL counts price.
        self.group_options = built.group_options

    def owns_encoders(self) -> bool:
        return self.built.owns_encoders

    # -- first batch: checks, then drop the parts this rank does not host -------------------
    def _first_batch(self, batch: dict[str, Tensor], mode: StepMode,
                     forward_context: Callable[[], AbstractContextManager]) -> None:
        elsewhere = dict(self.built.elsewhere)
        if self.built.tp is not None:  # parts hosted elsewhere run on meta (they may hold a
            held = {id(p) for p in self.hosting.held()}  # tie's DTensor, see tp_stage); a
            elsewhere = {**{id(p): tuple(p.shape) for p in self.hosting.params  # meta
                            if id(p) not in held}, **elsewhere}  # build's shapes are the true ones
        with forward_context():
            self.probe = self.spec.check_shapes(batch, with_loss=mode != StepMode.PREDICT,
                                                elsewhere=elsewhere)
        ex = StageExecutor(self.spec, self.built, self.probe, self.device, self.timeout,
                           lambda: loss_context(self.spec))
        keep = {id(p) for p in ex.owned_params()}
        with torch.inference_mode(False):  # the first batch may come in a validation loop
            for p in self.hosting.params:
                if id(p) not in keep:
                    # not hosted here: free the storage (the optimizer skips grad-less params)
                    p.data = torch.empty(0, dtype=p.dtype, device=p.device)
                    p.grad = None
        if self.group_options is not None:
            self.group_options = self._row_bytes(batch, self.probe.hidden,
                                                 self.probe.feature_dtype)
        self.executor = ex

    def _row_bytes(self, batch: dict[str, Tensor], hidden: int, dtype: torch.dtype
                   ) -> GroupOptions:
        """Byte sizes the group plan's ALLTOALL counts price (see ``GroupOptions``)."""
        item = torch.empty(0, dtype=dtype).element_size()
        ins, sps = [], []
        for m in self.spec.modalities:
            x = batch[m.inputs]
            ins.append(int(x[0, 0].numel()) * x.element_size())
            layers = len(getattr(m.encoder, "blocks", ()))
            sps.append(4 * layers * int(getattr(m.encoder, "dim", 0)) * item)
        return replace(self.group_options, in_row_bytes=tuple(ins), out_row_bytes=hidden * item,
                       sp_row_bytes=tuple(sps))

    def hosted_names(self, module: torch.nn.Module) -> set[str]:
        """Names (in ``module.state_dict()``) of the parameters this rank hosts."""
        mine = self.hosted_param_ids()
        return {n for n, p in module.named_parameters() if id(p) in mine}

    def hosted_param_ids(self) -> set[int]:
        return {id(p) for p in self.hosting.held()}

    @torch.no_grad()
    def clip_grad_norm(self, max_norm: float) -> Tensor:
        """``torch.nn.utils.clip_grad_norm_`` over the whole model: each gradient element
        enters the norm once (a parameter on its lowest holder, replicas and tied copies hold
        equal gradients; under TP each process adds its local shards, ``counted_in_norm``),
        one all-reduce sums the squares, every holder scales its (local) gradients by the
        same factor. The scaling is ``clip_grads_with_norm_``'s, on local shards: that
        function takes parameters, whose DTensor gradients it cannot mix with a plain norm."""
        lay = self.layout
        grads = [local(p.grad) for p in self.hosting.counted_here()
                 if p.grad is not None and counted_in_norm(p, lay)]
        square = (torch.nn.utils.get_total_norm(grads, 2.0).to(torch.float64) ** 2 if grads
                  else torch.zeros((), dtype=torch.float64, device=self.device))
        with communicating("all-reduce of the gradient norm over all ranks", self.timeout):
            dist.all_reduce(square)
        total = square.sqrt()
        held = [local(p.grad) for p in self.hosting.held() if p.grad is not None]
        if held:
            total = total.to(held[0].dtype)
            coef = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)
            for g in held:
                g.mul_(coef.to(g.device))
        return total

    # -- one step ---------------------------------------------------------------------------
    def sample_costs(self, mbs: list[dict[str, Tensor]]) -> tuple:
        """Per microbatch and sample: encoder tokens (all modalities)."""
        out = []
        for mb in mbs:
            total = sum(mb[m.lengths].to(torch.long).cpu() for m in self.spec.modalities)
            if not isinstance(total, Tensor):
                total = torch.zeros(mb[self.spec.tokens].shape[0], dtype=torch.long)
            out.append(tuple(float(x) for x in total.tolist()))
        return tuple(out)

    def sample_lengths(self, mbs: list[dict[str, Tensor]]) -> tuple:
        """Per microbatch and sample: encoder rows of every modality."""
        cols = [torch.stack([mb[m.lengths].to(torch.long).cpu() for m in self.spec.modalities],
                            1) for mb in mbs]
        return tuple(tuple(tuple(row) for row in c.tolist()) for c in cols)

    def _gather(self, local: tuple) -> list:
        """Every rank's step metadata; the stages (and TP ranks) of a replica must have read
        the same."""
        lay = self.layout
        everyone: list = [None] * lay.global_world_size
        with communicating("all-gather of the step's sample metadata over all ranks",
                           self.timeout):
            dist.all_gather_object(everyone, local)
        per_replica = lay.pp * lay.tp  # processes of one replica (global ranks, in a row)
        for r, got in enumerate(everyone):
            first = (r // per_replica) * per_replica
            if got != everyone[first]:
                raise ValueError(f"batch: rank {r} loaded other samples than rank {first} of the "
                                 "same pipeline replica; every stage of a replica must read the "
                                 "replica's shard (the same batches in the same order)")
        return [everyone[d * per_replica] for d in range(lay.dp)]

    def _microbatches(self, batch: dict[str, Tensor], mode: StepMode) -> list[dict[str, Tensor]]:
        """Training splits into ``num_microbatches`` equal parts (the step equals one large
        batch); evaluation takes the largest count up to it that divides the batch, so a
        short last batch still runs."""
        if mode == StepMode.TRAIN:
            return split_microbatches(batch, self.num_microbatches)
        b = int(batch[self.spec.tokens].shape[0])
        n = max(k for k in range(1, min(self.num_microbatches, b) + 1) if b % k == 0)
        return split_microbatches(batch, n)

    def step(self, batch: dict[str, Tensor], mode: StepMode = StepMode.TRAIN,
             forward_context: Callable[[], AbstractContextManager] = nullcontext,
             where: str | None = None) -> StepResult:
        """One step over this replica's ``batch``. ``where`` names it in error messages
        (default: the engine's step count)."""
        where = where or f"step {self.steps}"
        self.steps += 1
        here = f"rank {self.layout.global_rank}, {where} ({mode.value})"
        with naming_lost_peers(here):  # the collectives of the stage's own layers (TP)
            try:
                self._check_batch(batch, where)
                return self._step(batch, mode, forward_context)
            except OmniRuntimeError as err:  # one the runtime named: add the rank and step
                raise OmniRuntimeError(f"{here}: {err}") from err

    def _check_batch(self, batch: dict[str, Tensor], where: str) -> None:
        """``OmniSpec.check_batch`` before any other collective of the step. The ranks of a
        replica read the same batch and refuse it alike; replicas read different ones, so
        with several, one small all-reduce tells every rank whether any replica refused its
        batch and every rank raises that refusal (no replica waits in the step's collectives
        for one that stopped)."""
        try:
            self.spec.check_batch(batch, check_finite=self.check_finite)
            refusal = None
        except OmniSpecError as err:
            refusal = err
        lay = self.layout
        if lay.dp > 1:
            refused = torch.tensor([0 if refusal is None else 1], device=self.device)
            with communicating(f"all-reduce of the batch checks over all ranks ({where})",
                               self.timeout):
                dist.all_reduce(refused, op=dist.ReduceOp.MAX)
            if int(refused):  # rare: every rank learns the first refusal's words
                everyone: list = [None] * lay.global_world_size
                with communicating("all-gather of the batch refusals over all ranks",
                                   self.timeout):
                    dist.all_gather_object(everyone, None if refusal is None else str(refusal))
                rank = next(r for r, msg in enumerate(everyone) if msg is not None)
                replica = rank // (lay.pp * lay.tp)
                raise OmniSpecError(f"{everyone[rank]} (replica {replica}'s batch at {where}; "
                                    "every replica stops)") from refusal
        if refusal is not None:
            raise refusal

    def _step(self, batch: dict[str, Tensor], mode: StepMode,
              forward_context: Callable[[], AbstractContextManager]) -> StepResult:
        if self.executor is None:
            self._first_batch(batch, mode, forward_context)
        assert self.executor is not None
        if mode == StepMode.TRAIN:
            for p in self.executor.owned_params():
                p.grad = None
        mbs = self._microbatches(batch, mode)
        plan, grouped = self._plan(mbs, mode)
        record = self.executor.run(plan, mbs, grouped, mode,
                                   forward_context)
        if mode == StepMode.PREDICT:
            result = StepResult(torch.zeros((), dtype=torch.float64), record, plan, 0, grouped,
                                outputs=self._replica_outputs(batch))
        else:
            result = self._finish(batch, record, plan, grouped, mode)
        result.planned_alone = self.planned_alone
        return result

    def _plan(self, mbs: list[dict[str, Tensor]], mode: StepMode
              ) -> tuple[Schedule, GroupedPlan | None]:
        """The step's plan (and its encoder group work, if any). With model chunks, an
        evaluation count of microbatches that is no multiple of ``pp`` (a short batch; the
        interleaved order runs them in groups of ``pp``) is planned with empty microbatches
        up to the next multiple, dropped again by ``first_microbatches``."""
        lay, n = self.layout, len(mbs)
        extra = -n % lay.pp if lay.vpp > 1 else 0
        grouped, self.planned_alone = None, None
        if self.group_options is not None:
            lengths = _with_empty(tuple(self._gather(self.sample_lengths(mbs))), extra)
            names = tuple(m.name for m in self.spec.modalities)
            grouped = build_grouped_plan(self.schedule, lay.pp, lengths, self.group_options,
                                         names, lay.vpp)
            plan = grouped.schedule if mode == StepMode.TRAIN else forward_only(grouped.schedule)
        else:
            local = self.sample_costs(mbs)
            if lay.pp * lay.tp == 1:  # one process per replica: its actions need only its own
                costs = (local,) * lay.dp  # data (the others' plans are placeholders until
                self.planned_alone = (mode, local)  # global_plan gathers theirs)
            else:
                costs = tuple(self._gather(local))
            build = build_plan if mode == StepMode.TRAIN else build_forward_plan
            plan = build(self.schedule, lay.pp, _with_empty(costs, extra), lay.vpp)
        return (first_microbatches(plan, n) if extra else plan), grouped

    def global_plan(self, result: StepResult) -> Schedule:
        """``result``'s plan with every replica's own part (collective: every rank calls it).
        At one process per replica each step plans from its own data alone."""
        if result.planned_alone is None:
            return result.plan
        mode, local = result.planned_alone
        costs = tuple(self._gather(local))
        build = build_plan if mode == StepMode.TRAIN else build_forward_plan
        return build(self.schedule, self.layout.pp, costs, self.layout.vpp)

    def _replica_outputs(self, batch: dict[str, Tensor]) -> Tensor:
        """The head's output for this replica's batch, on every stage of the replica (the
        last stage computed it and sends it to the others)."""
        lay, ex, probe = self.layout, self.executor, self.probe
        if lay.is_last:
            out = torch.cat(ex.outputs).contiguous()
        else:
            shape = (*batch[self.spec.tokens].shape, *probe.logits_shape)
            out = torch.empty(shape, dtype=probe.logits_dtype, device=self.device)
        last = lay.to_global(lay.peer(lay.pp - 1))
        for s in range(lay.pp - 1):
            peer = lay.to_global(lay.peer(s))
            if lay.is_last:
                with communicating(f"send of the head's output to rank {peer}", self.timeout):
                    dist.send(out, peer)
            elif lay.stage == s:
                with communicating(f"recv of the head's output from rank {last}", self.timeout):
                    dist.recv(out, last)
        return out

    def _finish(self, batch: dict[str, Tensor], record: StepRecord, plan: Schedule,
                grouped: GroupedPlan | None, mode: StepMode) -> StepResult:
        """Global loss, metrics and count; gradients normalized by the count."""
        assert self.executor is not None
        mine = torch.tensor([[record.loss, record.count]], dtype=torch.float64,
                            device=self.device)
        totals = torch.cat([mine, self.executor.metric_sums()])
        if self.layout.tp_rank != 0:  # the TP group's processes hold the same loss: count once
            totals.zero_()
        with communicating("all-reduce of the loss over all ranks", self.timeout):
            dist.all_reduce(totals)
        loss_sum, count = (float(v) for v in totals[0].cpu())
        if count <= 0:
            raise OmniRuntimeError("loss: the global batch has no loss terms (count 0)")
        if mode == StepMode.TRAIN:
            with torch.no_grad():
                for p in self.executor.owned_params():
                    if p.grad is not None:
                        p.grad.div_(count)
        metrics = {name: (totals[i + 1, 0] / totals[i + 1, 1]).cpu()
                   for i, name in enumerate(self.spec.metrics)}
        tokens = int(batch[self.spec.tokens].numel()) * self.layout.dp
        return StepResult(torch.tensor(loss_sum / count, dtype=torch.float64), record, plan,
                          tokens, grouped, metrics)

