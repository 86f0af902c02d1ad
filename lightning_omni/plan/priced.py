"""A schedule with its prices, and the closed forms that rank layouts without simulating.

Both ``pricing`` (which builds a ``PricedStep`` and estimates every replica) and ``search``
(which screens layouts) need these; they live here so that neither imports the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .schedule import Schedule
from .simulate import StepCosts

MemoryTrace = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # ``StepData.memory_traces``


@dataclass
class PricedStep:
    """A schedule with its prices, plus the tables behind them (for the fast estimate).
    ``enc_*`` are keyed by (rank, microbatch); ``llm_*`` are indexed ``[virtual stage][mb]``."""

    schedule: Schedule
    costs: StepCosts
    llm_fwd: list[np.ndarray]
    llm_bwd: list[np.ndarray]
    llm_act: list[np.ndarray]
    enc_fwd: dict[tuple[int, int], float]
    enc_bwd: dict[tuple[int, int], float]
    enc_mem: dict[tuple[int, int], float]
    static: list[float]
    collective_seconds: list[float]


def peak_bytes(pr: PricedStep, traces: Sequence[MemoryTrace], num_microbatches: int
               ) -> list[float]:
    """Exact peak bytes of every rank of one replica: static memory plus the largest running
    sum of activation deltas in program order (what the simulator also computes)."""
    n = num_microbatches
    enc_mem: dict[int, np.ndarray] = {}
    for (r, m), b in pr.enc_mem.items():
        enc_mem.setdefault(r, np.zeros(n))[m] = b
    zeros = np.zeros(n)
    acts = np.stack(pr.llm_act)  # [virtual stage, microbatch]
    peaks = []
    for rank in range(pr.schedule.num_ranks):
        is_llm, mbs, signs, stages = traces[rank]
        if mbs.size:
            deltas = np.where(is_llm, acts[stages, mbs], enc_mem.get(rank, zeros)[mbs]) * signs
            peaks.append(pr.static[rank] + max(0.0, float(np.cumsum(deltas).max())))
        else:
            peaks.append(pr.static[rank])
    return peaks


def estimate_seconds(pr: PricedStep, num_microbatches: int) -> float:
    """Step seconds in closed form: the busiest rank's work plus a pipeline warm-up term. It
    only ranks candidates (and replicas) before the most promising are simulated, with the
    same formula for every system."""
    sched = pr.schedule
    enc_work: dict[int, float] = {}
    for (r, m), t in pr.enc_fwd.items():
        enc_work[r] = enc_work.get(r, 0.0) + t + pr.enc_bwd.get((r, m), 0.0)
    work = []
    pp = sched.num_stages
    for rank in range(sched.num_ranks):
        stage = sched.stage_of(rank)
        busy = enc_work.get(rank, 0.0) + pr.collective_seconds[rank]
        if stage >= 0:  # every virtual stage (model chunk) of this rank
            busy += sum(pr.llm_fwd[k].sum() + pr.llm_bwd[k].sum()
                        for k in range(stage, len(pr.llm_fwd), pp))
        work.append(float(busy))
    slowest = max(work)
    # warm-up and drain: (pp - 1) of vpp * n chunk slots (Narayanan et al. 2021, sec. 2.2.2)
    return slowest + (pp - 1) * slowest / max(num_microbatches * sched.num_chunks, 1)
