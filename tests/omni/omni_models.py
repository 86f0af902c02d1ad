"""A tiny omni model for runtime tests: image-like and audio-like encoders with variable lengths
per sample (some samples and whole microbatches without images), a small GPT, and helpers to
run Lightning on N spawned gloo processes."""

from __future__ import annotations

import math
import os
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from _omni_spawn import run_processes
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from lightning_omni import Modality, OmniSpec
from lightning_omni.examples import multimodal_model as example
from lightning_omni.examples.multimodal_data import AUD, IMG, PAD
from lightning_omni.examples.multimodal_model import GptBlock, caption_loss
from lightning_omni.spec import scatter_features, valid_rows

VOCAB, SEQ = 24, 20
IMG_DIM, IMG_MAX = 6, 5
AUD_DIM, AUD_MAX = 4, 6


class Encoder(nn.Module):
    """Masked self-attention over a sample's rows, then a projector to the LLM width. Not the
    example's TokenEncoder (``encoder="token"``) on purpose: an encoder whose attention LSSP
    cannot split, so the tests cover both kinds."""

    def __init__(self, d_in: int, width: int, hidden: int) -> None:
        super().__init__()
        self.inp = nn.Linear(d_in, width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, hidden))

    def forward(self, x: Tensor, lengths: Tensor) -> Tensor:
        h = torch.tanh(self.inp(x))
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        keep = torch.arange(x.shape[1]) < lengths.unsqueeze(1)
        scores = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(~keep.unsqueeze(1), float("-inf"))
        h = h + torch.softmax(scores, dim=-1) @ v
        return self.proj(h)


# the example's GPT parts at the test model's size: half as wide an MLP, two heads, a larger
# position init and this file's vocabulary and sequence length (one source for the parts)
Block = partial(GptBlock, heads=2, mlp_ratio=2)
Embedding = partial(example.Embedding, vocab=VOCAB, seq_len=SEQ, init_std=0.1)
Head = partial(example.Head, vocab=VOCAB)
loss_terms = caption_loss


def accuracy_terms(logits: Tensor, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """Over every labelled token: the toy data has no caption/text split (cf. the example's
    ``caption_accuracy``)."""
    labels = batch["labels"]
    keep = labels != -100
    return (logits.argmax(-1)[keep] == labels[keep]).sum(), keep.sum()


class OmniToy(pl.LightningModule):
    """A multimodal LLM written for one device; ``configure_omni`` is the only Omni addition."""

    def __init__(self, hidden: int = 16, layers: int = 4, lr: float = 1e-2,
                 width: int = 12, encoder: str = "plain", tie: bool = False,
                 dropout: float = 0.0, heads: int = 2) -> None:
        super().__init__()
        self.lr = lr
        self._build(hidden, layers, width, encoder, tie, dropout, heads)

    def _build(self, hidden: int, layers: int, width: int, encoder: str, tie: bool,
               dropout: float = 0.0, heads: int = 2) -> None:
        """``encoder``: "plain" (``Encoder``), "token" (``TokenEncoder``, which LSSP can split;
        "token4": with 4 heads instead of 2)
        or "mixed" (a TokenEncoder for images, an ``Encoder`` for audio). ``dropout > 0``: an
        ``nn.Dropout`` after every MLP/projector (the same parameters and initial values).
        ``heads``: the LLM blocks' attention heads (4 for TP4)."""
        if encoder in ("token", "token4", "mixed"):  # attention swappable: LSSP can split
            from lightning_omni.runtime.token_encoder import TokenEncoder

            enc_heads = 4 if encoder == "token4" else 2  # token4: 2 heads per rank at TP2
            self.image_encoder = TokenEncoder(IMG_DIM, width, enc_heads, 1, out_dim=hidden)
            self.audio_encoder = (TokenEncoder(AUD_DIM, width, enc_heads, 1, out_dim=hidden)
                                  if encoder != "mixed" else Encoder(AUD_DIM, width, hidden))
        else:
            self.image_encoder = Encoder(IMG_DIM, width, hidden)
            self.audio_encoder = Encoder(AUD_DIM, width, hidden)
        self.embed = Embedding(hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads=heads) for _ in range(layers))
        self.head = Head(hidden)
        if tie:  # the head's output weight is the token embedding (stages 0 and P-1 share it)
            self.head.out.weight = self.embed.tok.weight
        if dropout:
            for seq in [m for m in self.modules() if isinstance(m, nn.Sequential)]:
                seq.append(nn.Dropout(dropout))

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        tokens = batch["tokens"]
        h = self.embed(tokens)
        for enc, x, n, tid in ((self.image_encoder, batch["image"], batch["image_len"], IMG),
                               (self.audio_encoder, batch["audio"], batch["audio_len"], AUD)):
            has = (n > 0).nonzero().squeeze(1)
            if has.numel():
                h = scatter_features(h, tokens, tid, valid_rows(enc(x[has], n[has]), n[has]))
        for block in self.blocks:
            h = block(h)
        return self.head(h)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        total, count = loss_terms(self(batch), batch)
        return total / count

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        logits = self(batch)
        total, count = loss_terms(logits, batch)
        hits, n = accuracy_terms(logits, batch)
        return {"loss": total / count, "acc": hits / n}

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)

    def configure_omni(self) -> OmniSpec:
        return OmniSpec(
            modalities=[Modality("image", self.image_encoder, "image", "image_len", IMG),
                        Modality("audio", self.audio_encoder, "audio", "audio_len", AUD)],
            embedding=self.embed, blocks=list(self.blocks), head=self.head, loss=loss_terms,
            metrics={"acc": accuracy_terms},
            tp_plan=example.multimodal_tp_plan((("image", self.image_encoder, IMG),
                                                ("audio", self.audio_encoder, AUD))))


