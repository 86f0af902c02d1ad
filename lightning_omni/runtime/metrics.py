"""Per-step metrics: throughput, measured bubble, saved-activation peaks, measured vs predicted.

The prediction prices this step's plan in the simulator with this step's measured compute
durations (messages free, collectives at their measured time): the gap to the measured step is
what the model leaves out (message latency, Python overhead, waiting on slower replicas).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from ..plan.schedule import COMPUTE_KINDS, Action, Kind, Schedule
from ..plan.simulate import SimResult, StepCosts, simulate

if TYPE_CHECKING:
    from .engine import StepResult
    from .layout import Layout


def gather_timings(result: StepResult, tp: int = 1) -> list[list[tuple[Action, float, float]]]:
    """Every plan rank's (action, start, end) list, on every rank (with tensor parallelism:
    TP rank 0's of each plan rank)."""
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, result.record.timings)
    return out[::tp]


def measured_costs(plan: Schedule, timings: list[list[tuple[Action, float, float]]]) -> StepCosts:
    """Simulator prices taken from measured durations of the same plan's actions."""
    # by (rank, kind, microbatch, stage): an interleaved rank runs one action per model chunk
    compute: dict[tuple[int, Kind, int, int], float] = {}
    collective: dict[tuple[int, int], float] = {}
    for rank, rows in enumerate(timings):
        n_coll = 0
        for a, t0, t1 in rows:
            if a.kind in COMPUTE_KINDS:
                compute[rank, a.kind, a.microbatch, a.stage] = t1 - t0
            elif a.kind in (Kind.ALLREDUCE, Kind.ALLTOALL):
                collective[rank, n_coll] = t1 - t0
                n_coll += 1
    counters: dict[int, int] = {}

    def coll(rank: int, a: Action) -> float:
        # the group rendezvous is simulated; price a collective by its fastest member's time
        i = counters.get(rank, 0)
        counters[rank] = i + 1
        return min(collective.get((r, i), 0.0) for r in (a.group or (rank,)))

    return StepCosts(lambda r, a: compute.get((r, a.kind, a.microbatch, a.stage), 0.0),
                     lambda r, a: 0.0, coll, lambda r, a: 0.0, lambda r: 0.0, float("inf"))


def predict(plan: Schedule, timings: list[list[tuple[Action, float, float]]],
            record_timeline: bool = False) -> SimResult:
    return simulate(plan, measured_costs(plan, timings), record_timeline=record_timeline)


def step_metrics(result: StepResult, layout: Layout) -> dict[str, float]:
    """Collective: call on every rank. Returns the metrics to log (meaningful on rank 0)."""
    rec = result.record
    mine = torch.tensor([rec.seconds, rec.busy_seconds, float(rec.peak_saved_bytes),
                         float(rec.cuda_peak_bytes), float(rec.bytes_sent)],
                        dtype=torch.float64)
    rows = [torch.zeros_like(mine) for _ in range(layout.global_world_size)]
    if dist.get_backend() == "nccl":  # NCCL collectives need device tensors
        dev = torch.device("cuda", torch.cuda.current_device())
        mine, rows = mine.to(dev), [r.to(dev) for r in rows]
    dist.all_gather(rows, mine)
    rows = rows[::layout.tp]  # per plan rank: its TP rank 0 (the plan's rank)
    timings = gather_timings(result, layout.tp)
    step = max(float(r[0]) for r in rows)
    metrics = {"omni/loss": float(result.loss),
               "omni/step_ms": 1e3 * step,
               "omni/tokens_per_s": result.tokens / step if step > 0 else 0.0}
    bubbles = [1.0 - float(r[1]) / step if step > 0 else 0.0 for r in rows]
    metrics["omni/bubble_fraction"] = sum(bubbles) / len(bubbles)
    for s in range(layout.pp):
        ranks = layout.stage_group(s)
        metrics[f"omni/bubble_fraction/stage{s}"] = max(bubbles[r] for r in ranks)
        metrics[f"omni/peak_saved_activation_mb/stage{s}"] = max(
            float(rows[r][2]) for r in ranks) / 2**20
        if any(float(rows[r][3]) > 0 for r in ranks):
            metrics[f"omni/cuda_peak_mb/stage{s}"] = max(float(rows[r][3]) for r in ranks) / 2**20
    metrics["omni/predicted_step_ms"] = 1e3 * predict(result.plan, timings).step_seconds
    if result.grouped is not None:  # LSSP / grouped reordering: the plan's facts, bytes moved
        metrics.update(result.grouped.metrics())
        metrics["encoder/bytes_exchanged"] = sum(float(r[4]) for r in rows)
    return metrics


__all__ = ["gather_timings", "measured_costs", "predict", "step_metrics"]
