"""ZeRO-1's optimizer wrapping: hyperparameters and param groups kept, clear refusals. The
sharding over ranks and the float64 equivalence with checkpoints are in test_equivalence.py."""
import pytest
import torch

from lightning_omni import OmniStrategy


@pytest.fixture
def one_rank_group():
    """A one-rank gloo group in this process (spawning ranks costs ~20 s of CI; sharding over
    several ranks is measured in test_equivalence.py's ZeRO-1 case)."""
    import socket

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def test_sharded_optimizer_keeps_groups_and_refuses_clearly(one_rank_group):
    from lightning_omni.runtime.zero import shard_optimizer, state_bytes

    torch.manual_seed(0)
    a, b, c = (torch.nn.Parameter(torch.randn(n, dtype=torch.float64)) for n in (64, 64, 8))
    # AdamW: its defaults carry Adam's decoupled_weight_decay, which AdamW() refuses
    opt = torch.optim.AdamW([{"params": [a, b], "weight_decay": 0.1},
                             {"params": [c], "lr": 0.5}], lr=0.01, betas=(0.8, 0.9))
    torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)  # sets initial_lr
    zero = shard_optimizer(opt, [a, c], one_rank_group)  # b is not held on this rank
    assert [(len(g["params"]), g["lr"], g["weight_decay"], g["betas"], g.get("initial_lr"))
            for g in zero.param_groups] == [(1, 0.01, 0.1, (0.8, 0.9), 0.01),
                                            (1, 0.5, 0.01, (0.8, 0.9), 0.5)]
    for p in (a, c):
        p.grad = torch.ones_like(p)
    zero.step()
    # two float64 moments per element and a float32 step per parameter, for a and c only
    assert state_bytes(zero) == 2 * 8 * (64 + 8) + 2 * 4
    with pytest.raises(ValueError, match="over none of them"):
        shard_optimizer(torch.optim.SGD([b], lr=0.1), [a], one_rank_group)
    opt.step()  # a plain optimizer that has stepped
    with pytest.raises(ValueError, match="already stepped"):
        shard_optimizer(opt, [a], one_rank_group)


@pytest.mark.parametrize("value", [2, -1, True, "1"])
def test_zero_stage_is_validated(value):
    with pytest.raises(ValueError, match="zero_stage: expected 0"):
        OmniStrategy(zero_stage=value)