class LoggingToy(OmniToy):
    """OmniToy that logs the way docs/omni/quickstart.md says: from the batch-end hooks, which
    get the same values in a plain run and under OmniStrategy."""

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        logits = self(batch)
        total, count = loss_terms(logits, batch)
        hits, n = accuracy_terms(logits, batch)
        return {"loss": total / count, "acc": hits / n}

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self.log("train_loss", outputs["loss"], prog_bar=True)
        self.log("train_acc", outputs["acc"])

    def on_validation_batch_end(self, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self.log("val_loss", outputs["loss"])


class ToyData(Dataset):
    """Deterministic samples; samples 4k..4k+3 of every 16 have no image, so with 4 samples per
    microbatch a whole microbatch has none."""

    def __init__(self, n: int, seed: int = 0, dtype: torch.dtype = torch.float64,
                 no_image_block: int = 4) -> None:
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for i in range(n):
            li = 0 if (i % 16) // no_image_block == 1 else int(torch.randint(1, IMG_MAX + 1, (1,),
                                                                              generator=g))
            la = int(torch.randint(0, AUD_MAX + 1, (1,), generator=g))
            text = int(torch.randint(3, SEQ - li - la + 1, (1,), generator=g))
            tokens = torch.full((SEQ,), PAD, dtype=torch.long)
            tokens[:li] = IMG
            tokens[li:li + la] = AUD
            tokens[li + la:li + la + text] = torch.randint(3, VOCAB, (text,), generator=g)
            labels = torch.full((SEQ,), -100, dtype=torch.long)
            labels[li + la:li + la + text - 1] = tokens[li + la + 1:li + la + text]
            image = torch.zeros(IMG_MAX, IMG_DIM, dtype=dtype)
            image[:li] = torch.randn(li, IMG_DIM, generator=g, dtype=dtype)
            audio = torch.zeros(AUD_MAX, AUD_DIM, dtype=dtype)
            audio[:la] = torch.randn(la, AUD_DIM, generator=g, dtype=dtype)
            self.items.append({"tokens": tokens, "labels": labels, "image": image,
                               "image_len": torch.tensor(li), "audio": audio,
                               "audio_len": torch.tensor(la)})

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return self.items[i]


