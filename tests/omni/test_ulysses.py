"""Ulysses attention on 2 gloo ranks equals single-process attention (float64), forward and
backward, causal or not, with lengths that need padding; bad head counts fail clearly."""

from __future__ import annotations

import pytest
import torch
from _omni_spawn import run_spmd

from lightning_omni.runtime.ulysses import (
    check_sp_heads,
    deepspeed_available,
    local_attention,
    pad_length,
)

HEADS, DIM = 4, 8
CASES = [(length, causal) for length in (8, 7, 5) for causal in (False, True)]


def _inputs(length: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    q, k, v, dout = (torch.randn(1, length, HEADS, DIM, generator=g, dtype=torch.float64)
                     for _ in range(4))
    return q, k, v, dout


def _worker(rank: int, world: int, backends: list[str]):
    import torch.distributed as dist

    from lightning_omni.runtime.ulysses import UlyssesAttention

    out = {}
    for backend in backends:
        for length, causal in CASES:
            q, k, v, dout = _inputs(length, seed=length)
            chunk, padded = pad_length(length, world)
            pad = [0, 0, 0, 0, 0, padded - length]
            mine = slice(rank * chunk, (rank + 1) * chunk)
            qc, kc, vc = (torch.nn.functional.pad(t, pad)[:, mine].clone().requires_grad_()
                          for t in (q, k, v))
            att = UlyssesAttention(dist.group.WORLD, causal=causal, backend=backend)
            o = att(qc, kc, vc, valid_length=length)
            o.backward(torch.nn.functional.pad(dout, pad)[:, mine])
            out[(backend, length, causal)] = (o.detach(), qc.grad, kc.grad, vc.grad)
        errors = []
        for heads in (1, 3):
            x = torch.zeros(1, 4, heads, DIM, dtype=torch.float64)
            try:
                UlyssesAttention(dist.group.WORLD, backend=backend)(x, x, x, valid_length=8)
            except ValueError as e:
                errors.append(str(e))
        out[(backend, "errors")] = errors
    return out


BACKENDS = ["torch"] + (["deepspeed"] if deepspeed_available() else [])


@pytest.fixture(scope="module")
def results():
    return run_spmd(_worker, 2, BACKENDS, timeout=240)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("length,causal", CASES)
def test_matches_single_process(results, backend, length, causal):
    q, k, v, dout = _inputs(length, seed=length)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = local_attention(*leaves, causal=causal)
    ref.backward(dout)
    expected = [ref.detach()] + [t.grad for t in leaves]
    got = [torch.cat([r[(backend, length, causal)][i] for r in results], dim=1)[:, :length]
           for i in range(4)]
    for name, e, g in zip(("out", "dq", "dk", "dv"), expected, got, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-12, msg=f"{name} differs")
    # padded positions carry no gradient into k and v and no NaN anywhere
    for r in results:
        for t in r[(backend, length, causal)]:
            assert torch.isfinite(t).all()
    tail = results[-1][(backend, length, causal)]
    chunk, padded = pad_length(length, 2)
    if padded > length:
        assert tail[2][:, length - chunk:].abs().max() == 0
        assert tail[3][:, length - chunk:].abs().max() == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_heads_fail_clearly_in_processes(results, backend):
    errors = results[0][(backend, "errors")]
    assert len(errors) == 2
    assert "1 attention heads are fewer than the SP degree 2" in errors[0]
    assert "3 attention heads are not divisible by the SP degree 2" in errors[1]


def test_check_sp_heads():
    check_sp_heads(8, 4)
    with pytest.raises(ValueError, match="fewer than the SP degree 4"):
        check_sp_heads(2, 4)
    with pytest.raises(ValueError, match="6 attention heads are not divisible by the SP degree 4"):
        check_sp_heads(6, 4)


def test_pad_length():
    assert pad_length(7, 2) == (4, 8)
    assert pad_length(8, 4) == (2, 8)
    assert pad_length(1, 4) == (1, 4)
    with pytest.raises(ValueError, match="length"):
        pad_length(0, 2)
