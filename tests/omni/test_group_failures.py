"""A failed group collective (a dead or stopped peer, a timeout) comes out of the LSSP and
reordering runtime as ``OmniRuntimeError`` naming the collective, its group's ranks and what it
waited for; errors of our own compute pass through unchanged; subgroups get their timeout."""

from __future__ import annotations

import os
import re
import socket
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _omni_spawn import run_spmd

from lightning_omni.runtime import alltoall, ulysses
from lightning_omni.runtime.alltoall import SubgroupCache, all_to_all_rows
from lightning_omni.runtime.failures import OmniRuntimeError

LOST = "Connection reset by peer (planted)"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def world1():
    """This process as a one-rank gloo world (the collectives run, then are made to fail)."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_port()}", rank=0,
                            world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _lose(*args, **kwargs):
    raise RuntimeError(LOST)


def test_all_to_all_rows_names_the_collective_forward_and_backward(world1, monkeypatch):
    x = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    with monkeypatch.context() as mp_:
        mp_.setattr(dist, "all_to_all_single", _lose)
        with pytest.raises(OmniRuntimeError, match=r"test rows: all_to_all_single over ranks "
                                                   r"\(0,\), sending rows \[3\] and waiting "
                                                   r"for rows \[3\]") as err:
            all_to_all_rows(x, [3], [3], what="test rows")
    assert LOST in str(err.value) and isinstance(err.value.__cause__, RuntimeError)
    y = all_to_all_rows(x, [3], [3], what="test rows")  # forward fine, the backward's fails
    monkeypatch.setattr(dist, "all_to_all_single", _lose)
    with pytest.raises(OmniRuntimeError, match=r"test rows \(backward\): all_to_all_single "
                                               r"over ranks \(0,\)"):
        y.sum().backward()


def test_rows_of_any_shape_travel_flat(world1, monkeypatch):
    seen = []
    real = dist.all_to_all_single

    def spy(out, inp, *args, **kwargs):
        seen.append((tuple(out.shape), tuple(inp.shape)))
        return real(out, inp, *args, **kwargs)

    monkeypatch.setattr(dist, "all_to_all_single", spy)
    x = torch.randn(4, 3, 2, dtype=torch.float64)
    torch.testing.assert_close(all_to_all_rows(x, [4], [4]), x, rtol=0, atol=0)
    assert seen == [((4, 6), (4, 6))]
    assert all_to_all_rows(x[:0], [0], [0]).shape == (0, 3, 2)


def test_lssp_and_reorder_exchanges_name_themselves(world1, monkeypatch):
    from lightning_omni.plan.lssp import DP, MicrobatchSplit
    from lightning_omni.runtime.lssp_exec import build_exec_plan, run_lssp_microbatch
    from lightning_omni.runtime.sample_exchange import GroupedReorder
    from lightning_omni.runtime.token_encoder import TokenEncoder

    enc = TokenEncoder(3, 4, 2, 1).double()
    split = MicrobatchSplit(5, (DP,), (), ((0,),), (0.0,), (0.0,))
    ex = build_exec_plan(split, {0: 2}, {0: 0})
    monkeypatch.setattr(dist, "all_to_all_single", _lose)
    with pytest.raises(OmniRuntimeError, match=r"LSSP inputs of microbatch 5 over group \(0,\)"
                                               r": all_to_all_single over ranks \(0,\)"):
        run_lssp_microbatch(enc, ex, {0: torch.randn(2, 3, dtype=torch.float64)}, [0],
                            cache=SubgroupCache())
    reorder = GroupedReorder([0], cache=SubgroupCache())
    gp = reorder.plan({0: 2})
    with pytest.raises(OmniRuntimeError, match=r"reorder samples over group \(0,\): "
                                               r"all_to_all_single over ranks \(0,\)"):
        reorder.exchange(gp, {0: torch.randn(2, 3)})
    with pytest.raises(OmniRuntimeError, match=r"reorder features over group \(0,\)"):
        reorder.return_features(gp, {0: torch.randn(2, 4, requires_grad=True)})
    monkeypatch.setattr(dist, "all_gather_object", _lose)
    with pytest.raises(OmniRuntimeError, match=r"reorder metadata: all_gather_object over "
                                               r"ranks \(0,\), waiting for every member"):
        reorder.plan({0: 2})


def test_ulysses_names_its_all_to_all_and_passes_compute_errors(world1, monkeypatch):
    q = torch.randn(1, 3, 2, 4, dtype=torch.float64)
    att = ulysses.UlyssesAttention(dist.group.WORLD, backend="torch")
    with monkeypatch.context() as mp_:
        mp_.setattr(dist, "all_to_all_single", _lose)
        with pytest.raises(OmniRuntimeError, match=r"sample 7, q sequence->heads: "
                                                   r"all_to_all_single over ranks \(0,\)"):
            att(q, q, q, valid_length=3, what="sample 7")

    def broken(*args, **kwargs):
        raise RuntimeError("local attention bug (planted)")

    monkeypatch.setattr(ulysses, "local_attention", broken)
    with pytest.raises(RuntimeError, match="local attention bug") as err:
        att(q, q, q, valid_length=3)
    assert not isinstance(err.value, OmniRuntimeError)  # ours to fix, not a lost peer


def test_subgroup_cache_creates_groups_with_its_timeout(world1, monkeypatch):
    made = []

    def new_group(ranks, **kwargs):
        made.append((tuple(ranks), kwargs.get("timeout")))
        return object()

    monkeypatch.setattr(dist, "new_group", new_group)
    assert SubgroupCache().get([0]) is dist.group.WORLD  # no timeout: the default group
    cache = SubgroupCache(timeout=timedelta(seconds=7))
    g = cache.get([0])
    assert made == [((0,), timedelta(seconds=7))]
    assert alltoall.group_timeout(g) == timedelta(seconds=7)
    assert cache.get((0,)) is g and cache.created == 1  # created once


def _deepspeed_worker(rank: int, world: int):
    """Forward and backward all-to-alls of DeepSpeed's attention fail named; its local
    attention's own errors pass through as they are."""
    from lightning_omni.runtime import ulysses as uly

    out = {}
    q = torch.randn(1, 3, 2, 4, dtype=torch.float64, requires_grad=True)
    att = uly.UlyssesAttention(dist.group.WORLD, backend="deepspeed")
    real = dist.all_to_all_single
    ok = att(q, q, q, valid_length=3)
    torch.testing.assert_close(ok, uly.local_attention(q, q, q, 3), rtol=1e-12, atol=1e-12)
    for name in ("forward", "backward"):
        dist.all_to_all_single = _lose if name == "forward" else real
        try:
            y = att(q, q, q, valid_length=3, what="sample 3")
            dist.all_to_all_single = _lose
            y.sum().backward()
        except Exception as err:  # noqa: BLE001 - the type is what is checked
            out[name] = (type(err).__name__, str(err))
        finally:
            dist.all_to_all_single = real
    real_local = uly.local_attention

    def broken(*args, **kwargs):
        raise RuntimeError("local attention bug (planted)")

    uly.local_attention = broken
    try:
        att(q, q, q, valid_length=3)
    except Exception as err:  # noqa: BLE001
        out["compute"] = (type(err).__name__, str(err))
    finally:
        uly.local_attention = real_local
    return out