class LazyToy(OmniToy):
    """The same model built in ``configure_model`` (Lightning's hook for large models): under
    OmniStrategy on the meta device, each rank materializing only its stage."""

    def __init__(self, hidden: int = 16, layers: int = 4, lr: float = 1e-2, width: int = 12,
                 encoder: str = "plain", tie: bool = False,
                 dtype: torch.dtype = torch.float64) -> None:
        pl.LightningModule.__init__(self)
        self.lr = lr
        self._shape = (hidden, layers, width, encoder, tie)
        self._dtype = dtype

    def configure_model(self) -> None:
        if hasattr(self, "blocks"):
            return
        self._build(*self._shape)
        self.to(self._dtype)


def make_model(seed: int = 0, logging: bool = False, dtype: torch.dtype = torch.float64,
               lazy: bool = False, **kw: Any) -> OmniToy:
    torch.manual_seed(seed)
    if lazy:
        return LazyToy(dtype=dtype, **kw)
    return (LoggingToy if logging else OmniToy)(**kw).to(dtype)


def global_batches(data: ToyData, batch: int) -> list[dict[str, Tensor]]:
    loader = DataLoader(data, batch_size=batch, shuffle=False)
    return list(loader)


def reference_run(steps: int, batch: int, data: ToyData, seed: int = 0,
                  **kw: Any) -> dict[str, Any]:
    """Single process, the module's own training_step on the global batch."""
    model = make_model(seed, **kw)
    opt = model.configure_optimizers()
    losses, grads0 = [], None
    batches = global_batches(data, batch)
    for i in range(steps):
        b = batches[i % len(batches)]  # epochs repeat the same order (no shuffling)
        opt.zero_grad()
        loss = model.training_step(b, i)
        loss.backward()
        if i == 0:
            grads0 = {n: p.grad.clone() for n, p in model.named_parameters()}
        losses.append(float(loss.detach()))
        opt.step()
    from lightning_omni.runtime.zero import state_bytes

    return {"losses": losses, "grads0": grads0, "state_bytes": state_bytes(opt),
            "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


# -- running Lightning on spawned processes ---------------------------------------------------
def _entry(rank: int, world: int, port: int, out_dir: str, fn: Callable, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world),
                      RANK=str(rank), LOCAL_RANK=str(rank), NODE_RANK="0")
    torch.set_num_threads(1)
    try:
        result: Any = ("ok", fn(rank, world, *args))
    except BaseException:  # report every failure to the parent, with its traceback
        result = ("error", traceback.format_exc())
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    import torch.distributed as dist

    if dist.is_initialized() and result[0] == "ok":
        dist.barrier()
        dist.destroy_process_group()


def spawn(fn: Callable, world: int, *args: Any, timeout: float = 150.0,
          allow_failures: bool = False) -> list[Any]:
    """``fn(rank, world, *args)`` on ``world`` spawned processes with torchrun-like environment
    variables (Lightning then uses them instead of launching); per-rank results."""
    return run_processes(_entry, world, fn, args, timeout, allow_failures)


