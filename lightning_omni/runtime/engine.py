"""One pipelined optimization step: plan from the batch, execute, normalize, measure.

Every rank builds the same plan for all replicas from the replicas' sample metadata (one small
all-gather per step), executes its own list, and then divides its gradients by the global number
of loss terms, so the update equals one large-batch step of the plain module.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta
from functools import lru_cache

import torch
import torch.distributed as dist
from torch import Tensor

from ..plan.lssp_schedule import (
    GroupedPlan,
    GroupOptions,
    build_grouped_plan,
    locality_subgroups,
    sp_subgroups,
)
from ..plan.schedule import (
    Schedule,
    assign_encoder_samples,
    encoder_first_stage,
    for_replicas,
    uniform_insertion,
    with_completion_points,
)
from ..spec import OmniSpec
from .alltoall import SubgroupCache
from .executor import OmniRuntimeError, StageExecutor, StepRecord, split_microbatches
from .layout import Layout

SCHEDULES = ("encoder_first_stage", "uniform_insertion")


@lru_cache(maxsize=64)
def build_plan(schedule: str, pipeline: int, costs: tuple) -> Schedule:
    """The step's plan for all replicas. ``costs[d][m][i]``: encoder cost of sample i of
    microbatch m in replica d (0: no encoder input)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule: expected one of {SCHEDULES}, got {schedule!r}")
    reps = []
    for rep_costs in costs:
        n = len(rep_costs)
        if schedule == "uniform_insertion":
            # stage 0 runs its share inline (no run-ahead), so it keeps its share of the
            # drain microbatches too (fewer encoder backwards left after the last B)
            samples, shares = assign_encoder_samples(rep_costs, pipeline,
                                                     skip_stage0_drain=False)
            reps.append(uniform_insertion(pipeline, n, shares, samples=samples,
                                          inline_stage0=True))
        else:
            own = [tuple(i for i, c in enumerate(row) if c > 0) for row in rep_costs]
            reps.append(encoder_first_stage(pipeline, n, samples=own))
    return with_completion_points(for_replicas(reps))


@dataclass
class StepResult:
    loss: Tensor
    record: StepRecord
    plan: Schedule
    tokens: int
    grouped: GroupedPlan | None = None  # encoder group work (LSSP / grouped reordering)


