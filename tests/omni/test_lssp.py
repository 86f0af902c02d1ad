import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightning_omni.plan.lssp import (
    DP,
    SP,
    WorkItem,
    choose_degree,
    plan_lssp,
    sp_degrees,
    split_microbatch,
)

items_strategy = st.lists(
    st.tuples(st.floats(0.01, 50.0), st.floats(0.0, 40.0), st.floats(0.0, 1.0)),
    min_size=0, max_size=30,
).map(lambda xs: [WorkItem(i, s, m, a) for i, (s, m, a) in enumerate(xs)])
group_sizes = st.sampled_from([1, 2, 4, 8])
heads = st.sampled_from([1, 2, 4, 12, 16, 20, 32])


@given(items_strategy, group_sizes, heads, st.floats(5.0, 100.0))
def test_every_sample_runs_once_and_sp_degrees_are_admissible(items, w, h, cap):
    split = split_microbatch(items, w, h, cap)
    seen = [sid for d in split.dp_samples for sid in d] + [g.sample_id for g in split.sp_groups]
    assert sorted(seen) == sorted(it.sample_id for it in items)
    for g in split.sp_groups:
        k = len(g.ranks)
        assert k >= 2 and k & (k - 1) == 0 and h % k == 0 and k <= w
        assert g.ranks == tuple(range(g.ranks[0], g.ranks[0] + k)) and g.ranks[0] % k == 0


@given(items_strategy, group_sizes, heads, st.floats(5.0, 100.0))
def test_long_means_over_balanced_load_or_memory_cap(items, w, h, cap):
    split = split_microbatch(items, w, h, cap)
    balanced = sum(it.seconds for it in items) / w
    by_id = {it.sample_id: it for it in items}
    for g in split.sp_groups:
        it = by_id[g.sample_id]
        assert it.seconds > balanced or it.memory_bytes > cap
        k = len(g.ranks)
        # smallest admissible degree meeting both limits, when one exists
        meets = [d for d in sp_degrees(w, h)
                 if it.sp_seconds(d) <= balanced and it.memory_bytes / d <= cap]
        if meets:
            assert k == meets[0]


@given(items_strategy, group_sizes, heads)
def test_makespan_bounds(items, w, h):
    split = split_microbatch(items, w, h, math.inf)
    total = sum(it.seconds for it in items)
    assert split.makespan >= total / w * (1 - 1e-9) - 1e-12 or not items
    # LPT on residual load: no worse than the balanced load plus the largest piece of work
    largest = max([it.seconds for it in items] + [0.0])
    sp_extra = sum(g.seconds for g in split.sp_groups)
    assert split.makespan <= total / w + largest + sp_extra + 1e-9


def test_long_sample_goes_sequence_parallel_and_shortens_the_microbatch():
    items = [WorkItem(0, 16.0, 1.0, 0.1)] + [WorkItem(i, 1.0, 1.0) for i in range(1, 9)]
    split = split_microbatch(items, 4, 16, 100.0)
    assert [g.sample_id for g in split.sp_groups] == [0]
    assert len(split.sp_groups[0].ranks) == 4  # 16/2 + comm > balanced 6; 16/4 + comm fits
    only_dp = split_microbatch(items, 4, 1, 100.0)  # one head: no SP possible
    assert not only_dp.sp_groups
    assert split.makespan < only_dp.makespan


def test_memory_forces_sp_even_when_short():
    items = [WorkItem(0, 1.0, 30.0), WorkItem(1, 1.0, 1.0), WorkItem(2, 1.0, 1.0)]
    split = split_microbatch(items, 4, 8, 10.0)
    assert split.sp_groups[0].sample_id == 0 and len(split.sp_groups[0].ranks) == 4
    assert split.sp_groups[0].fits_memory
    assert max(split.peak_memory_bytes) <= 10.0
    too_big = split_microbatch([WorkItem(0, 1.0, 1000.0)], 2, 8, 10.0)
    assert not too_big.sp_groups[0].fits_memory


def test_phases_alternate_so_the_group_switches_once_per_boundary():
    mbs = [[WorkItem(10 * m, 20.0, 1.0)] + [WorkItem(10 * m + i, 1.0, 1.0) for i in range(1, 6)]
           for m in range(6)]
    plan = plan_lssp(mbs, 4, 16, 100.0)
    orders = [mb.phase_order for mb in plan.microbatches]
    assert orders == [(SP, DP), (DP, SP)] * 3
    # one switch inside each microbatch, none at the boundaries
    assert plan.mode_switches == len(mbs)
    view = plan.for_rank(0)
    assert len(view.dp_samples) == len(mbs)
    assert all(any(0 in g.ranks for g in mb.sp_groups) == bool(v)
               for mb, v in zip(plan.microbatches, view.sp_groups, strict=True))


def test_choose_degree_and_errors():
    it = WorkItem(0, 8.0, 8.0)
    assert choose_degree(it, 4.0, 100.0, [1, 2, 4]) == (2, True)
    assert choose_degree(it, 100.0, 3.0, [1, 2, 4]) == (4, True)
    assert sp_degrees(8, 12) == [1, 2, 4]
    with pytest.raises(ValueError, match="group_size"):
        split_microbatch([], 0, 8, 1.0)
    with pytest.raises(ValueError, match="rank"):
        plan_lssp([[]], 2, 2, 1.0).for_rank(5)


@given(items_strategy, group_sizes, heads)
def test_deterministic(items, w, h):
    assert split_microbatch(items, w, h, 10.0) == split_microbatch(list(items), w, h, 10.0)