@pytest.mark.skipif(not ulysses.deepspeed_available(), reason="DeepSpeed not installed")
def test_deepspeed_attention_names_its_all_to_alls():
    (out,) = run_spmd(_deepspeed_worker, 1, timeout=120)
    for name in ("forward", "backward"):
        kind, msg = out[name]
        assert kind == "OmniRuntimeError", out[name]
        assert "sample 3: DeepSpeed-Ulysses all-to-alls (q, k, v, output) over ranks (0,)" in msg
        assert LOST in msg
    assert out["backward"][1].count("(backward)") == 1
    assert out["compute"] == ("RuntimeError", "local attention bug (planted)")


# -- a peer that stops or dies between two exchanges --------------------------------------------
def _lost_peer_worker(rank: int) -> dict:
    """Rank 1 stops for 4 s (rank 0 waits on a group with a 2 s timeout), then exits abruptly
    before the next exchange (rank 0 waits on a group with a 60 s timeout)."""
    stopped = SubgroupCache(timeout=timedelta(seconds=2)).get([0, 1])
    dead = SubgroupCache(timeout=timedelta(seconds=60)).get([0, 1])
    x = torch.ones(4, 3)
    for g in (stopped, dead):  # both groups work while both ranks do
        all_to_all_rows(x, [2, 2], [2, 2], g, what="warm-up")
    dist.barrier()
    if rank == 1:
        time.sleep(4)
        os._exit(3)
    out = {}
    for name, g in (("stopped", stopped), ("dead", dead)):
        t0 = time.monotonic()
        try:
            all_to_all_rows(x, [2, 2], [2, 2], g, what=f"LSSP inputs ({name} peer)")
            out[name] = ("returned", "", time.monotonic() - t0)
        except Exception as err:  # noqa: BLE001 - the type is what is checked
            out[name] = (type(err).__name__, str(err), time.monotonic() - t0)
    return out


