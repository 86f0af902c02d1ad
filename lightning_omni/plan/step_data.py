"""One sampled training step of a scenario, its per-sample costs, and how replicas see it.

Shared by every system and every layout of a search, so it caches what layouts share: replica
assignments, per-microbatch length moments, schedules and their memory traces.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .costs import CostModel, SampleMeta
from .reorder import Item, plan_reorder
from .scenario import Scenario
from .schedule import COMPUTE_KINDS, Action, Kind, Schedule
from .step_cache import (
    AssignKey,
    EncoderAssignment,
    EncoderSplit,
    LlmTableKey,
    Memo,
    ScheduleKey,
    SplitKey,
)
from .workload import draw_samples, pack_sequences

PATCH_BYTES = 14 * 14 * 3


class StepData:
    """The sampled step of a scenario and per-sample costs, shared by every system."""

    def __init__(self, scenario: Scenario, cost: CostModel) -> None:
        self.scenario = scenario
        self.cost = cost
        target = scenario.global_batch * scenario.seq_len
        samples: list[SampleMeta] = []
        seqs: list[list[SampleMeta]] = []
        attempt = 0
        while len(seqs) < scenario.global_batch:
            samples = draw_samples(scenario.mixture, int(target * (1.1 + 0.2 * attempt)),
                                   scenario.seed, max_llm_tokens=scenario.seq_len)
            seqs = pack_sequences(samples, scenario.seq_len)
            attempt += 1
        self.sequences = seqs[: scenario.global_batch]
        self.samples = [s for seq in self.sequences for s in seq]
        self.llm_tokens = np.array([s.llm_tokens for s in self.samples], dtype=np.float64)
        self.enc_tokens = np.array([s.encoder_tokens() for s in self.samples], dtype=np.float64)
        self.enc_llm_tokens = np.array(
            [sum(g.llm_tokens for g in s.segments if g.encoder_tokens) for s in self.samples],
            dtype=np.float64)
        self.index = {s.sample_id: i for i, s in enumerate(self.samples)}
        # What the reordering all-to-all moves per sample: raw pixels or audio frames per
        # encoder token (a 14x14 RGB patch) and 4-byte text token ids.
        self.sample_bytes = self.enc_tokens * PATCH_BYTES + 4.0 * (
            self.llm_tokens - self.enc_llm_tokens)
        self.exchange_bytes: dict[int, float] = {}
        enc, llm = scenario.encoder, scenario.llm
        nominal = 4096.0
        # Whole-model fwd+bwd seconds on one GPU: the balancing cost of a sample.
        self.enc_unit = (cost.stack_seconds_each(enc, self.enc_tokens, enc.layers,
                                                 batch_tokens=nominal)
                         + cost.stack_seconds_each(enc, self.enc_tokens, enc.layers, phase="bwd",
                                                   batch_tokens=nominal))
        self.enc_unit[self.enc_tokens == 0] = 0.0
        self.llm_unit = (cost.stack_seconds_each(llm, self.llm_tokens, llm.layers,
                                                 batch_tokens=nominal)
                         + cost.stack_seconds_each(llm, self.llm_tokens, llm.layers, phase="bwd",
                                                   batch_tokens=nominal))
        self._replicas: dict[tuple[str, int], list[list[list[int]]]] = {}
        self._moments: dict[tuple[str, int, int], np.ndarray] = {}
        self.traces: dict[int, list[tuple[np.ndarray, ...]]] = {}
        self._screen: dict[tuple, tuple[int, ...]] = {}
        # what pricing shares between layouts (``step_cache``)
        self.llm_tables: Memo[LlmTableKey, np.ndarray] = Memo()
        self.schedules: Memo[ScheduleKey, Schedule] = Memo()
        self.encoder_splits: Memo[SplitKey, EncoderSplit] = Memo()
        self.encoder_assignments: Memo[AssignKey, EncoderAssignment] = Memo()

    def memory_traces(self, schedule: Schedule) -> list[tuple[np.ndarray, np.ndarray,
                                                            np.ndarray, np.ndarray]]:
        """Per rank compute-action arrays of a schedule built through ``self.schedules``."""
        key = id(schedule)
        if key not in self.traces:
            self.traces[key] = [_memory_trace(prog) for prog in schedule.actions]
        return self.traces[key]

    def microbatches_per_replica(self, dp: int) -> list[int]:
        base, extra = divmod(self.scenario.global_batch, dp)
        return [base + (1 if d < extra else 0) for d in range(dp)]

    def loader_replicas(self, dp: int) -> list[list[list[int]]]:
        """What each replica's own loader yields: contiguous packed sequences (sample indices)."""
        key = ("loader", dp)
        if key not in self._replicas:
            counts = self.microbatches_per_replica(dp)
            out, start = [], 0
            for c in counts:
                out.append([[self.index[s.sample_id] for s in seq]
                            for seq in self.sequences[start:start + c]])
                start += c
            self._replicas[key] = out
        return self._replicas[key]

    def reordered_replicas(self, dp: int) -> list[list[list[int]]]:
        """Grouped reordering over replicas, then first-fit-decreasing packing per replica."""
        key = ("omni", dp)
        if key not in self._replicas:
            loader = self.loader_replicas(dp)
            counts = self.microbatches_per_replica(dp)
            seq_len = self.scenario.seq_len
            local = [[Item(i, float(self.enc_unit[i] + self.llm_unit[i]),
                           float(self.llm_tokens[i])) for seq in rep for i in seq]
                     for rep in loader]
            group = self.scenario.reorder_group_replicas
            plan = plan_reorder(local, [d // group for d in range(dp)],
                                memory_cap=max(counts) * seq_len)
            out = [_pack_ffd(list(a), self.llm_tokens, counts[d], seq_len)
                   for d, a in enumerate(plan.assignment)]
            self._replicas[key] = out
            moved = [max(sum(self.sample_bytes[i] for ids in plan.sends[d].values()
                             for i in ids),
                         sum(self.sample_bytes[i] for ids in plan.recvs[d].values()
                             for i in ids)) for d in range(dp)]
            self.exchange_bytes[dp] = float(max(moved, default=0.0))
        return self._replicas[key]

    def replicas(self, kind: str, dp: int) -> list[list[list[int]]]:
        """Every replica's microbatches (sample indices): reordered for ``kind == "omni"``,
        else as the loaders yield them."""
        return self.reordered_replicas(dp) if kind == "omni" else self.loader_replicas(dp)

    def llm_moments(self, kind: str, dp: int, replica: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per microbatch of one replica: samples, sum and sum of squares of their LLM
        lengths (document-masked attention is per sample)."""
        key = (kind, dp, replica)
        if key not in self._moments:
            mbs = self.replicas(kind, dp)[replica]
            lens = [self.llm_tokens[mb] for mb in mbs]
            self._moments[key] = np.array([[len(x), x.sum(), (x * x).sum()] for x in lens]).T
        calls, s1, s2 = self._moments[key]
        return calls, s1, s2

    def screen_replicas(self, kind: str, dp: int) -> tuple[int, ...]:
        """Replicas a closed-form screen looks at: (the heaviest by the balancing cost, the
        one with the most encoder tokens in a microbatch), for time and memory. The final
        check prices every replica (``pricing.predict``)."""
        key = ("screen", kind, dp)
        if key not in self._screen:
            reps = self.replicas(kind, dp)
            loads = [sum(float(self.enc_unit[i] + self.llm_unit[i]) for mb in rep for i in mb)
                     for rep in reps]
            enc = [max((float(self.enc_tokens[mb].sum()) for mb in rep), default=0.0)
                   for rep in reps]
            self._screen[key] = (int(np.argmax(loads)), int(np.argmax(enc)))
        return self._screen[key]


def _pack_ffd(indices: list[int], tokens: np.ndarray, bins: int, capacity: int) -> list[list[int]]:
    order = sorted(indices, key=lambda i: (-tokens[i], i))
    fill = [0.0] * bins
    out: list[list[int]] = [[] for _ in range(bins)]
    for i in order:
        fits = [b for b in range(bins) if fill[b] + tokens[i] <= capacity]
        b = fits[0] if fits else min(range(bins), key=lambda x: (fill[x], x))
        out[b].append(i)
        fill[b] += tokens[i]
    return out


def _memory_trace(prog: Sequence[Action]) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                   np.ndarray]:
    """Compute actions of one program as arrays: is-LLM, microbatch, +1 forward / -1 backward,
    and the LLM (virtual) stage (0 for encoder actions)."""
    rows = [(a.kind in (Kind.LLM_FWD, Kind.LLM_BWD), a.microbatch,
             1.0 if a.kind in (Kind.LLM_FWD, Kind.ENC_FWD) else -1.0,
             max(a.stage, 0) if a.kind in (Kind.LLM_FWD, Kind.LLM_BWD) else 0)
            for a in prog if a.kind in COMPUTE_KINDS]
    if not rows:
        return np.zeros(0, bool), np.zeros(0, int), np.zeros(0), np.zeros(0, int)
    arr = np.array(rows, dtype=np.float64)
    return arr[:, 0].astype(bool), arr[:, 1].astype(int), arr[:, 2], arr[:, 3].astype(int)
