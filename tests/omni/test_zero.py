"""ZeRO-1's optimizer wrapping: hyperparameters and param groups kept, state sharded, clear
refusals. The float64 equivalence with checkpoints is in test_equivalence.py (zero=1)."""
import pytest
import torch
from _omni_spawn import run_spmd

from lightning_omni import OmniStrategy


def _wrap_worker(rank: int, world: int) -> dict:
    import torch.distributed as dist

    from lightning_omni.runtime.zero import shard_optimizer, state_bytes

    torch.manual_seed(0)
    a, b, c = (torch.nn.Parameter(torch.randn(n, dtype=torch.float64)) for n in (64, 64, 8))
    opt = torch.optim.AdamW([{"params": [a, b], "weight_decay": 0.1},
                             {"params": [c], "lr": 0.5}], lr=0.01, betas=(0.8, 0.9))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    zero = shard_optimizer(opt, [a, c], dist.group.WORLD)  # b is not held on this rank
    out = {"groups": [(len(g["params"]), g["lr"], g["weight_decay"], g["betas"],
                       g.get("initial_lr")) for g in zero.param_groups]}
    for p in (a, c):
        p.grad = torch.ones_like(p)
    zero.step()
    out["bytes"] = state_bytes(zero)
    out["full_bytes"] = 2 * 8 * (64 + 8) + 2 * 4  # two float64 moments, a float32 step each
    with pytest.raises(ValueError, match="over none of them"):
        shard_optimizer(torch.optim.SGD([b], lr=0.1), [a], dist.group.WORLD)
    opt.step()  # a plain optimizer that has stepped
    with pytest.raises(ValueError, match="already stepped"):
        shard_optimizer(opt, [a], dist.group.WORLD)
    del sched
    return out


def test_sharded_optimizer_keeps_groups_and_holds_a_share():
    ranks = run_spmd(_wrap_worker, 2)
    for r in ranks:
        assert r["groups"] == [(1, 0.01, 0.1, (0.8, 0.9), 0.01), (1, 0.5, 0.01, (0.8, 0.9), 0.5)]
    # the two ranks split the state (a on one, c on the other), nothing held twice
    assert sum(r["bytes"] for r in ranks) == ranks[0]["full_bytes"]
    assert all(0 < r["bytes"] < ranks[0]["full_bytes"] for r in ranks)


@pytest.mark.parametrize("value", [2, -1, True, "1"])
def test_zero_stage_is_validated(value):
    with pytest.raises(ValueError, match="zero_stage: expected 0"):
        OmniStrategy(zero_stage=value)