def _entry(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    result = _lost_peer_worker(rank)
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    os._exit(0)  # no teardown: its peer is gone


def test_stopped_and_dead_peers_fail_named_within_the_timeout():
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as out_dir:
        port = _port()
        procs = [ctx.Process(target=_entry, args=(r, port, out_dir)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        assert procs[1].exitcode == 3
        path = Path(out_dir) / "rank0.pt"
        assert path.exists(), f"rank 0 wrote no result (exit code {procs[0].exitcode})"
        out = torch.load(path, weights_only=False)
    kind, msg, seconds = out["stopped"]
    assert kind == "OmniRuntimeError", out
    assert "LSSP inputs (stopped peer): all_to_all_single over ranks (0, 1)" in msg
    assert "waiting for rows [2, 2]" in msg and "(timeout 2 s)" in msg
    assert 1.5 < seconds < 3.9  # the group's timeout, not the default 30 minutes
    kind, msg, seconds = out["dead"]
    assert kind == "OmniRuntimeError", out
    assert "LSSP inputs (dead peer): all_to_all_single over ranks (0, 1)" in msg
    assert "(timeout 60 s)" in msg
    assert seconds < 10  # the peer's death, well before the group's timeout


# what gloo and NCCL raise when the peer of a collective is gone, and errors that are not that
TRANSPORT = [
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
    "[127.0.0.1]:41829",
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:598] Read error [127.0.0.1]:2: "
    "Connection reset by peer",
    "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 20000ms "
    "for recv operation to complete",
    "NCCL communicator was aborted on rank 3.",
]
COMPUTE = [
    "mat1 and mat2 shapes cannot be multiplied (4x16 and 8x16)",
    "Expected all tensors to be on the same device, but found at least two devices",
    "element 0 of tensors does not require grad and does not have a grad_fn",
]


@pytest.mark.parametrize("message", TRANSPORT)
def test_transport_failures_are_lost_peers(message):
    from lightning_omni.runtime.failures import is_lost_peer

    assert is_lost_peer(RuntimeError(message))
    assert is_lost_peer(dist.DistBackendError("any text"))


@pytest.mark.parametrize("message", COMPUTE)
def test_compute_errors_are_not_lost_peers(message):
    from lightning_omni.runtime.failures import is_lost_peer

    assert not is_lost_peer(RuntimeError(message))
    assert not is_lost_peer(ValueError(TRANSPORT[0]))  # not raised by a collective


def _one_rank_engine():
    from omni_models import make_model

    from lightning_omni.runtime import ParallelDims, parallelize

    model = make_model(0)
    spec = model.configure_omni()
    dims = ParallelDims(pp=1, dp=1, num_microbatches=2).for_world(1, 1)
    engine = parallelize(spec, dims, dims.layout(0, spec.costs_of_blocks()),
                         torch.device("cpu"), timedelta(seconds=30))
    return model, engine


@pytest.mark.parametrize("message", [TRANSPORT[0], COMPUTE[0]])
def test_a_step_names_a_lost_peer_in_its_layers_and_passes_compute_errors(world1, message):
    """A collective inside a stage's layers (a DTensor row-parallel all-reduce, say) is not
    wrapped by ``communicating``: the step names the rank and step when it failed for a lost
    peer, and leaves an error of the computation as it was raised."""
    from omni_models import ToyData, global_batches

    model, engine = _one_rank_engine()

    def fail(*_):
        raise RuntimeError(message)

    batch = global_batches(ToyData(8, seed=0), 4)[0]
    engine.step(batch)  # the first step also probes the parts' shapes
    model.blocks[0].register_forward_pre_hook(fail)
    with pytest.raises(RuntimeError) as err:
        engine.step(batch)
    if message in TRANSPORT:
        assert type(err.value) is OmniRuntimeError
        assert str(err.value).startswith("rank 0, step 1 (train): a collective failed; a peer "
                                         "rank has probably died or stopped (RuntimeError: ")
        assert err.value.__cause__ is not None and str(err.value.__cause__) == message
    else:
        assert type(err.value) is RuntimeError and str(err.value) == message


@pytest.mark.parametrize("call", ["barrier", "broadcast", "reduce", "all_gather"])
def test_lightnings_collectives_under_omnistrategy_name_a_lost_peer(world1, monkeypatch, call):
    """Lightning's own collectives (the checkpoint path's broadcast, a barrier, a logged
    metric's reduce) under OmniStrategy fail as ``OmniRuntimeError`` naming themselves."""
    from lightning_omni import OmniStrategy

    strategy = OmniStrategy()
    for name in ("barrier", "broadcast_object_list", "all_reduce", "all_gather"):
        monkeypatch.setattr(dist, name, _lose)
    x = torch.ones(2)
    args = {"barrier": ("omni_save",), "broadcast": ("path",), "reduce": (x,),
            "all_gather": (x,)}[call]
    with pytest.raises(OmniRuntimeError, match=rf"rank 0: Lightning's {call}.*a peer rank has "
                                               rf"probably died or stopped \(RuntimeError: "
                                               rf"{re.escape(LOST)}"):
        getattr(strategy, call)(*args)


def test_the_shape_probe_passes_a_lost_peer_through(world1):
    """The first step's shape probe names a part's failure as the user's shape error, except
    a lost peer (a collective inside a tensor-parallel part), which the step names."""
    from omni_models import ToyData, global_batches

    from lightning_omni import OmniSpecError

    model, engine = _one_rank_engine()
    batch = global_batches(ToyData(8, seed=0), 4)[0]
    handle = model.blocks[0].register_forward_pre_hook(_lose)
    with pytest.raises(OmniRuntimeError, match=r"^rank 0, step 0 \(train\): a collective failed"):
        engine.step(batch)
    handle.remove()
    model, engine = _one_rank_engine()
    model.blocks[0].register_forward_pre_hook(lambda *_: torch.zeros(()).view(5))
    with pytest.raises(OmniSpecError, match=r"^blocks\[0\]: failed on inputs of shapes"):
        engine.step(batch)


@pytest.mark.parametrize(("tp", "tp_rank", "named"), [
    (1, 0, "from rank 3 "), (2, 1, "from rank 7 (pipeline rank 3) "),
    (2, 0, "from rank 6 (pipeline rank 3) ")])
def test_pipeline_messages_name_the_peer_process(tp, tp_rank, named):
    """A message's peer is a pipeline (plan) rank; the error names the process it is, as
    torchrun's logs do, and the plan rank beside it when they differ."""
    from types import SimpleNamespace

    from lightning_omni.plan.actions import Action, Kind, Payload
    from lightning_omni.runtime.executor import StageExecutor
    from lightning_omni.runtime.layout import Layout

    layout = Layout(world_size=4, rank=1, pp=4, dp=1, block_bounds=((0, 1), (1, 2), (2, 3), (3, 4)),
                    tp=tp, tp_rank=tp_rank)
    a = Action(Kind.RECV, microbatch=2, stage=1, peer=3, payload=Payload.GRADIENT)
    what = StageExecutor._what(SimpleNamespace(layout=layout), a)
    assert what == f"recv of {Payload.GRADIENT} for microbatch 2 {named.strip()}"