class OmniEngine:
    """Owns this rank's executor and the per-step protocol around it."""

    def __init__(self, spec: OmniSpec, layout: Layout, schedule: str, num_microbatches: int,
                 timeout: timedelta, device: torch.device,
                 group_options: GroupOptions | None = None,
                 ulysses_backend: str = "auto") -> None:
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule: expected one of {SCHEDULES}, got {schedule!r}")
        if not isinstance(num_microbatches, int) or num_microbatches < 1:
            raise ValueError(f"num_microbatches: expected an int >= 1, got {num_microbatches!r}")
        self.spec, self.layout, self.schedule = spec, layout, schedule
        self.num_microbatches, self.timeout, self.device = num_microbatches, timeout, device
        self.executor: StageExecutor | None = None
        self.groups = self._make_groups()
        # LSSP / grouped reordering: encoder work as group actions of each stage's
        # data-parallel group (see plan.lssp_schedule); None keeps the per-replica plans
        self.group_options = group_options
        self.ulysses_backend = ulysses_backend
        self.cache = self._make_encoder_groups() if group_options is not None else None

    def _make_groups(self) -> dict[tuple[int, ...], object]:
        """Process groups for the plan's collectives, created in the same order on every rank."""
        lay = self.layout
        groups: dict[tuple[int, ...], object] = {tuple(range(lay.world_size)): dist.group.WORLD}
        for s in range(lay.pipeline):
            ranks = lay.stage_group(s)
            if ranks in groups:
                continue
            g = dist.new_group(list(ranks)) if len(ranks) > 1 else None
            groups[ranks] = g
        return groups

    def _make_encoder_groups(self) -> SubgroupCache:
        """Every process group an encoder group action may use (its locality group and the
        SP blocks inside it), created once, in the same order on every rank."""
        lay, opts = self.layout, self.group_options
        if len(opts.locality) != lay.world_size:
            raise ValueError(f"locality_groups: expected one group id per rank "
                             f"({lay.world_size}), got {len(opts.locality)}")
        cache = SubgroupCache()
        for s in range(lay.pipeline):
            for members in locality_subgroups(lay.stage_group(s), opts.locality):
                for ranks in [members, *sp_subgroups(members, opts.heads)]:
                    if ranks in self.groups:
                        g = self.groups[ranks]
                    elif len(ranks) == lay.world_size:
                        g = dist.group.WORLD
                    else:
                        g = dist.new_group(list(ranks))
                        self.groups[ranks] = g
                    if lay.rank in ranks and g is not None:
                        cache.add(ranks, g)
        return cache

    def owns_encoders(self) -> bool:
        return self.schedule == "uniform_insertion" or self.layout.is_first

    # -- first batch: checks, then drop the parts this rank does not host -------------------
    def _first_batch(self, batch: dict[str, Tensor]) -> None:
        self.spec.check_batch(batch)
        self.spec.check_shapes(batch)
        with torch.no_grad():
            h = self.spec.embedding(batch[self.spec.tokens][:1])
        hidden, dtype = int(h.shape[-1]), h.dtype
        ex = StageExecutor(self.spec, self.layout, self.groups, hidden, dtype, self.device,
                           self.timeout, self.owns_encoders())
        keep = {id(p) for p in ex.owned_params()}
        for mod in self._all_modules():
            for p in mod.parameters():
                if id(p) not in keep:
                    # not hosted here: free the storage (the optimizer skips grad-less params)
                    p.data = torch.empty(0, dtype=p.dtype, device=p.device)
                    p.grad = None
        if self.group_options is not None:
            ex.cache, ex.ulysses_backend = self.cache, self.ulysses_backend
            self.group_options = self._row_bytes(batch, hidden, dtype)
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

    def _all_modules(self):
        yield self.spec.embedding
        yield self.spec.head
        yield from self.spec.blocks
        for m in self.spec.modalities:
            yield m.encoder

    def hosted_names(self, module: torch.nn.Module) -> set[str]:
        """Names (in ``module.state_dict()``) of the parameters this rank hosts."""
        assert self.executor is not None
        mine = {id(p) for p in self.executor.owned_params()}
        return {n for n, p in module.named_parameters() if id(p) in mine}

    def hosted_param_ids(self) -> set[int]:
        if self.executor is None:
            owned = StageExecutor(self.spec, self.layout, self.groups, 1, torch.float32,
                                  self.device, self.timeout, self.owns_encoders()).owned_params()
        else:
            owned = self.executor.owned_params()
        return {id(p) for p in owned}

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

    def _grouped_plan(self, mbs: list[dict[str, Tensor]]) -> GroupedPlan:
        lay = self.layout
        everyone: list = [None] * lay.world_size
        try:
            dist.all_gather_object(everyone, self.sample_lengths(mbs))
        except RuntimeError as err:
            raise OmniRuntimeError(f"rank {lay.rank}: gathering the step's sample metadata "
                                   f"failed; a peer rank has probably died ({err})") from err
        for r, got in enumerate(everyone):
            first = (r // lay.pipeline) * lay.pipeline
            if got != everyone[first]:
                raise ValueError(f"batch: rank {r} loaded other samples than rank {first} of the "
                                 "same pipeline replica; every stage of a replica must read the "
                                 "replica's shard (the same batches in the same order)")
        lengths = tuple(everyone[d * lay.pipeline] for d in range(lay.data))
        names = tuple(m.name for m in self.spec.modalities)
        return build_grouped_plan(self.schedule, lay.pipeline, lengths, self.group_options,
                                  names)

    def step(self, batch: dict[str, Tensor]) -> StepResult:
        if self.executor is None:
            self._first_batch(batch)
        assert self.executor is not None
        mbs = split_microbatches(batch, self.num_microbatches)
        if self.group_options is not None:
            return self._finish(batch, *self._run_grouped(mbs))
        local = self.sample_costs(mbs)
        everyone: list = [None] * self.layout.world_size
        try:
            dist.all_gather_object(everyone, local)
        except RuntimeError as err:
            raise OmniRuntimeError(f"rank {self.layout.rank}: gathering the step's sample "
                                   f"metadata failed; a peer rank has probably died ({err})"
                                   ) from err
        costs = tuple(everyone[d * self.layout.pipeline] for d in range(self.layout.data))
        plan = build_plan(self.schedule, self.layout.pipeline, costs)
        record = self.executor.run(plan.actions[self.layout.rank], mbs)
        return self._finish(batch, record, plan)

    def _run_grouped(self, mbs: list[dict[str, Tensor]]
                     ) -> tuple[StepRecord, Schedule, GroupedPlan]:
        gp = self._grouped_plan(mbs)
        record = self.executor.run(gp.schedule.actions[self.layout.rank], mbs, grouped=gp)
        return record, gp.schedule, gp

    def _finish(self, batch: dict[str, Tensor], record: StepRecord, plan: Schedule,
                grouped: GroupedPlan | None = None) -> StepResult:
        """Global loss and count, gradients normalized by the count."""
        assert self.executor is not None
        totals = torch.tensor([record.loss, record.count], dtype=torch.float64,
                              device=self.device)
        try:
            dist.all_reduce(totals)
        except RuntimeError as err:
            raise OmniRuntimeError(f"rank {self.layout.rank}: reducing the loss failed; a peer "
                                   f"rank has probably died ({err})") from err
        loss_sum, count = (float(v) for v in totals.cpu())
        if count <= 0:
            raise OmniRuntimeError("loss: the global batch has no loss terms (count 0)")
        with torch.no_grad():
            for p in self.executor.owned_params():
                if p.grad is not None:
                    p.grad.div_(count)
        tokens = int(batch[self.spec.tokens].numel()) * self.layout.data
        return StepResult(torch.tensor(loss_sum / count, dtype=torch.float64), record, plan,
                          tokens, grouped)
