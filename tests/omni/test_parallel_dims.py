"""``ParallelDims``: the layout validated once, hashable, printed in the planner's notation, and
the one source of ``OmniStrategy``'s layout (keywords or ``dims=``). No processes."""

import pytest

from lightning_omni import OmniStrategy, ParallelDims


def test_defaults_are_filled_and_equal_layouts_hash_alike():
    dims = ParallelDims(pp=2, tp=4, encoder_tp=2)
    assert (dims.num_microbatches, dims.dp, dims.encoder_tp) == (4, None, 2)
    assert ParallelDims(tp=2).encoder_tp == 2  # None: the LLM's TP degree
    same = ParallelDims(pp=2, tp=4, encoder_tp=2, num_microbatches=4, stage_blocks=[1, 1],
                        locality_groups=None)
    assert same.stage_blocks == (1, 1)  # lists become tuples: hashable
    assert hash(ParallelDims(pp=2, tp=4, encoder_tp=2)) == hash(dims)
    assert {dims: "engine"}[ParallelDims(pp=2, tp=4, encoder_tp=2, num_microbatches=4)]


def test_it_prints_itself_in_the_planners_notation():
    dims = ParallelDims(pp=2, dp=2, tp=2, encoder_tp=1, vpp=2, recompute=True, lssp=True,
                        locality_groups=[0] * 8)
    text = str(dims)
    assert text.startswith("TP2 PP2 VPP2 DP2 +recompute encTP1 (world size 8); schedule "
                           "'uniform_insertion', 4 microbatches per replica; lssp=True")
    assert "locality_groups (0, 0, 0, 0, 0, 0, 0, 0)" in text and text.endswith("zero_stage=0")
    assert "DP(fills the world)" in str(ParallelDims())


def test_for_world_fills_dp_and_checks_the_world_and_the_locality_groups():
    dims = ParallelDims(pp=2, tp=2, reorder=True).for_world(8, 4)
    assert dims.dp == 2 and dims.world_size == 8
    assert dims.locality_groups == (0, 0, 0, 0, 1, 1, 1, 1)  # one per node of 4
    assert dims.group_options((0, 0)).locality == (0, 0, 1, 1)  # one per TP group
    with pytest.raises(ValueError, match=r"world size 6 \(devices \* num_nodes\), got 2 \* 2 "
                                         r"\* 2 = 8"):
        ParallelDims(pp=2, dp=2, tp=2).for_world(6, 6)
    with pytest.raises(ValueError, match="locality_groups: expected the 2 ranks of each tensor-"
                                         "parallel group in one locality group"):
        ParallelDims(tp=2, lssp=True, locality_groups=[0, 1, 1, 1]).for_world(4, 4)
    assert ParallelDims(pp=2).for_world(4, 4).group_options(()) is None  # no LSSP, no reorder


def test_it_cuts_the_layout_of_each_process():
    dims = ParallelDims(pp=2, tp=2, vpp=2, num_microbatches=4).for_world(8, 8)
    lay = dims.layout(5, [1.0] * 4)
    assert (lay.rank, lay.tp_rank, lay.stage, lay.replica) == (2, 1, 0, 1)
    assert lay.chunk_bounds(0) == ((0, 1), (2, 3))


@pytest.mark.parametrize("kwargs, match", [
    ({"tp": 4, "encoder_tp": 3}, "encoder_tensor_parallel: expected a divisor of "
                                 "tensor_parallel=4"),
    ({"pp": 0}, "pipeline_parallel: expected an int >= 1"),
    ({"vpp": 2}, "pipeline_parallel: expected >= 2 for virtual_pipeline_parallel=2"),
    ({"schedule": "1f1b"}, "schedule: expected one of"),
    ({"recompute": 1}, "recompute: expected True or False"),
])
def test_errors_name_the_strategy_keyword(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ParallelDims(**kwargs)


def test_the_strategy_takes_keywords_or_dims_not_both():
    by_keywords = OmniStrategy(pipeline_parallel=2, tensor_parallel=2,
                               encoder_tensor_parallel=1, stage_blocks=[2, 2])
    dims = ParallelDims(pp=2, tp=2, encoder_tp=1, stage_blocks=(2, 2))
    assert by_keywords.dims == dims == OmniStrategy(dims=dims).dims
    assert (by_keywords.pipeline_parallel, by_keywords.encoder_tensor_parallel,
            by_keywords.stage_blocks) == (2, 1, [2, 2])
    with pytest.raises(ValueError, match="dims: expected the layout given once"):
        OmniStrategy(dims=dims, pipeline_parallel=2)
    with pytest.raises(ValueError, match="dims: expected a ParallelDims"):
        OmniStrategy(dims={"pp": 2})
