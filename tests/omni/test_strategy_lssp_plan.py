"""The plan behind LSSP and grouped reordering under OmniStrategy (pure, no processes): encoder
group actions keep every group's members aligned, every sample is encoded exactly once and its
features return to its own replica, samples stay inside their locality group, and the counts
the simulator prices are the rows that move."""

import random

import pytest

from lightning_omni.plan.lssp_schedule import GroupOptions, build_grouped_plan
from lightning_omni.plan.messages import check_schedule
from lightning_omni.plan.schedule import Kind, Payload

GROUP_KINDS = (Kind.ENC_FWD, Kind.ENC_BWD, Kind.ALLTOALL)


def _lengths(data, n_mb, batch, seed):
    rng = random.Random(seed)
    return tuple(tuple(tuple((rng.choice([0, 0, 2, 5, 40]), rng.choice([0, 3, 9]))
                             for _ in range(batch)) for _ in range(n_mb)) for _ in range(data))


def _opts(lssp, reorder, locality, max_rows=30.0):
    return GroupOptions(lssp, reorder, locality, (4, 2), 1.0, 0.01, max_rows,
                        in_row_bytes=(8, 4), out_row_bytes=16, sp_row_bytes=(64, 64))


CASES = [(schedule, pp, dp, lssp, reorder)
         for schedule in ("uniform_insertion", "encoder_first_stage")
         for pp, dp in ((1, 2), (2, 2), (3, 2), (2, 4))
         for lssp, reorder in ((True, False), (False, True), (True, True))]


@pytest.mark.parametrize("schedule,pp,dp,lssp,reorder", CASES)
def test_group_plans_run_and_cover_every_sample(schedule, pp, dp, lssp, reorder):
    lengths = _lengths(dp, 4, 3, seed=pp * 10 + dp)
    locality = tuple((r // pp) // 2 for r in range(pp * dp))  # two replicas per group
    gp = build_grouped_plan(schedule, pp, lengths, _opts(lssp, reorder, locality))
    check_schedule(gp.schedule)  # messages match, collectives meet, no deadlock
    sched = gp.schedule
    # members of one group action run the same group actions in the same order
    for w in gp.works:
        seqs = []
        for r in w.members:
            seqs.append([(a.kind, a.microbatch, a.payload, a.group) for a in sched.actions[r]
                         if a.kind in GROUP_KINDS and set(a.group) <= set(w.members)
                         and a.group])
        assert all(s == seqs[0] for s in seqs)
        assert all(locality[r] == locality[w.members[0]] for r in w.members)
    # every (sample, modality) with rows is encoded exactly once, by members of its group
    for m in range(4):
        for d in range(dp):
            for i in range(3):
                for k in range(2):
                    rows = lengths[d][m][i][k]
                    g = d * 3 + i
                    works = [w for w in gp.works if w.microbatch == m and g in w.lengths[k]]
                    assert len(works) == (1 if rows else 0)
                    if not rows:
                        continue
                    w = works[0]
                    assert w.replicas[w.owner[k][g]] == d  # features go to its own replica
                    split = w.splits[k]
                    dp_hits = sum(g in s for s in split.dp_samples)
                    sp_hits = [grp for grp in split.sp_groups if grp.sample_id == g]
                    assert dp_hits + len(sp_hits) == 1
                    if not lssp:
                        assert not sp_hits
                    if not reorder and dp_hits:
                        assert g in split.dp_samples[w.owner[k][g]]  # short ones stay home


def test_one_long_sample_closed_form():
    # replica 0 loads a 5-row sample, replica 1 a 1-row one; over 3 rows must be split
    lengths = (((((5,),),),), ((((1,),),),))
    lengths = tuple(tuple(tuple(s for s in mb) for mb in rep[0]) for rep in lengths)
    opts = GroupOptions(True, False, (0, 0), (2,), 1.0, 0.0, 3.0, in_row_bytes=(8,),
                        out_row_bytes=16, sp_row_bytes=(100,))
    gp = build_grouped_plan("uniform_insertion", 1, lengths, opts)
    (w,) = gp.works
    (grp,) = w.splits[0].sp_groups
    assert grp.sample_id == 0 and grp.ranks == (0, 1)
    assert w.load_before == (5.0, 1.0) and w.load_after == (2.5, 3.5)
    metrics = gp.metrics()
    assert metrics["lssp/long_samples"] == 1 and metrics["lssp/sp_degree_max"] == 2
    assert metrics["reorder/imbalance_before"] == pytest.approx(5 / 3)
    assert metrics["reorder/imbalance_after"] == pytest.approx(3.5 / 3)

    def alltoalls(rank, payload):
        return [a.counts for a in gp.schedule.actions[rank]
                if a.kind == Kind.ALLTOALL and a.payload == payload]

    # inputs: rank 0 sends rank 1 the second chunk, ceil(5/2) = 3 rows (1 padded) of 8 bytes;
    # rank 1 encodes its short sample itself
    assert alltoalls(0, Payload.SAMPLES) == [(0, 24)]
    assert alltoalls(1, Payload.SAMPLES) == [(0, 0)]
    # features: rank 1 returns its 2 valid rows (16 bytes each), forward and backward marks
    assert alltoalls(1, Payload.FEATURES) == [(32, 0), (32, 0)]
    assert alltoalls(0, Payload.SP_ATTENTION) == [(0, 150), (0, 150)]


def test_too_long_sample_names_it_and_the_limit():
    lengths = ((((40, 0),),), (((2, 0),),))
    with pytest.raises(ValueError, match=r"sample 0 of microbatch 0 of replica 0 \(image\): 40 "
                                         r"encoder rows, 20 per rank .* lssp_max_rows=8"):
        build_grouped_plan("uniform_insertion", 1, lengths, _opts(True, False, (0, 0), 8.0),
                           ("image", "audio"))


def test_replicas_must_match_in_shape():
    lengths = ((((1, 0), (2, 0)),), (((1, 0),),))
    with pytest.raises(ValueError, match="lengths"):
        build_grouped_plan("uniform_insertion", 1, lengths, _opts(False, True, (0, 0)))


def test_strategy_refuses_bad_lssp_options():
    from omni_models import make_model

    from lightning_omni import OmniStrategy, ParallelDims
    from lightning_omni.runtime.parallelize import group_options

    for kw, match in (({"lssp_max_rows": 0}, "lssp_max_rows"),
                      ({"encoder_cost": (-1.0, 0.0)}, "encoder_cost"),
                      ({"ulysses_backend": "nccl"}, "ulysses_backend")):
        with pytest.raises(ValueError, match=match):
            OmniStrategy(**kw)
    dims = OmniStrategy(lssp=True).dims.for_world(2, 2)  # 2 processes on one node
    spec = make_model(0).configure_omni()  # plain encoders: not splittable_rows
    assert group_options(spec, dims).heads == (0, 0)  # their samples run whole
    spec = make_model(0, encoder="token").configure_omni()
    assert group_options(spec, dims).heads == (2, 2)
    spec.modalities[0].encoder.splittable_rows = "yes"  # this instance only
    with pytest.raises(ValueError, match=r"TokenEncoder.splittable_rows: expected True"):
        group_options(spec, dims)
    with pytest.raises(ValueError, match="locality_groups: expected one group id per rank"):
        OmniStrategy(reorder=True, locality_groups=[0, 0, 1]).dims.for_world(2, 2)
    dims = ParallelDims(reorder=True).for_world(2, 2)  # reordering alone: any encoder
    assert group_options(make_model(0).configure_omni(), dims).locality == (0, 0)
