"""Encoder work as group actions of data-parallel groups: LSSP and grouped reordering in a step.

Ulysses attention and the sample exchange are collectives, so every member of a group must reach
them at the same point of its program. The ranks whose programs align are the ranks of one
pipeline stage in every replica (a stage's data-parallel group): they run the same 1F1B order.
So the step's encoder placement is built ONCE from the samples of all replicas pooled per
microbatch (``assign_encoder_samples`` over the pooled costs), and every replica gets the same
encoder actions: the encoder work of microbatch m placed on stage s is one group action of the
stage's data-parallel group, split into locality groups (a rank -> group map; samples never
leave their group). Inside a group:

* grouped reordering (``plan_reorder``) balances the samples' encoder cost over the members;
* LSSP (``split_microbatch``) runs long samples Ulysses sequence parallel over the block of
  members it chose and short ones data parallel (on their own replica's member unless
  reordering is on too, in which case LSSP's longest-first placement balances them);
* features go back to the member of the sample's replica, which feeds them to its stage 0 like
  any encoder rank does (a FEATURES message, or inline at stage 0).

Members with no samples of their own still run the group action. Each rank's program shows the
group's exchanges as ALLTOALL actions (``SAMPLES`` before the encoder forward, one
``SP_ATTENTION`` per long sample it helps with, ``FEATURES`` after it, and the reverse
``FEATURES`` before the encoder backward), so ``check_schedule`` verifies that the members meet
and the simulator prices them; the runtime performs them inside the ENC_FWD / ENC_BWD next to
them. Pooled sample ids: sample i of replica d's microbatch is ``d * batch + i``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from .costs import _require
from .interleaved import interleave
from .lssp import DP, MicrobatchSplit, WorkItem, sp_degrees, split_microbatch
from .reorder import Item, plan_reorder
from .schedule import (
    SCHEDULES,
    Action,
    Kind,
    Payload,
    Schedule,
    _replace_actions,
    assign_encoder_samples,
    encoder_first_stage,
    for_replicas,
    uniform_insertion,
    with_completion_points,
)

GROUPED_SCHEDULES = SCHEDULES  # both placements take encoder group actions


@dataclass(frozen=True)
class GroupOptions:
    """How encoder groups run. ``locality[r]``: locality group id of global rank r;
    ``heads[k]``: attention heads of modality k's encoder (SP degrees must divide it), 0 for
    an encoder LSSP may not split (``runtime.splittable``): its samples always run whole;
    a sample's encoder cost is ``seconds_per_token * L + seconds_per_token_pair * L**2``;
    ``max_rows``: encoder rows of one sample a rank may hold (LSSP's memory cap); byte sizes
    (per modality: an input row, a feature row, one row through all Ulysses rounds) are only
    for the ALLTOALL counts the simulator prices."""

    lssp: bool
    reorder: bool
    locality: tuple[int, ...]
    heads: tuple[int, ...]
    seconds_per_token: float = 1.0
    seconds_per_token_pair: float = 0.0
    max_rows: float = math.inf
    in_row_bytes: tuple[int, ...] = ()
    out_row_bytes: int = 0
    sp_row_bytes: tuple[int, ...] = ()

    def cost(self, rows: int) -> float:
        return self.seconds_per_token * rows + self.seconds_per_token_pair * rows * rows


@dataclass(frozen=True)
class GroupWork:
    """One group action: microbatch ``microbatch``'s encoder work at ``stage`` over
    ``members`` (global ranks, ascending; ``replicas[j]`` is member j's replica). Per modality:
    the LSSP split (SP groups and DP samples in member indices; None: no samples), the rows of
    each pooled sample and the member that owns it (loaded it, wants its features)."""

    microbatch: int
    stage: int
    members: tuple[int, ...]
    replicas: tuple[int, ...]
    splits: tuple[MicrobatchSplit | None, ...]
    lengths: tuple[Mapping[int, int], ...]
    owner: tuple[Mapping[int, int], ...]
    load_before: tuple[float, ...]
    load_after: tuple[float, ...]

    @property
    def empty(self) -> bool:
        return all(s is None for s in self.splits)

    def moved(self) -> int:
        """Samples encoded (wholly or partly) away from their owner."""
        n = 0
        for split, owner in zip(self.splits, self.owner, strict=True):
            if split is None:
                continue
            n += sum(1 for j, sids in enumerate(split.dp_samples) for s in sids if owner[s] != j)
            n += len(split.sp_groups)
        return n


@dataclass(frozen=True)
class GroupedPlan:
    """The step's schedule for all replicas and the group work behind its encoder actions."""

    schedule: Schedule
    batch: int  # samples per microbatch and replica
    works: tuple[GroupWork, ...]

    def work(self, microbatch: int, rank: int) -> GroupWork:
        for w in self.works:
            if w.microbatch == microbatch and rank in w.members:
                return w
        raise KeyError(f"no encoder group action of microbatch {microbatch} on rank {rank}")

    def metrics(self) -> dict[str, float]:
        """Encoder load imbalance before and after the group plans (the group actions' summed
        largest member load over their summed mean member load: a group action lasts as long
        as its slowest member), samples moved, long samples and their SP degrees."""

        def ratio(loads) -> float:
            peak = sum(max(x) for x in loads)
            mean = sum(sum(x) / len(x) for x in loads)
            return peak / mean if mean > 0 else 1.0

        degrees = [len(g.ranks) for w in self.works for s in w.splits if s is not None
                   for g in s.sp_groups]
        return {"reorder/imbalance_before": ratio([w.load_before for w in self.works]),
                "reorder/imbalance_after": ratio([w.load_after for w in self.works]),
                "reorder/samples_moved": float(sum(w.moved() for w in self.works)),
                "lssp/long_samples": float(len(degrees)),
                "lssp/sp_degree_max": float(max(degrees, default=1)),
                "lssp/sp_degree_mean": float(sum(degrees) / len(degrees)) if degrees else 1.0}


def locality_subgroups(ranks: Sequence[int], locality: Sequence[int]) -> list[tuple[int, ...]]:
    """``ranks`` split by locality id (ascending ranks in each, groups by their first rank)."""
    by: dict[int, list[int]] = {}
    for r in ranks:
        by.setdefault(locality[r], []).append(r)
    return sorted((tuple(sorted(v)) for v in by.values()), key=lambda g: g[0])


def sp_subgroups(members: Sequence[int], heads: Sequence[int]) -> list[tuple[int, ...]]:
    """Every rank block an SP sample may use in a group of ``members`` (what the LSSP planner
    picks from: aligned power-of-two blocks), to create the process groups once up front."""
    n = len(members)
    out: list[tuple[int, ...]] = []
    for h in heads:
        for k in sp_degrees(n, h) if h >= 1 else []:
            if k < 2:
                continue
            for b in range(0, n - k + 1, k):
                g = tuple(members[b:b + k])
                if g not in out:
                    out.append(g)
    return out


def _split(m: int, items: list[WorkItem], owner: Mapping[int, int], n: int, heads: int,
           opts: GroupOptions) -> MicrobatchSplit:
    """One modality's plan in one group (see the module docstring)."""
    by_owner = [[it for it in items if owner[it.sample_id] == j] for j in range(n)]
    if opts.lssp and n > 1 and heads >= 1:
        split = split_microbatch(items, n, heads, opts.max_rows, m)
        if not opts.reorder:  # short samples stay with their owner
            sp_ids = {g.sample_id for g in split.sp_groups}
            dp_samples = tuple(tuple(it.sample_id for it in own if it.sample_id not in sp_ids)
                       for own in by_owner)
            split = replace(split, dp_samples=dp_samples)
        return split
    if opts.reorder and n > 1:
        plan = plan_reorder([[Item(it.sample_id, it.seconds) for it in own] for own in by_owner],
                            [0] * n)
        dp_samples = plan.assignment
    else:
        dp_samples = tuple(tuple(it.sample_id for it in own) for own in by_owner)
    return MicrobatchSplit(m, (DP,), (), tuple(tuple(sorted(d)) for d in dp_samples),
                           (0.0,) * n, (0.0,) * n)


def _check_rows(rows: int, where: str, n: int, heads: int, opts: GroupOptions) -> None:
    """A sample too long for ``max_rows`` even at the largest SP degree: a clear error."""
    if not opts.lssp or rows <= opts.max_rows:
        return
    if heads < 1:  # the encoder is not splittable: its samples always run whole on one rank
        raise ValueError(f"{where}: {rows} encoder rows, over lssp_max_rows={opts.max_rows:g}, "
                         "and LSSP cannot split them: the modality's encoder does not declare "
                         "`splittable_rows = True` (see lightning_omni.runtime.splittable), so "
                         "each of its samples runs whole on one rank; raise lssp_max_rows to "
                         f"at least {rows} or make the encoder splittable")
    top = sp_degrees(n, heads)[-1]
    if rows / top > opts.max_rows:
        raise ValueError(f"{where}: {rows} encoder rows, {math.ceil(rows / top)} per rank at the "
                         f"largest SP degree {top} allowed ({n} ranks in its group, {heads} "
                         f"heads); over lssp_max_rows={opts.max_rows:g}")


def _group_work(m: int, stage: int, members: tuple[int, ...], pp: int, batch: int,
                pooled: Sequence[int], lengths, opts: GroupOptions,
                modality_names: Sequence[str]) -> GroupWork:
    n = len(members)
    replicas = tuple(r // pp for r in members)
    member_of = {d: j for j, d in enumerate(replicas)}
    items: list[list[WorkItem]] = []
    lens: list[dict[int, int]] = []
    owners: list[dict[int, int]] = []
    before, after = [0.0] * n, [0.0] * n
    for k, heads in enumerate(opts.heads):
        its, ln, owner = [], {}, {}
        for g in pooled:
            d, i = divmod(g, batch)
            if d not in member_of:
                continue
            rows = int(lengths[d][m][i][k])
            if rows <= 0:
                continue
            _check_rows(rows, f"sample {i} of microbatch {m} of replica {d} "
                        f"({modality_names[k]})", n, heads, opts)
            its.append(WorkItem(g, opts.cost(rows), float(rows)))
            ln[g], owner[g] = rows, member_of[d]
            before[member_of[d]] += opts.cost(rows)
        items.append(its)
        lens.append(ln)
        owners.append(owner)
    joint = None
    if opts.reorder and n > 1 and not (opts.lssp and any(h >= 1 for h in opts.heads)):
        # one balance over all modalities: a member may encode one sample's image and
        # another's audio; ids k * stride + g keep the modalities' samples apart
        stride = batch * (max(replicas) + 1)
        local = [[Item(k * stride + it.sample_id, it.seconds) for k, its in enumerate(items)
                  for it in its if owners[k][it.sample_id] == j] for j in range(n)]
        joint = (stride, plan_reorder(local, [0] * n).assignment)
    splits: list[MicrobatchSplit | None] = []
    for k, heads in enumerate(opts.heads):
        if not items[k]:
            splits.append(None)
            continue
        if joint is not None:
            stride, assignment = joint
            dp_samples = tuple(tuple(sorted(x - k * stride for x in a if x // stride == k))
                       for a in assignment)
            split = MicrobatchSplit(m, (DP,), (), dp_samples, (0.0,) * n, (0.0,) * n)
        else:
            split = _split(m, items[k], owners[k], n, heads, opts)
        for j, sids in enumerate(split.dp_samples):
            after[j] += sum(opts.cost(lens[k][s]) for s in sids)
        for grp in split.sp_groups:
            for j in grp.ranks:
                after[j] += opts.cost(lens[k][grp.sample_id]) / len(grp.ranks)
        splits.append(split)
    return GroupWork(m, stage, members, replicas, tuple(splits), tuple(lens), tuple(owners),
                     tuple(before), tuple(after))


def _counts(w: GroupWork, j: int, forward_inputs: bool, opts: GroupOptions) -> tuple[int, ...]:
    """Bytes member j sends to each member: inputs (owner -> encoders) or features back."""
    out = [0] * len(w.members)
    for k, split in enumerate(w.splits):
        if split is None:
            continue
        row = opts.in_row_bytes[k] if forward_inputs and opts.in_row_bytes else \
            opts.out_row_bytes
        ln, owner = w.lengths[k], w.owner[k]
        for r, sids in enumerate(split.dp_samples):
            for s in sids:
                src, dst = (owner[s], r) if forward_inputs else (r, owner[s])
                if src == j and dst != j:
                    out[dst] += ln[s] * row
        for g in split.sp_groups:
            c = math.ceil(ln[g.sample_id] / len(g.ranks))
            for i, r in enumerate(g.ranks):
                rows = c if forward_inputs else max(0, min(c, ln[g.sample_id] - i * c))
                src, dst = (owner[g.sample_id], r) if forward_inputs else (r, owner[g.sample_id])
                if src == j and dst != j:
                    out[dst] += rows * row
    return tuple(out)


def _sp_markers(w: GroupWork, j: int, opts: GroupOptions) -> list[Action]:
    out = []
    for k, split in enumerate(w.splits):
        if split is None:
            continue
        for g in split.sp_groups:
            if j not in g.ranks:
                continue
            c = math.ceil(w.lengths[k][g.sample_id] / len(g.ranks))
            per = c * (opts.sp_row_bytes[k] if opts.sp_row_bytes else 0) // len(g.ranks)
            out.append(Action(Kind.ALLTOALL, w.microbatch, w.stage, payload=Payload.SP_ATTENTION,
                              samples=(g.sample_id,),
                              group=tuple(w.members[r] for r in g.ranks),
                              counts=tuple(0 if r == j else per for r in g.ranks)))
    return out


def _own(samples: Sequence[int], replica: int, batch: int) -> tuple[int, ...]:
    return tuple(g - replica * batch for g in samples if replica * batch <= g < (replica + 1)
                 * batch)


@lru_cache(maxsize=64)
def build_grouped_plan(schedule: str, pp: int, lengths: tuple, opts: GroupOptions,
                       modality_names: tuple[str, ...] = (), vpp: int = 1) -> GroupedPlan:
    """The step's plan with encoder group actions (see the module docstring).

    ``lengths[d][m][i][k]``: encoder rows of modality k in sample i of microbatch m of
    replica d (0: none); every replica has the same number of microbatches and samples.
    ``vpp``: model chunks per rank; the template's encoder placement is re-threaded into the
    interleaved order (``interleaved.interleave``) before the group actions join it, so every
    member of a group meets its collectives in the same order as without chunks."""
    _require(schedule in GROUPED_SCHEDULES, "schedule", f"one of {GROUPED_SCHEDULES}", schedule)
    dp = len(lengths)
    _require(dp >= 1, "lengths", "one entry per replica", dp)
    n_mb = len(lengths[0])
    batch = len(lengths[0][0]) if n_mb else 0
    shapes = [(len(rep), tuple(len(mb) for mb in rep)) for rep in lengths]
    _require(len(set(shapes)) == 1 and len(set(shapes[0][1])) <= 1, "lengths",
             f"{n_mb} microbatches of {batch} samples in every replica", shapes)
    _require(len(opts.locality) == pp * dp, "locality",
             f"one group id per rank ({pp * dp})", len(opts.locality))
    names = modality_names or tuple(f"modality {k}" for k in range(len(opts.heads)))
    pooled_costs = [tuple(float(sum(lengths[d][m][i])) for d in range(dp)
                          for i in range(batch)) for m in range(n_mb)]
    if schedule == "uniform_insertion":
        samples, shares = assign_encoder_samples(pooled_costs, pp, skip_stage0_drain=False)
        template = uniform_insertion(pp, n_mb, shares, samples=samples, inline_stage0=True)
    else:
        samples = [[tuple(g for g, c in enumerate(row) if c > 0)] + [()] * (pp - 1)
                   for row in pooled_costs]
        template = encoder_first_stage(pp, n_mb, samples=[s[0] for s in samples])
    template = interleave(template, vpp)

    works: list[GroupWork] = []
    by_key: dict[tuple[int, int], GroupWork] = {}
    for m in range(n_mb):
        for s in range(pp):
            if not samples[m][s]:
                continue
            dp_group = tuple(d * pp + s for d in range(dp))
            for members in locality_subgroups(dp_group, opts.locality):
                w = _group_work(m, s, members, pp, batch, samples[m][s], lengths, opts,
                                names)
                works.append(w)
                for r in members:
                    by_key[m, r] = w

    # per replica: feature messages carry that replica's own samples (none: no message)
    reps = []
    for d in range(dp):
        progs = []
        for prog in template.actions:
            new = []
            for a in prog:
                if a.kind in (Kind.SEND, Kind.RECV) and a.payload in (Payload.FEATURES,
                                                                       Payload.FEATURE_GRAD):
                    own = _own(a.samples, d, batch)
                    if not own:
                        continue
                    a = replace(a, samples=own)
                new.append(a)
            progs.append(tuple(new))
        reps.append(_replace_actions(template, tuple(progs)))
    joined = for_replicas(reps)

    programs = []
    for rank, prog in enumerate(joined.actions):
        new: list[Action] = []
        for a in prog:
            if a.kind not in (Kind.ENC_FWD, Kind.ENC_BWD):
                new.append(a)
                continue
            w = by_key[a.microbatch, rank]
            if w.empty:
                new.append(a)
                continue
            j = w.members.index(rank)
            total = sum(w.load_before) / max(1, len(w.members))
            share = a.share * (w.load_after[j] / total if total else 0.0)
            enc = replace(a, share=share, group=w.members)
            features = Action(Kind.ALLTOALL, a.microbatch, a.stage, payload=Payload.FEATURES,
                              group=w.members, counts=_counts(w, j, False, opts))
            if a.kind == Kind.ENC_FWD:
                new += [Action(Kind.ALLTOALL, a.microbatch, a.stage, payload=Payload.SAMPLES,
                               group=w.members, counts=_counts(w, j, True, opts)),
                        enc, *_sp_markers(w, j, opts), features]
            else:
                new += [features, enc, *_sp_markers(w, j, opts)]
        programs.append(tuple(new))
    grouped = replace(_replace_actions(joined, tuple(programs)), name=f"{schedule}+groups")
    return GroupedPlan(with_completion_points(grouped), batch, tuple(works))


__all__ = ["GROUPED_SCHEDULES", "GroupOptions", "GroupWork", "GroupedPlan", "build_grouped_plan",
           "locality_subgroups", "sp_subgroups"]
