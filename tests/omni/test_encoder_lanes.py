"""Encoder lanes' pure part: which lane encodes which sample (every process computes it alone,
so it must be deterministic and balanced), and the rows each lane fills."""

import pytest
import torch

from lightning_omni.runtime.encoder_lanes import assign_to_lanes, scatter_rows


def test_costliest_first_onto_the_least_loaded_lane():
    # 5 -> lane 0, 4 -> lane 1, 3 -> lane 1 (4 < 5), 2 -> lane 0 (5 < 7), 1 -> lane 0 (7 = 7)
    assert assign_to_lanes([1, 5, 3, 4, 2], 2) == [0, 0, 1, 1, 0]
    # ties between equal costs go to the earlier item first, each onto the lowest lane
    assert assign_to_lanes([2, 2, 2, 2], 2) == [0, 1, 0, 1]
    assert assign_to_lanes([3, 1], 1) == [0, 0]
    assert assign_to_lanes([], 3) == []


def test_preloaded_lane_takes_less():
    # lane 0 already carries 6 (its sequence-parallel pieces): 4 and 2 go to lane 1, then
    # 1 to lane 0 (6 = 6: the lowest lane)
    assert assign_to_lanes([4, 2, 1], 2, (6.0,)) == [1, 1, 0]
    # 4 -> lane 1 (0 < 6), 3 -> lane 1 (4 < 6), 2 -> lane 0 (6 < 7)
    assert assign_to_lanes([4, 2, 3], 2, (6.0,)) == [1, 0, 1]


def test_lane_loads_are_balanced_within_the_largest_item():
    costs = [7, 3, 9, 1, 4, 4, 6, 2, 8, 5]
    for lanes in (2, 3, 4):
        lane_of = assign_to_lanes(costs, lanes)
        loads = [0] * lanes
        for c, lane in zip(costs, lane_of, strict=True):
            loads[lane] += c
        assert max(loads) - min(loads) <= max(costs), (lanes, loads)


def test_bad_lane_count_is_named():
    with pytest.raises(ValueError, match="lanes: expected at least 1, got 0"):
        assign_to_lanes([1], 0)


def test_scatter_rows_puts_each_part_at_its_rows_and_keeps_the_gradient():
    values = torch.arange(4.0).view(2, 2).requires_grad_(True)
    out = scatter_rows(4, 2, [(torch.tensor([3, 1]), values)], torch.empty(0))
    assert out.tolist() == [[0, 0], [2, 3], [0, 0], [0, 1]]
    out.sum().backward()
    assert values.grad.tolist() == [[1, 1], [1, 1]]
