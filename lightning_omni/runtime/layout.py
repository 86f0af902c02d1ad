"""Where a rank sits: its data-parallel replica, pipeline stage and tensor-parallel rank, and
which blocks it hosts.

Plans, hosting and the executor work on *plan ranks* (``replica * pp + stage``), one per
(replica, stage) pair, exactly as without tensor parallelism. Each plan rank is ``tp`` processes
(its TP group, innermost): ``global rank = plan_rank * tp + tp_rank``. The ``tp`` processes of a
plan rank run the same plan on the same samples, each with its own shard of the stage's
tensor-parallel weights, so every collective and message of the plan happens once per TP rank,
between the processes of the same ``tp_rank`` (``global_rank``).

With ``vpp`` model chunks per rank (an interleaved pipeline) the blocks are cut into
``pp * vpp`` virtual stages; virtual stage ``k = chunk * pp + stage`` is chunk ``chunk`` of the
ranks of ``stage`` (``plan.interleaved``), so the embedding sits on stage 0 and the head on
stage ``pp - 1`` as without chunks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lightning_omnilab.validate import positive_int


@dataclass(frozen=True)
class Layout:
    """Plan ranks are numbered replica by replica: ``rank = replica * pp + stage``;
    ``world_size = pp * dp`` plan ranks (the process world is ``world_size * tp``)."""

    world_size: int
    rank: int
    pp: int  # pipeline stages per replica (``OmniStrategy(pipeline_parallel=)``)
    dp: int  # data-parallel replicas (``OmniStrategy(data_parallel=)``)
    block_bounds: tuple[tuple[int, int], ...]  # [lo, hi) per virtual stage (chunk * pp + stage)
    vpp: int = 1  # model chunks per rank (``OmniStrategy(virtual_pipeline_parallel=)``)
    tp: int = 1  # processes per plan rank (``OmniStrategy(tensor_parallel=)``)
    tp_rank: int = 0  # this process's place in its plan rank's TP group

    @property
    def stage(self) -> int:
        return self.rank % self.pp

    @property
    def replica(self) -> int:
        return self.rank // self.pp

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.pp - 1

    def peer(self, stage: int) -> int:
        """Plan rank of ``stage`` in this rank's replica."""
        return self.replica * self.pp + stage

    @property
    def global_rank(self) -> int:
        """This process's rank in the process world."""
        return self.rank * self.tp + self.tp_rank

    @property
    def global_world_size(self) -> int:
        return self.world_size * self.tp

    def to_global(self, plan_rank: int) -> int:
        """The process of ``plan_rank`` with this process's ``tp_rank`` (the one this process
        exchanges messages and plan collectives with)."""
        return plan_rank * self.tp + self.tp_rank

    def tp_slice(self, plan_ranks: Sequence[int], tp_rank: int) -> tuple[int, ...]:
        """Global ranks of ``plan_ranks`` at ``tp_rank``."""
        return tuple(r * self.tp + tp_rank for r in plan_ranks)

    def tp_group(self) -> tuple[int, ...]:
        """Global ranks of this plan rank's TP group."""
        return tuple(self.rank * self.tp + t for t in range(self.tp))

    def stage_group(self, stage: int) -> tuple[int, ...]:
        """Ranks hosting ``stage`` in every replica (its data-parallel group)."""
        return tuple(replica * self.pp + stage for replica in range(self.dp))

    def chunk_bounds(self, stage: int) -> tuple[tuple[int, int], ...]:
        """[lo, hi) of each model chunk of ``stage``, chunk by chunk."""
        return tuple(self.block_bounds[c * self.pp + stage] for c in range(self.vpp))

    def chunk_of(self, virtual_stage: int) -> int:
        """Model chunk of a virtual stage (what a plan's LLM action names in ``stage``)."""
        return virtual_stage // self.pp


def make_layout(world_size: int, rank: int, pp: int, dp: int,
                block_costs: Sequence[float], stage_blocks: Sequence[int] | None = None,
                vpp: int = 1, tp: int = 1) -> Layout:
    """Check the parallel sizes against the process world (``world_size`` processes, this one
    global ``rank``) and cut the blocks into ``pp * vpp`` (virtual) stages."""
    check_world(world_size, pp, dp, tp)
    positive_int("virtual_pipeline_parallel", vpp)
    n, parts = len(block_costs), pp * vpp
    what = f"{pp}" if vpp == 1 else f"pipeline_parallel * virtual_pipeline_parallel = {parts}"
    if stage_blocks is not None:
        if len(stage_blocks) != parts or any(b < 1 for b in stage_blocks) or \
                sum(stage_blocks) != n:
            raise ValueError(f"stage_blocks: expected {what} positive counts summing to "
                             f"{n} blocks, got {list(stage_blocks)}")
        counts = list(stage_blocks)
    else:
        if vpp > 1 and parts > n:
            raise ValueError(f"virtual_pipeline_parallel: expected at most {n // pp} (every "
                             f"one of pipeline_parallel={pp} x virtual_pipeline_parallel "
                             f"virtual stages needs one of the {n} blocks), got {vpp}")
        counts = partition_blocks(block_costs, parts)
    bounds, lo = [], 0
    for c in counts:
        bounds.append((lo, lo + c))
        lo += c
    return Layout(pp * dp, rank // tp, pp, dp, tuple(bounds), vpp, tp, rank % tp)


def check_world(world: int, pp: int, dp: int, tp: int, world_is: str = "") -> None:
    """The layout fills the process world: ``pp * dp * tp == world``. ``world_is``: where
    the world size comes from, for the message."""
    if pp < 1 or dp < 1 or tp < 1 or pp * dp * tp != world:
        raise ValueError(f"pipeline_parallel * data_parallel * tensor_parallel: expected the "
                         f"world size {world}{world_is}, got {pp} * {dp} * {tp} = {pp * dp * tp}")


def partition_blocks(costs: Sequence[float], parts: int) -> list[int]:
    """Contiguous split of ``costs`` into ``parts`` non-empty runs minimizing the largest run's
    sum (exact dynamic program; block counts are small)."""
    n = len(costs)
    if parts > n:
        raise ValueError(f"pipeline_parallel: expected at most {n} (the number of blocks), "
                         f"got {parts}")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[k][i]: minimal max-sum splitting the first i blocks into k runs
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                v = max(best[k - 1][j], prefix[i] - prefix[j])
                if v < best[k][i]:
                    best[k][i], cut[k][i] = v, j
    counts, i = [], n
    for k in range(parts, 0, -1):
        j = cut[k][i]
        counts.append(i - j)
        i = j
    return counts[::-1]
