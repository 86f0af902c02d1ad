"""Tensor-parallel runs of the toy model for tests/omni/test_tp.py: OmniStrategy fits on spawned
gloo ranks (several layouts per spawn) and the plain single-process run they must equal."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Any

import lightning.pytorch as pl
import torch
from omni_models import LazyToy, OmniToy, ToyData, global_batches
from torch import Tensor
from torch.utils.data import DataLoader, DistributedSampler


class _EncoderPlan:
    """The toy's plan (``OmniToy.configure_omni``: the example's GPT plan) plus a column- then
    row-parallel projector MLP in each plain encoder, so that encoders are sharded too."""

    def configure_omni(self):
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        spec = super().configure_omni()
        plan = dict(spec.tp_plan or {})
        for m in spec.modalities:
            plan.setdefault(m.name, {"proj.0": ColwiseParallel(), "proj.2": RowwiseParallel()})
        return replace(spec, tp_plan=plan)


class TPToy(_EncoderPlan, OmniToy):
    pass


class LazyTPToy(_EncoderPlan, LazyToy):
    pass


class RMSNorm(torch.nn.Module):
    """Llama's RMSNorm, computing in its input's dtype (float64 here, no float32 upcast): it
    saves its input for backward."""

    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight, self.eps = torch.nn.Parameter(torch.ones(hidden)), eps

    def forward(self, x: Tensor) -> Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class PostNormTPToy(TPToy):
    """Each block's MLP ends in an RMSNorm (Gemma-2's post-feed-forward norm), which takes the
    row-parallel ``mlp.2``'s output as it comes and saves it for backward."""

    def _build(self, hidden: int, *args: Any, **kw: Any) -> None:
        super()._build(hidden, *args, **kw)
        for block in self.blocks:
            block.mlp.append(RMSNorm(hidden))


def make_tp_model(seed: int = 0, lazy: bool = False, dtype: torch.dtype = torch.float64,
                  post_norm: bool = False, **kw: Any) -> OmniToy:
    """The toy with its TP plan; ``post_norm``: ``PostNormTPToy``."""
    torch.manual_seed(seed)
    if lazy:
        return LazyTPToy(dtype=dtype, **kw)
    return (PostNormTPToy if post_norm else TPToy)(**kw).to(dtype)


def _dtype(precision: str | None) -> torch.dtype:
    """The module's and the data's dtype: float64, or float32 under bf16-mixed (autocast)."""
    return torch.float64 if precision is None else torch.float32


def reference(steps: int, batch: int, samples: int, clip: float | None = None,
              clip_algorithm: str = "norm", precision: str | None = None,
              **kw: Any) -> dict[str, Any]:
    """The plain module on one process: its own training_step on the global batch, Adam,
    ``clip_grad_norm_`` (or ``clip_grad_value_``) over all parameters when ``clip``, as
    Lightning's gradient_clip_val; first-step gradients as the optimizer sees them (after
    clipping). ``precision="bf16-mixed"``: a float32 module, the step under CPU bf16 autocast
    (as Lightning's plugin runs it)."""
    from contextlib import nullcontext

    model = make_tp_model(0, dtype=_dtype(precision), **kw)
    opt = model.configure_optimizers()
    losses, grads0 = [], None
    batches = global_batches(ToyData(samples, dtype=_dtype(precision)), batch)
    for i in range(steps):
        opt.zero_grad()
        with (torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16-mixed"
              else nullcontext()):
            loss = model.training_step(batches[i % len(batches)], i)
        loss.backward()
        if clip is not None and clip_algorithm == "value":
            torch.nn.utils.clip_grad_value_(model.parameters(), clip)
        elif clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        if i == 0:
            grads0 = {n: p.grad.clone() for n, p in model.named_parameters()}
        losses.append(float(loss.detach()))
        opt.step()
    from lightning_omni.runtime.zero import state_bytes

    if precision is not None:  # no evaluation outputs (the tests compare float64 ones only)
        return {"losses": losses, "grads0": grads0}
    with torch.no_grad():  # the trained model's validation outputs and predictions
        evals = [model.validation_step(b, i) for i, b in
                 enumerate(global_batches(ToyData(EVAL_SAMPLES), EVAL_BATCH))]
        preds = torch.cat([model(b) for b in global_batches(ToyData(EVAL_SAMPLES), EVAL_BATCH)])
    return {"losses": losses, "grads0": grads0, "state_bytes": state_bytes(opt),
            "params": {n: p.detach().clone() for n, p in model.named_parameters()},
            "val": [{k: float(v) for k, v in e.items()} for e in evals], "preds": preds}


