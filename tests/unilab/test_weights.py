"""Weight board: publish/read round trip, versions, no torn reads while the writer runs."""

import multiprocessing as mp
import os

import pytest
import torch

from lightning_unilab.learner.policy import ActorCritic
from lightning_unilab.runtime.weights import WeightBoard


def _policy() -> ActorCritic:
    return ActorCritic(6, 8, 2, (64, 64), (64, 64))


def _fill(policy: ActorCritic, value: float) -> None:
    with torch.no_grad():
        for tensor in policy.state_dict().values():
            tensor.fill_(value)


def _publisher(handle, count: int) -> None:
    board = WeightBoard.attach(handle)
    policy = _policy()
    for version in range(1, count + 1):
        _fill(policy, float(version))
        board.publish(policy, version)
    board.close()


def test_round_trip_includes_normalizer_buffers():
    torch.manual_seed(0)
    learner = _policy()
    learner.update_normalizers(torch.randn(50, 6) * 3 + 1, torch.randn(50, 8))
    board = WeightBoard.create(learner)
    try:
        assert board.version == 0
        with torch.no_grad():
            learner.log_std.add_(0.5)
        board.publish(learner, 7)
        actor = _policy()
        assert board.read_into(actor) == 7 and board.version == 7
        for key, value in learner.state_dict().items():
            torch.testing.assert_close(actor.state_dict()[key], value, rtol=0, atol=0)
        assert actor.obs_normalizer.count.item() == 50
        with pytest.raises(ValueError, match="keys differ"):
            board.publish(ActorCritic(6, 8, 2, (64,), (64,)), 8)
    finally:
        board.close()
        board.unlink()
    assert board.name not in os.listdir("/dev/shm")


def test_reader_never_sees_a_mix_of_two_versions():
    """All tensors of a version hold that version's number: any mix is a torn read."""
    count = 300
    policy = _policy()
    board = WeightBoard.create(policy)
    ctx = mp.get_context("fork")  # fork: the publisher needs no fresh interpreter
    proc = ctx.Process(target=_publisher, args=(board.handle, count))
    reader = _policy()
    versions = []
    try:
        proc.start()
        while not versions or versions[-1] < count:
            version = board.read_into(reader)
            values = torch.cat([t.reshape(-1).double() for t in reader.state_dict().values()])
            if version > 0:
                assert values.min() == values.max() == version, "torn read"
            versions.append(version)
        proc.join(30)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
        board.close()
        board.unlink()
    assert versions == sorted(versions)
    assert len(set(versions)) > 2  # reads interleaved with publishing


@pytest.mark.parametrize("version", [-1, 2**64, 1.5, True])
def test_a_version_outside_the_counter_is_refused_by_name(version):
    with pytest.raises(ValueError, match=r"^version: expected an int >= 0 and below "
                                         r"18446744073709551616, got"):
        WeightBoard.create(_policy(), version)


@pytest.mark.parametrize("change,match", [
    (lambda t: t[:1], r"expected a tensor of shape \(64, 6\), as the board holds, got \(1, 6\)"),
    (lambda t: t.to(torch.int64), r"expected a tensor of dtype torch.float32 .*got torch.int64"),
    (lambda t: t.tolist(), r"expected a torch.Tensor, got 'list'"),
])
def test_a_publish_that_would_change_a_tensor_silently_names_its_key(change, match):
    board = WeightBoard.create(_policy())
    try:
        state = _policy().state_dict()
        key = next(k for k, v in state.items() if tuple(v.shape) == (64, 6))
        state[key] = change(state[key])
        with pytest.raises(ValueError, match=rf"^state_dict\['{key}'\]: {match}"):
            board.publish(state, 1)
        state = _policy().state_dict()
        state[key] = state[key].double()  # another floating precision: cast, as before
        board.publish(state, 2)
        assert board.version == 2
    finally:
        board.close()
        board.unlink()
