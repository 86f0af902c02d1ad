"""A meta build under tensor parallelism materializes only each process's shards: at TP2 on 2
gloo ranks (float64) the memory ``OmniStrategy.setup`` allocates never exceeds what the rank
keeps plus one whole parameter (every allocation counted by torch's profiler), and the shards
hold the plain build's values."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from omni_models import spawn
from tp_workers import _loader, _trainer, make_tp_model

from lightning_omni import OmniStrategy

SHAPE = {"hidden": 64, "layers": 4, "width": 32, "tie": True}  # blocks dwarf any one weight


def allocation_peak(fn) -> tuple[Any, int, int]:
    """``fn()``, the peak of the CPU bytes allocated while it ran and what stayed allocated
    (frees of memory allocated before count against both)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    events = sorted((e for e in prof.profiler.kineto_results.events()
                     if e.name() == "[memory]"), key=lambda e: e.start_ns())
    running = peak = 0
    for e in events:
        running += e.nbytes()
        peak = max(peak, running)
    return out, peak, running


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class _Setup(pl.Callback):
    """What the rank holds after setup, gathered whole for the comparison."""

    def on_train_start(self, trainer, module) -> None:
        from torch.distributed.tensor import DTensor

        params = dict(module.named_parameters())
        self.sharded = sorted(n for n, p in params.items() if isinstance(p, DTensor))
        self.largest = max(_bytes(p) for p in params.values())  # a whole parameter
        self.values = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
                       for n, p in params.items()}


def shards_worker(rank: int, world: int) -> dict[str, Any]:
    strategy = OmniStrategy(pipeline_parallel=1, data_parallel=1, tensor_parallel=world,
                            num_microbatches=4)
    measured: dict[str, int] = {}
    setup = strategy.setup

    def measured_setup(trainer) -> None:
        _, measured["peak"], measured["kept"] = allocation_peak(lambda: setup(trainer))

    strategy.setup = measured_setup
    seen = _Setup()
    model = make_tp_model(0, lazy=True, **SHAPE)
    torch.manual_seed(0)  # built in fit, from the seed, as the plain model right after it
    _trainer(world, strategy, [seen], max_steps=1).fit(model, _loader(rank, 1, 1, world, 8, 8))
    return {**measured, "largest": seen.largest, "sharded": seen.sharded, "values": seen.values}


def test_a_meta_build_under_tp_holds_its_shards_and_one_whole_parameter_at_a_time():
    ranks = spawn(shards_worker, 2, timeout=240.0)
    plain = make_tp_model(0, **SHAPE)
    whole = sum(_bytes(p) for p in plain.parameters())
    for r in ranks:
        # blocks, embedding and head are sharded; the setup's peak is the rank's own
        # tensors plus one whole parameter, in the two dtypes the build's .to(float64) holds
        # at once (materialized whole, then cut, the stage alone is nearly twice the shards)
        assert {"embed.tok.weight", "blocks.0.qkv.weight", "blocks.3.mlp.2.weight"} <= \
            set(r["sharded"]), r["sharded"]
        assert r["kept"] < 0.65 * whole, (r["kept"], whole)
        assert r["peak"] <= r["kept"] + 1.5 * r["largest"], (r["peak"], r["kept"],
                                                             r["largest"], whole)
        for n, p in plain.named_parameters():
            assert torch.equal(r["values"][n], p.detach()), n