def _full(t: Tensor) -> Tensor:
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t.clone()


EVAL_SAMPLES, EVAL_BATCH = 16, 8


class _Record(pl.Callback):
    """Losses; at the first step every hosted gradient whole (DTensors gathered: every TP
    rank calls this in the same order) and the plain (unsharded) ones as this rank has them."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.grads0: dict[str, Tensor] = {}
        self.plain0: dict[str, Tensor] = {}
        self.val: list[dict[str, float]] = []
        self.preds: Tensor | None = None

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx,
                                dataloader_idx=0) -> None:
        self.val.append({k: float(v) for k, v in outputs.items()})

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        from torch.distributed.tensor import DTensor

        self.losses.append(float(outputs["loss"]))
        if self.grads0:
            return
        hosted = trainer.strategy.engine.hosted_param_ids()
        for n, p in module.named_parameters():
            if id(p) in hosted and p.grad is not None:
                self.grads0[n] = _full(p.grad)
                if not isinstance(p.grad, DTensor):
                    self.plain0[n] = p.grad.clone()


def _loader(rank: int, pp: int, dp: int, tp: int, samples: int, batch: int,
            dtype: torch.dtype = torch.float64) -> DataLoader:
    data = ToyData(samples, dtype=dtype)
    sampler = DistributedSampler(data, num_replicas=dp, rank=rank // (pp * tp), shuffle=False)
    return DataLoader(data, batch_size=batch // dp, sampler=sampler)


def _trainer(world: int, strategy, callbacks: list, **kw: Any) -> pl.Trainer:
    return pl.Trainer(accelerator="cpu", devices=world, strategy=strategy,
                      logger=kw.pop("logger", False),
                      enable_checkpointing=kw.pop("enable_checkpointing", False),
                      enable_progress_bar=False, enable_model_summary=False,
                      callbacks=callbacks, use_distributed_sampler=False, **kw)


def _strategy(run: dict[str, Any]):
    from lightning_omni import OmniStrategy

    return OmniStrategy(pipeline_parallel=run["pp"], data_parallel=run["dp"],
                        tensor_parallel=run.get("tp", 1), schedule=run["schedule"],
                        virtual_pipeline_parallel=run.get("vpp", 1),
                        recompute=run.get("recompute", False),
                        encoder_recompute=run.get("encoder_recompute", False),
                        encoder_tensor_parallel=run.get("encoder_tp"), num_microbatches=4,
                        zero_stage=run.get("zero", 0), lssp=run.get("lssp", False),
                        reorder=run.get("reorder", False),
                        lssp_max_rows=run.get("lssp_max_rows"), ulysses_backend="torch")


def _fit(rank: int, world: int, run: dict[str, Any], samples: int, batch: int,
         ckpt_dir: str | None) -> tuple[_Record, Any, OmniToy]:
    """One epoch of ``run``; with ``save``, Lightning's checkpoint callback writes
    ``{name}.ckpt`` at its end; with ``resume`` (a saved run's name), the second epoch from that
    checkpoint, starting from another initial model (the checkpoint must decide)."""
    rec = _Record()
    callbacks: list = [rec]
    if run.get("save"):
        callbacks.append(pl.callbacks.ModelCheckpoint(dirpath=ckpt_dir, filename=run["name"],
                                                      save_top_k=-1))
    path = os.path.join(ckpt_dir, f"{run['resume']}.ckpt") if run.get("resume") else None
    dtype = _dtype(run.get("precision"))
    model = make_tp_model(1 if path else 0, lazy=run.get("lazy", False), tie=run.get("tie"),
                          encoder=run.get("encoder", "plain"), dtype=dtype,
                          post_norm=run.get("post_norm", False),
                          **({"heads": run["heads"]} if "heads" in run else {}))
    if run.get("lazy"):  # built in fit: from the seed, as the reference's model right after it
        torch.manual_seed(0)
    strategy = _strategy(run)
    if run.get("log"):  # the strategy's step metrics, through Lightning's CSV logger
        kw = {"logger": pl.loggers.CSVLogger(ckpt_dir, name=run["name"], version=0),
              "log_every_n_steps": 1}
    else:
        kw = {}
    trainer = _trainer(world, strategy, callbacks, max_epochs=2 if path else 1, **kw,
                       gradient_clip_val=run.get("clip"),
                       gradient_clip_algorithm=run.get("clip_algorithm", "norm"),
                       enable_checkpointing=bool(run.get("save")),
                       precision=run.get("precision"))
    trainer.fit(model, _loader(rank, run["pp"], run["dp"], run.get("tp", 1), samples, batch,
                               dtype), ckpt_path=path)
    if run.get("evaluate"):  # validation and prediction of the first EVAL_SAMPLES samples
        loader = _loader(rank, run["pp"], run["dp"], run.get("tp", 1), EVAL_SAMPLES,
                         EVAL_BATCH)
        trainer.validate(model, loader, verbose=False)
        rec.preds = torch.cat(trainer.predict(model, loader))
    return rec, strategy, model


def tp_worker(rank: int, world: int, runs: list[dict[str, Any]], batch: int, samples: int,
              ckpt_dir: str) -> dict[str, Any]:
    """Per run (``name``, ``pp``, ``dp``, ``tp``, ``schedule``, optional ``tie``, ``clip``,
    ``clip_algorithm``, ``encoder_tp``, ``vpp``, ``recompute``, ``encoder_recompute``,
    ``precision``, ``lazy``, ``post_norm``, ``zero``, ``lssp``, ``reorder``, ``lssp_max_rows``,
    ``encoder``, ``heads``, ``evaluate``, ``log``, ``save``, ``resume``; see ``_fit``):
    losses, the metrics logged (rank 0), the encoder group plan's metrics, first-step
    gradients and final hosted parameters (whole), the plain gradients as held, validation
    outputs and predictions, this rank's plan and TP ranks, the parameter and optimizer-state
    bytes it holds, the run's wall time."""
    from lightning_omni.runtime.zero import state_bytes

    out: dict[str, Any] = {}
    for run in runs:
        start = time.perf_counter()
        rec, strategy, model = _fit(rank, world, run, samples, batch, ckpt_dir)
        lay = strategy.engine.layout
        hosted = strategy.engine.hosted_param_ids()
        out[run["name"]] = {
            "losses": rec.losses, "grads0": rec.grads0, "plain0": rec.plain0,
            "val": rec.val, "preds": rec.preds,
            "params": {n: _full(p.detach()) for n, p in model.named_parameters()
                       if id(p) in hosted},
            "tp_rank": lay.tp_rank, "plan_rank": lay.rank,
            "param_bytes": sum(_local(p).numel() * p.element_size() for p in model.parameters()),
            "optimizer": type(strategy.optimizers[0]).__name__,
            "logged": _logged(ckpt_dir, run["name"]) if run.get("log") and rank == 0 else None,
            "grouped": (strategy.last_step.grouped.metrics()
                        if strategy.last_step.grouped is not None else None),
            "state_bytes": state_bytes(strategy.optimizers[0]),
            "group_heads": (strategy.engine.group_options.heads
                            if strategy.engine.group_options is not None else None),
            "rows_encoded": strategy.last_step.record.rows_encoded,
            "wall_s": time.perf_counter() - start}
    return out


def _logged(ckpt_dir: str, name: str) -> dict[str, list[float]]:
    """The CSV logger's columns (metric name -> its logged values)."""
    import csv

    with open(os.path.join(ckpt_dir, name, "version_0", "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    return {k: [float(r[k]) for r in rows if r.get(k)] for k in rows[0]} if rows else {}


def _local(t: Tensor) -> Tensor:
    return t.to_local() if hasattr(t, "to_local") else t
