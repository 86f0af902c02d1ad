"""Meta-device build + replay: a rank's hosted parameters get exactly the plain build's values,
the others are never allocated, and the RNG ends where the plain build leaves it."""
import math

import pytest
import torch
from torch import nn

from lightning_omni.runtime.meta_init import (
    InitRecording,
    MetaInitError,
    RecordInit,
    capture_rng,
    materialize,
)


class Rotary(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        inv = 1.0 / (10000 ** (torch.arange(0, dim, 2) / dim))  # computed, then a buffer
        self.register_buffer("inv_freq", inv, persistent=False)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 8, padding_idx=0)         # normal_ + a view's fill_
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 8))
                                    for _ in range(3))
        self.cls = nn.Parameter(torch.zeros(1, 8))                # factory, then trunc_normal_
        nn.init.trunc_normal_(self.cls, std=0.02)
        self.scale = nn.Parameter(torch.randn(8) * 0.1)           # random factory, computed
        self.norm = nn.BatchNorm1d(8)                             # buffers
        self.rope = Rotary(8)
        self.head = nn.Linear(8, 11, bias=False)
        self.head.weight = self.embed.weight                      # tied
        for block in self.blocks:
            nn.init.xavier_uniform_(block[1].weight, gain=math.sqrt(2))  # custom init after


def _meta_build(seed: int, build=Net) -> tuple[nn.Module, InitRecording]:
    torch.manual_seed(seed)
    rec = InitRecording()
    capture_rng(rec, torch.device("cpu"))
    with torch.device("meta"), RecordInit(rec):
        net = build()
    return net, rec


def _plain_and_meta(seed: int, build) -> tuple[nn.Module, nn.Module, InitRecording]:
    """``build()`` from ``seed`` as usual, and again from ``seed`` on the meta device."""
    torch.manual_seed(seed)
    plain = build()
    return (plain, *_meta_build(seed, build))


@pytest.mark.parametrize("elsewhere", [[], ["blocks.0", "blocks.2", "cls"],
                                       ["embed", "blocks.1"],
                                       ["blocks.0", "blocks.1", "blocks.2", "scale"]])
def test_hosted_parameters_equal_the_plain_build(elsewhere, monkeypatch):
    # uniform draws for parameters hosted elsewhere go in chunks: make them several
    monkeypatch.setattr("lightning_omni.runtime.meta_init._CHUNK", 7)
    torch.manual_seed(3)
    plain = Net()
    after_plain = torch.rand(4)
    net, rec = _meta_build(3)
    assert all(p.is_meta for p in net.parameters())
    torch.manual_seed(12345)  # the replay starts from the recorded state, not the current
    away = [p for n, p in net.named_parameters() if n.split(".weight")[0].split(".bias")[0]
            .rsplit(".", 1)[0] in elsewhere or n in elsewhere or n.startswith(tuple(elsewhere))]
    materialize(net, rec, away, torch.device("cpu"))
    away_ids = {id(p) for p in away}
    ref = dict(plain.named_parameters())
    for name, p in net.named_parameters():
        if id(p) in away_ids:
            assert p.numel() == 0, name
        else:
            torch.testing.assert_close(p, ref[name], rtol=0, atol=0, msg=name)
    for (name, b), (_, b_ref) in zip(net.named_buffers(), plain.named_buffers(), strict=True):
        torch.testing.assert_close(b, b_ref, rtol=0, atol=0, msg=name)
    assert net.embed.weight is net.head.weight
    torch.testing.assert_close(torch.rand(4), after_plain, rtol=0, atol=0)


def test_values_from_outside_the_recording_are_refused():
    rec = InitRecording()
    with torch.device("meta"), RecordInit(rec):
        net = nn.Linear(2, 2)
    net.register_buffer("table", torch.empty(2, 2, device="meta"))  # made outside
    with pytest.raises(MetaInitError, match="table: its values were not made"):
        materialize(net, rec, [], torch.device("cpu"))


def _pair() -> nn.ModuleDict:
    a, b = nn.Linear(4, 4), nn.Linear(4, 4)
    with torch.no_grad():
        b.weight.copy_(a.weight * 2)
    return nn.ModuleDict({"a": a, "b": b})


def test_a_hosted_tensor_computed_from_one_hosted_elsewhere_gets_its_plain_value():
    plain, both, rec = _plain_and_meta(5, _pair)
    materialize(both, rec, [both["a"].weight, both["a"].bias], torch.device("cpu"))
    assert both["a"].weight.numel() == 0
    torch.testing.assert_close(both["b"].weight, plain["b"].weight, rtol=0, atol=0)


def test_an_initializer_the_recording_cannot_see_is_refused():
    from torch.nn.init import orthogonal_ as direct  # bound before recording starts

    rec = InitRecording()
    with torch.device("meta"), RecordInit(rec):
        net = nn.Module()
        net.w = nn.Parameter(torch.empty(4, 4))
        direct(net.w)  # returns at once for a meta tensor: nothing recorded
    with pytest.raises(MetaInitError, match="w: allocated on the meta device but never"):
        materialize(net, rec, [], torch.device("cpu"))


def test_a_directly_imported_truncated_normal_is_replayed():
    """``transformers`` and timm keep their own reference to ``trunc_normal_``: the draw is
    still seen (it would otherwise leave the zeros written before it)."""
    from torch.nn.init import trunc_normal_ as direct

    def build() -> nn.Module:
        net = nn.Module()
        net.w = nn.Parameter(torch.zeros(5, 3))
        direct(net.w, std=0.02)
        net.b = nn.Parameter(torch.randn(3))  # the draw after it lands where the plain one did
        return net

    plain, net, rec = _plain_and_meta(7, build)
    materialize(net, rec, [], torch.device("cpu"))
    assert net.w.abs().sum() > 0
    torch.testing.assert_close(net.w, plain.w, rtol=0, atol=0)
    torch.testing.assert_close(net.b, plain.b, rtol=0, atol=0)
