"""One pipelined optimization step: plan from the batch, execute, normalize, measure.

Every rank builds the same plan for all replicas from the replicas' sample metadata (one small
all-gather per step), executes its own list, and then divides its gradients by the global number
of loss terms, so the update equals one large-batch step of the plain module.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from functools import lru_cache

import torch
import torch.distributed as dist
from torch import Tensor

from ..plan.schedule import (
    Schedule,
    assign_encoder_samples,
    encoder_first_stage,
    for_replicas,
    uniform_insertion,
    with_completion_points,
)
from ..spec import OmniSpec
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


class OmniEngine:
    """Owns this rank's executor and the per-step protocol around it."""

    def __init__(self, spec: OmniSpec, layout: Layout, schedule: str, num_microbatches: int,
                 timeout: timedelta, device: torch.device) -> None:
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule: expected one of {SCHEDULES}, got {schedule!r}")
        if not isinstance(num_microbatches, int) or num_microbatches < 1:
            raise ValueError(f"num_microbatches: expected an int >= 1, got {num_microbatches!r}")
        self.spec, self.layout, self.schedule = spec, layout, schedule
        self.num_microbatches, self.timeout, self.device = num_microbatches, timeout, device
        self.executor: StageExecutor | None = None
        self.groups = self._make_groups()

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
        self.executor = ex

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

    def step(self, batch: dict[str, Tensor]) -> StepResult:
        if self.executor is None:
            self._first_batch(batch)
        assert self.executor is not None
        mbs = split_microbatches(batch, self.num_microbatches)
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
                          tokens)