# -- a Lightning run on each rank, recording what the equivalence tests compare ----------------
class _Record(pl.Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []
        self.grads0: dict[str, Tensor] = {}
        self.plans: list[tuple[bool, bool]] = []  # (own actions as planned, others differ)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))
        # a plan made from this replica's data alone (one process per replica): its own
        # actions are the whole plan's (every rank calls global_plan: a collective)
        result, engine = trainer.strategy.last_step, trainer.strategy.engine
        whole, rank = engine.global_plan(result), engine.layout.rank
        self.plans.append((whole.actions[rank] == result.plan.actions[rank],
                           whole.actions != result.plan.actions))
        if not self.grads0:
            hosted = trainer.strategy.engine.hosted_param_ids()
            self.grads0 = {n: p.grad.clone() for n, p in module.named_parameters()
                           if id(p) in hosted and p.grad is not None}


def _trainer(world: int, strategy, steps: int, callbacks: list, **kw: Any) -> pl.Trainer:
    return pl.Trainer(accelerator="cpu", devices=world, strategy=strategy, max_steps=steps,
                      logger=kw.pop("logger", False),
                      enable_checkpointing=kw.pop("enable_checkpointing", False),
                      enable_progress_bar=False, enable_model_summary=False,
                      callbacks=callbacks, use_distributed_sampler=False, **kw)


def _loader(rank: int, pp: int, dp: int, samples: int, batch: int) -> DataLoader:
    data = ToyData(samples)
    # the same global batches, in order, as the single-process reference
    sampler = DistributedSampler(data, num_replicas=dp, rank=rank // pp, shuffle=False)
    return DataLoader(data, batch_size=batch // dp, sampler=sampler)


def fit_worker(rank: int, world: int, pp: int, dp: int, schedules: list[str], steps: int,
               batch: int, samples: int, ckpt_dir: str | None = None,
               zero_stage: int = 0, lazy: bool = False) -> dict[str, Any]:
    """Per schedule: losses, first-step gradients, final values of the hosted parameters and
    the bytes of optimizer state this rank holds. With ``ckpt_dir`` (last schedule): also a
    run stopped after one epoch, checkpointed, and resumed in a fresh Trainer and model up to
    ``steps``."""
    from lightning_omni import OmniStrategy
    from lightning_omni.runtime.zero import state_bytes

    out: dict[str, Any] = {}
    for schedule in schedules:
        model = make_model(0, lazy=lazy)
        rec = _Record()
        strategy = OmniStrategy(pipeline_parallel=pp, data_parallel=dp, schedule=schedule,
                                num_microbatches=4, zero_stage=zero_stage)
        loader = _loader(rank, pp, dp, samples, batch)
        if lazy:  # built in fit: from the seed, as the reference's model right after seeding
            torch.manual_seed(0)
        _trainer(world, strategy, steps, [rec]).fit(model, loader)
        hosted = strategy.engine.hosted_param_ids() if strategy.engine else set()
        out[schedule] = {"losses": rec.losses, "grads0": rec.grads0, "plans": rec.plans,
                         "params": {n: p.detach().clone() for n, p in model.named_parameters()
                                    if id(p) in hosted},
                         "param_bytes": sum(p.numel() * p.element_size()
                                            for p in model.parameters()),
                         "optimizer": type(strategy.optimizers[0]).__name__,
                         "state_bytes": state_bytes(strategy.optimizers[0])}
    if ckpt_dir is not None:
        path = os.path.join(ckpt_dir, "epoch0.ckpt")
        strategy = OmniStrategy(pipeline_parallel=pp, data_parallel=dp, schedule=schedule,
                                num_microbatches=4, zero_stage=zero_stage)
        # Lightning's own checkpoint callback, at the end of the first epoch
        save = pl.callbacks.ModelCheckpoint(dirpath=ckpt_dir, filename="epoch0", save_top_k=-1)
        trainer = _trainer(world, strategy, -1, [save], max_epochs=1, enable_checkpointing=True)
        model, loader = make_model(0, lazy=lazy), _loader(rank, pp, dp, samples, batch)
        if lazy:
            torch.manual_seed(0)
        trainer.fit(model, loader)
        rec = _Record()
        strategy = OmniStrategy(pipeline_parallel=pp, data_parallel=dp, schedule=schedule,
                                num_microbatches=4, zero_stage=zero_stage)
        # epoch-based, like the checkpoint (max_steps makes Lightning resume mid-epoch)
        epochs = steps * batch // samples
        _trainer(world, strategy, -1, [rec], max_epochs=epochs).fit(
            make_model(1, lazy=lazy), _loader(rank, pp, dp, samples, batch), ckpt_path=path)
        out["resumed_losses"] = rec.losses
    return out


def strategy_worker(rank: int, world: int, log_dir: str) -> dict[str, Any]:
    """On 2 ranks (PP=2): TensorBoard metrics of a short fit, the error for a batch that does
    not split into the microbatches, then rank 1 dies mid-step and rank 0 must get a clear
    error within the (short) timeout instead of hanging."""
    import time
    from datetime import timedelta

    from lightning.pytorch.loggers import TensorBoardLogger

    from lightning_omni import OmniStrategy
    from lightning_omni.runtime import OmniRuntimeError, ParallelDims, parallelize

    out: dict[str, Any] = {}
    strategy = OmniStrategy(pipeline_parallel=2, num_microbatches=4,
                            timeout=timedelta(seconds=20))
    logger = TensorBoardLogger(log_dir, name="omni", version=0)
    _trainer(world, strategy, 2, [], logger=logger, log_every_n_steps=1).fit(
        make_model(0), _loader(rank, 2, 1, 32, 16))
    if rank == 0:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(logger.log_dir)
        acc.Reload()
        out["tags"] = {t: [e.value for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}
    strategy = OmniStrategy(pipeline_parallel=2, num_microbatches=3)
    try:
        _trainer(world, strategy, 1, []).fit(make_model(0), _loader(rank, 2, 1, 32, 16))
    except ValueError as err:
        out["split_error"] = str(err)
    # a lost rank: rank 1 exits abruptly after one step
    model = make_model(0)
    spec = model.configure_omni()
    dims = ParallelDims(pp=2, dp=1, num_microbatches=4).for_world(world, world)
    engine = parallelize(spec, dims, dims.layout(rank, spec.costs_of_blocks()),
                         torch.device("cpu"), timedelta(seconds=5))
    batch = global_batches(ToyData(16), 16)[0]
    engine.step(batch)
    if rank == 1:
        os._exit(3)
    t0 = time.perf_counter()
    try:
        engine.step(batch)
    except OmniRuntimeError as err:
        out["lost_rank_error"] = str(err)
    out["lost_rank_seconds"] = time.perf_counter() - t0
    return out


def recompute_worker(rank: int, world: int, runs: dict[str, dict], steps: int, batch: int,
                     samples: int) -> dict[str, Any]:
    """Per run (name -> ``pp``, ``dp``, ``model``: ``make_model`` options, ``seed``: the
    random state each rank starts the fit from (dropout), and OmniStrategy's other keyword
    arguments): losses, first-step gradients and final values of the hosted parameters,
    this rank's stage and the last step's peak of saved activation bytes."""
    from lightning_omni import OmniStrategy

    out: dict[str, Any] = {}
    for name, run in runs.items():
        kw = dict(run)
        pp, dp, model_kw, seed = kw.pop("pp"), kw.pop("dp"), kw.pop("model", {}), kw.pop("seed")
        model = make_model(0, **model_kw)
        torch.manual_seed(seed + rank)
        strategy = OmniStrategy(pipeline_parallel=pp, data_parallel=dp, num_microbatches=4, **kw)
        rec = _Record()
        _trainer(world, strategy, steps, [rec]).fit(model, _loader(rank, pp, dp, samples, batch))
        hosted = strategy.engine.hosted_param_ids()
        out[name] = {"losses": rec.losses, "grads0": rec.grads0,
                     "params": {n: p.detach().clone() for n, p in model.named_parameters()
                                if id(p) in hosted},
                     "stage": strategy.engine.layout.stage,
                     "peak": strategy.last_step.record.peak_saved_bytes}
    return out


# -- LSSP and grouped reordering under the strategy ---------------------------------------------
class HeavyFirstSampler(torch.utils.data.Sampler):
    """Replica ``replica``'s share of every global batch, where replica 0 gets the samples with
    the most encoder rows: the uneven load grouped reordering must even out. The union of the
    replicas' batches is still the plain global batch (the reference's)."""

    def __init__(self, data: ToyData, batch: int, dp: int, replica: int) -> None:
        self.data, self.batch, self.dp, self.replica = data, batch, dp, replica

    def _rows(self, i: int) -> int:
        item = self.data[i]
        return int(item["image_len"]) + int(item["audio_len"])

    def __iter__(self):
        per = self.batch // self.dp
        for lo in range(0, len(self.data) - self.batch + 1, self.batch):
            block = sorted(range(lo, lo + self.batch), key=lambda i: (-self._rows(i), i))
            yield from block[self.replica * per:(self.replica + 1) * per]

    def __len__(self) -> int:
        return len(self.data) // self.batch * (self.batch // self.dp)


def lssp_worker(rank: int, world: int, pp: int, dp: int, modes: dict[str, dict], steps: int,
                batch: int, samples: int, log_dir: str | None = None) -> dict[str, Any]:
    """Per mode (OmniStrategy keyword arguments, ``heavy``: replica 0 loads the heavy samples):
    losses and first-step gradients of a short fit of the token-encoder toy model, and the
    last step's group-plan metrics; with ``log_dir``, the first mode's TensorBoard scalars."""
    from lightning.pytorch.loggers import TensorBoardLogger

    from lightning_omni import OmniStrategy

    out: dict[str, Any] = {}
    for i, (name, kw) in enumerate(modes.items()):
        kw = dict(kw)
        heavy = kw.pop("heavy", False)
        data = ToyData(samples)
        sampler = (HeavyFirstSampler(data, batch, dp, rank // pp) if heavy else
                   DistributedSampler(data, num_replicas=dp, rank=rank // pp, shuffle=False))
        loader = DataLoader(data, batch_size=batch // dp, sampler=sampler)
        strategy = OmniStrategy(pipeline_parallel=pp, data_parallel=dp, num_microbatches=4,
                                ulysses_backend="torch", **kw)
        logger = (TensorBoardLogger(log_dir, name="omni", version=0)
                  if log_dir is not None and i == 0 else False)
        rec = _Record()
        _trainer(world, strategy, steps, [rec], logger=logger, log_every_n_steps=1).fit(
            make_model(0, encoder="token"), loader)
        res = {"losses": rec.losses, "grads0": rec.grads0,
               "metrics": strategy.last_step.grouped.metrics(),
               "bytes": strategy.last_step.record.bytes_sent}
        if logger and rank == 0:
            from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

            acc = EventAccumulator(logger.log_dir)
            acc.Reload()
            res["tags"] = {t: [e.value for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}
        out[name] = res
    return out


# -- the user's path: a plain Lightning run against the same run under OmniStrategy -------------
class _Outputs(pl.Callback):
    """Per step: the outputs Lightning hands the batch-end hooks; per validation batch too."""

    def __init__(self) -> None:
        self.train: list[dict[str, float]] = []
        self.val: list[dict[str, float]] = []
        self.pre_clip_norm: list[float] = []
        self.pre_clip_max: list[float] = []
        self.sanity: list[dict[str, float]] = []
        self.grads0: dict[str, Tensor] = {}

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.train.append({k: float(v) for k, v in outputs.items()})

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx,
                                dataloader_idx=0) -> None:
        rows = self.sanity if trainer.sanity_checking else self.val
        rows.append({k: float(v) for k, v in outputs.items()})

    def on_before_optimizer_step(self, trainer, module, optimizer) -> None:
        if not self.grads0:  # the first step's gradients, before clipping, where held
            self.grads0 = {n: p.grad.clone() for n, p in module.named_parameters()
                           if p.grad is not None}
        # the global gradient norm before clipping (plain run only: one process holds it all)
        if trainer.world_size == 1 and not isinstance(trainer.strategy, _omni_strategy()):
            grads = [p.grad for p in module.parameters() if p.grad is not None]
            self.pre_clip_norm.append(float(torch.nn.utils.get_total_norm(grads)))
            self.pre_clip_max.append(max(float(g.abs().max()) for g in grads))


def _omni_strategy():
    from lightning_omni import OmniStrategy

    return OmniStrategy


def user_run(rank: int, world: int, pp: int | None, dp: int, opts: dict[str, Any]
             ) -> dict[str, Any]:
    """A short fit with validation every epoch, the user's Trainer options in ``opts``
    (``trainer``), model options (``model``), then predict. ``pp=None``: the plain run on one
    process (global batches); else OmniStrategy with ``pp`` stages and ``dp`` replicas."""
    samples, batch = opts.get("samples", 32), opts.get("batch", 16)
    dtype = opts.get("dtype", torch.float64)
    data, val = _cast(ToyData(samples), dtype), _cast(ToyData(16, seed=1), dtype)
    # seed_by_rank: every rank builds its module from its own random state (a user who does
    # not seed); the strategy must start all of them from rank 0's module, as DDP does
    seed = 1 + 7 * rank if opts.get("seed_by_rank") else 0
    model = make_model(seed, logging=True, dtype=dtype, **opts.get("model", {}))
    rec = _Outputs()
    callbacks: list = [rec]
    if opts.get("ckpt_dir"):
        callbacks.append(pl.callbacks.ModelCheckpoint(dirpath=opts["ckpt_dir"],
                                                      monitor="val_loss", save_top_k=1))
    if pp is None:
        strategy, devices, d, r = "auto", 1, 1, 0
    else:
        strategy = _omni_strategy()(pipeline_parallel=pp, data_parallel=dp, num_microbatches=4,
                                    **opts.get("strategy", {}))
        devices, d, r = world, dp, rank // pp

    def loader(ds, b):
        sampler = DistributedSampler(ds, num_replicas=d, rank=r, shuffle=False)
        return DataLoader(ds, batch_size=b // d, sampler=sampler)

    trainer = pl.Trainer(accelerator="cpu", devices=devices, strategy=strategy,
                         max_steps=opts.get("steps", 4), logger=False,
                         enable_checkpointing=bool(opts.get("ckpt_dir")),
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=callbacks, use_distributed_sampler=False,
                         num_sanity_val_steps=1, **opts.get("trainer", {}))
    trainer.fit(model, loader(data, batch), loader(val, 8))
    logged = {k: float(v) for k, v in trainer.callback_metrics.items()}
    best = (float(callbacks[-1].best_model_score), callbacks[-1].best_model_path
            ) if opts.get("ckpt_dir") else None
    validated = trainer.validate(model, loader(val, 8), verbose=False)[0]
    preds = trainer.predict(model, loader(val, 8))
    hosted = (trainer.strategy.engine.hosted_param_ids() if pp is not None
              else {id(p) for p in model.parameters()})
    return {"train": rec.train, "val": rec.val, "sanity": rec.sanity, "grads0": rec.grads0,
            "pre_clip_norm": rec.pre_clip_norm,
            "pre_clip_max": rec.pre_clip_max,
            "params": {n: p.detach().clone() for n, p in model.named_parameters()
                       if id(p) in hosted},
            "logged": logged, "best": best, "validated": validated, "preds": torch.cat(preds)}


def _cast(data: ToyData, dtype: torch.dtype) -> ToyData:
    for item in data.items:
        for k in ("image", "audio"):
            item[k] = item[k].to(dtype)
    return data


def run_recipe(module: str, args: list[str], log_dir: Path, timeout: float = 300.0) -> Any:
    """``python -m module fit ARGS`` from the repository as a user runs a recipe (one thread per
    process), its logs under ``log_dir``; the TensorBoard scalars of the run."""
    import subprocess
    import sys

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cmd = [sys.executable, "-m", module, "fit", *args, "--trainer.enable_progress_bar",
           "false", "--trainer.logger.init_args.save_dir", str(log_dir)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[2], env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (events,) = {p.parent for p in log_dir.rglob("events.out.tfevents.*")}
    scalars = EventAccumulator(str(events))
    scalars.Reload()
    return scalars
