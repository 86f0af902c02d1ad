"""OmniStrategy: Lightning glue around ``lightning_omni.runtime``.

It reuses DDPStrategy's process launch and process-group setup (gloo on CPU, NCCL on GPU),
leaves the module unwrapped, and answers Lightning's public Strategy hooks with pipelined
steps: ``training_step`` runs one whole step (forwards and backwards of every microbatch) and
hands Lightning the global loss, ``backward`` puts the step's gradients in place, and
``validation_step``/``test_step``/``predict_step`` run the same plan without its backward
half. Lightning's optimizer, LR scheduler, clipping, precision, checkpoint and logging
machinery stay as they are; the few options that cannot mean what they mean in a plain run are
refused at setup (``checks.py``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Generator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import Tensor
from torch.distributed.tensor import DTensor

from lightning_omnilab import quiet
from lightning_omnilab.checkpoint_io import use_atomic_checkpoint_io
from lightning_omnilab.process_group import ReleaseAtExit
from lightning_omnilab.validate import ArgumentTypeError, boolean, fail

from . import _registration
from .checks import check_module, check_precision, check_trainer
from .runtime import checkpoint as ckpt
from .runtime.engine import OmniEngine, StepResult, sync_parameters
from .runtime.executor import StepMode
from .runtime.failures import communicating, naming_lost_peers
from .runtime.hosting import param_hosting
from .runtime.layout import Layout
from .runtime.meta_init import InitRecording, MetaInitError, RecordInit, capture_rng, materialize
from .runtime.metrics import step_metrics
from .runtime.parallel_dims import ParallelDims, check_microbatches
from .runtime.parallelize import encoder_plan_ranks, parallelize
from .runtime.tp_stage import (
    StageTP,
    full,
    full_optimizer_state,
    make_meshes,
    reshard,
    reshard_optimizer_state,
    shard_cuts,
)
from .spec import OmniSpec, get_spec

log = logging.getLogger(__name__)

# notices a fit with this strategy triggers and its user cannot act on (lightning_omnilab.quiet);
# DeepSpeed is imported on every rank when LSSP picks its Ulysses attention
quiet.ignore_leafspec_deprecation()
quiet.drop_litlogger_tip()
quiet.drop_deepspeed_cpu_accelerator_notice()


class OmniStrategy(DDPStrategy):
    """Pipeline x data x tensor parallel training of an ``OmniSpec`` module with encoder
    multiplexing. The layout is a ``ParallelDims`` (made from the keywords below, or given as
    ``dims``); at setup ``runtime.parallelize`` shards the module and builds the engine.

    Args:
        pipeline_parallel: LLM pipeline stages per replica.
        data_parallel: replicas (default: world size / pipeline_parallel).
        schedule: ``"uniform_insertion"`` (encoder work spread over every rank of the pipeline)
            or ``"encoder_first_stage"`` (stage 0 runs all encoder work, Megatron-like).
        num_microbatches: microbatches per replica and step (default: 2 * pipeline_parallel).
        stage_blocks: LLM blocks per stage (default: balanced by ``OmniSpec.block_costs``);
            with model chunks, per virtual stage (``pipeline_parallel *
            virtual_pipeline_parallel`` counts, chunk by chunk: virtual stage ``c * pp + s`` is
            chunk ``c`` of stage ``s``).
        timeout: how long a message or collective may wait before the step fails.
        lssp: long samples' encoder work runs Ulysses sequence parallel over ranks of their
            stage's data-parallel group, short samples data parallel (docs/omni/lssp_reorder.md).
        reorder: balance encoder samples over the replicas inside each locality group.
        locality_groups: locality group id of every global rank (default: one per node);
            samples and SP groups never cross them.
        lssp_max_rows: encoder rows of one sample a rank may hold; longer samples must run
            sequence parallel (default: no limit, long means costlier than a balanced share).
        encoder_cost: ``(a, b)``: a sample of L encoder rows costs ``a * L + b * L**2``.
        ulysses_backend: ``"auto"`` (DeepSpeed if installed), ``"deepspeed"`` or ``"torch"``.
        zero_stage: 1 shards each stage's optimizer state over its data-parallel group
            (ZeRO-1, ``torch.distributed.optim.ZeroRedundancyOptimizer``); 0 replicates it.
        meta_init: modules built in ``configure_model`` (or ``Trainer.init_module``) are
            created on the meta device and each rank materializes only what it hosts, with
            the plain build's values (``runtime/meta_init.py``); False builds them whole.
        recompute: recompute every LLM block of the stage in backward (activation
            checkpointing: each block keeps only its input; ``runtime/recompute.py``).
        encoder_recompute: the same for the encoders, one layer at a time where the encoder
            exposes its layers (``blocks``, ``layers``, a nested ``encoder.layers``), else
            the whole encoder call.
        virtual_pipeline_parallel: model chunks per pipeline stage (an interleaved pipeline,
            Megatron-LM's interleaved 1F1B; docs/omni/runtime.md). Above 1 it needs
            pipeline_parallel >= 2, num_microbatches a multiple of pipeline_parallel, at
            least pipeline_parallel * virtual_pipeline_parallel blocks.
        tensor_parallel: processes per pipeline stage and replica, sharing the stage's
            weights by the spec's ``tp_plan`` (DTensor ``parallelize_module``; TP innermost:
            world = pipeline_parallel * data_parallel * tensor_parallel).
        encoder_tensor_parallel: the encoders' TP degree, a divisor of ``tensor_parallel``
            (default: equal). Below it, each TP group runs ``tensor_parallel //
            encoder_tensor_parallel`` encoder lanes, each encoding its share of the samples
            (1: plain encoders, one lane per TP rank).
        dims: the same layout as one ``ParallelDims`` (``lightning_omni.ParallelDims``),
            instead of the keywords above (``pipeline_parallel`` ... ``encoder_recompute``):
            ``ParallelDims(pp=2, tp=2, encoder_tp=1)`` is ``pipeline_parallel=2,
            tensor_parallel=2, encoder_tensor_parallel=1``. Either way the layout is
            validated once, here, and is ``self.dims``; the keyword names stay readable as
            attributes (``strategy.pipeline_parallel``).
        check_finite: refuse a batch holding NaN or inf in a floating-point tensor before its
            step, with an ``OmniSpecError`` naming the key and the sample, on every rank (one
            ``isfinite`` pass per floating-point tensor); False lets it through to Lightning
            (a NaN loss, then NaN weights).
        **kwargs: passed on to Lightning's ``DDPStrategy`` (e.g. ``process_group_backend``,
            ``cluster_environment``, ``checkpoint_io``).
    """

    strategy_name = "omni"

    def __init__(self, pipeline_parallel: int = 1, data_parallel: int | None = None,
                 schedule: str = "uniform_insertion", num_microbatches: int | None = None,
                 stage_blocks: list[int] | None = None,
                 timeout: timedelta = timedelta(minutes=10), lssp: bool = False,
                 reorder: bool = False, locality_groups: list[int] | None = None,
                 lssp_max_rows: float | None = None,
                 encoder_cost: tuple[float, float] = (1.0, 0.0),
                 ulysses_backend: str = "auto", zero_stage: int = 0, meta_init: bool = True,
                 recompute: bool = False, encoder_recompute: bool = False,
                 virtual_pipeline_parallel: int = 1,
                 tensor_parallel: int = 1, encoder_tensor_parallel: int | None = None,
                 dims: ParallelDims | None = None, check_finite: bool = True,
                 **kwargs: Any) -> None:
        from_keywords = ParallelDims(
            pp=pipeline_parallel, dp=data_parallel, tp=tensor_parallel,
            encoder_tp=encoder_tensor_parallel, vpp=virtual_pipeline_parallel,
            num_microbatches=num_microbatches, schedule=schedule, stage_blocks=stage_blocks,
            lssp=lssp, reorder=reorder, locality_groups=locality_groups,
            lssp_max_rows=lssp_max_rows, encoder_cost=encoder_cost,
            ulysses_backend=ulysses_backend, zero_stage=zero_stage, recompute=recompute,
            encoder_recompute=encoder_recompute)
        if dims is not None:
            if not isinstance(dims, ParallelDims):
                fail("dims", "a ParallelDims", type(dims).__name__, ArgumentTypeError)
            if from_keywords != ParallelDims():
                fail("dims", "the layout given once: as dims or as keyword arguments "
                     f"(pipeline_parallel=, ...), not both; the keywords said {from_keywords}",
                     str(dims))
        boolean("meta_init", meta_init)
        boolean("check_finite", check_finite)
        if not isinstance(timeout, timedelta):
            fail("timeout", "a datetime.timedelta > 0", timeout, ArgumentTypeError)
        if timeout <= timedelta(0):
            fail("timeout", "a datetime.timedelta > 0", timeout)
        super().__init__(timeout=timeout, **kwargs)
        # every degree and option of the layout, validated; ``for_world`` fills in ``dp``
        self.dims: ParallelDims = dims or from_keywords
        self.meta_init = meta_init
        self.check_finite = check_finite
        self._init_recording: InitRecording | None = None
        self._built_here = False  # this rank materialized its stage from a meta build
        self._elsewhere: dict[int, tuple[int, ...]] = {}  # shapes of what it never built
        self._meta_layout: Layout | None = None  # fixed before a meta build was materialized
        self._tp_meshes: StageTP | None = None  # made by a meta build under TP (its shards)
        # (sources, ids not hosted) of pretrained weights read once TP has sharded the stage
        self._pretrained: tuple[list, set[int]] | None = None
        self.pretrained_loads: list = []  # what this rank read of pretrained weights (reports)
        self.omni_timeout = timeout
        self.engine: OmniEngine | None = None
        self.spec: OmniSpec | None = None
        self.last_step: StepResult | None = None
        self._release = ReleaseAtExit()  # the process group, once a run has ended cleanly
        self._failed = False  # the run raised (Lightning called ``on_exception``)

    # the keyword names, read-only, as ``self.dims`` holds them (docs/architecture.md)
    pipeline_parallel = property(lambda self: self.dims.pp)
    data_parallel = property(lambda self: self.dims.dp)
    tensor_parallel = property(lambda self: self.dims.tp)
    encoder_tensor_parallel = property(lambda self: self.dims.encoder_tp)
    virtual_pipeline_parallel = property(lambda self: self.dims.vpp)
    num_microbatches = property(lambda self: self.dims.num_microbatches)
    schedule = property(lambda self: self.dims.schedule)
    stage_blocks = property(lambda self: _as_list(self.dims.stage_blocks))
    lssp = property(lambda self: self.dims.lssp)
    reorder = property(lambda self: self.dims.reorder)
    locality_groups = property(lambda self: _as_list(self.dims.locality_groups))
    lssp_max_rows = property(lambda self: self.dims.lssp_max_rows)
    encoder_cost = property(lambda self: self.dims.encoder_cost)
    ulysses_backend = property(lambda self: self.dims.ulysses_backend)
    zero_stage = property(lambda self: self.dims.zero_stage)
    recompute = property(lambda self: self.dims.recompute)
    encoder_recompute = property(lambda self: self.dims.encoder_recompute)

    # -- checks before processes and process groups exist --------------------------------
    def connect(self, model) -> None:
        if not is_overridden("configure_model", model):  # else built later: checked at setup
            get_spec(model).validate(self.pipeline_parallel)
        super().connect(model)

    def _world(self) -> int:
        return self.num_nodes * self.num_processes

    def setup_environment(self) -> None:
        self.dims = self.dims.for_world(self._world(), self.num_processes)
        super().setup_environment()
        self._release.arm()

    def on_exception(self, exception: BaseException) -> None:
        self._release.failed()
        self._failed = True
        super().on_exception(exception)

    # -- Lightning's own collectives (checkpoint paths, logged metrics, barriers): named ---
    def barrier(self, name: str | None = None) -> None:
        with communicating(f"rank {self.global_rank}: Lightning's barrier {name or ''} over all "
                           "ranks", self.omni_timeout):
            super().barrier(name)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        with communicating(f"rank {self.global_rank}: Lightning's broadcast from rank {src}",
                           self.omni_timeout):
            return super().broadcast(obj, src)

    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        with communicating(f"rank {self.global_rank}: Lightning's reduce ({reduce_op}) over all "
                           "ranks", self.omni_timeout):
            return super().reduce(tensor, group=group, reduce_op=reduce_op)

    def all_gather(self, tensor: Tensor, group: Any = None, sync_grads: bool = False) -> Tensor:
        with communicating(f"rank {self.global_rank}: Lightning's all_gather over all ranks",
                           self.omni_timeout):
            return super().all_gather(tensor, group=group, sync_grads=sync_grads)

    def teardown(self) -> None:
        """Lightning's teardown, except the move of a module still on the meta device (its
        build or spec raised before setup materialized it: there is nothing to move) and of
        a failed run's DTensor parameters (a step cut short leaves references that make the
        move's swap raise): either move would raise over the run's own error."""
        module = self.lightning_module
        tensors = () if module is None else (*module.parameters(), *module.buffers())
        if not any(t.is_meta or (self._failed and isinstance(t, DTensor)) for t in tensors):
            super().teardown()
            return
        # Lightning's teardown moves `lightning_module` (this attribute) unless it is None
        self._lightning_module = None
        try:
            super().teardown()
        finally:
            self._lightning_module = module

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        # every rank of a pipeline replica (its stages and their TP ranks) reads the same samples
        return {"num_replicas": self.data_parallel or 1,
                "rank": self.global_rank // (self.pipeline_parallel * self.tensor_parallel)}

    # -- precision: Lightning's plugin, checked, with clipping over the whole model ----------
    @property
    def precision_plugin(self) -> Precision:
        return super().precision_plugin

    @precision_plugin.setter
    def precision_plugin(self, plugin: Precision | None) -> None:
        if plugin is not None and not isinstance(plugin, _GlobalClipping):
            check_precision(plugin)
            plugin = _with_global_clipping(plugin, self)
        self._precision_plugin = plugin

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        """Setup gives every rank rank 0's initial weights; a sharded checkpoint is loaded
        after that, each rank reading its stage's shard."""
        return True

    def clip_grad_norm(self, max_norm: float) -> Tensor | None:
        """``clip_grad_norm_`` over the whole pipelined model (Lightning's
        ``gradient_clip_val`` with the norm algorithm lands here)."""
        return self.engine.clip_grad_norm(max_norm) if self.engine is not None else None

    # -- model: built on the meta device, each rank materializes what it hosts ---------------
    @contextmanager
    def tensor_init_context(self, empty_init: bool | None = None) -> Generator[None, None, None]:
        """Lightning enters this around ``configure_model``: tensors are created on the meta
        device and the calls that initialize them recorded, to be replayed for this rank's
        stage at setup (``runtime/meta_init.py``)."""
        if not self.meta_init:
            with super().tensor_init_context(empty_init):
                yield
            return
        recording = InitRecording()
        capture_rng(recording, self.root_device)
        try:
            with torch.device("meta"), RecordInit(recording), \
                    self.precision_plugin.tensor_init_context():
                yield
        except RuntimeError as err:
            if _from_pretrained_on_meta(err):
                raise MetaInitError(
                    "configure_model: transformers' from_pretrained cannot run inside "
                    "OmniStrategy's meta-device build (each rank materializes only the stage "
                    "it hosts). Call lightning_omni.integrations.hf_pretrained."
                    "from_pretrained(ModelClass, path) there instead: the same call in a plain "
                    "run, and under OmniStrategy each rank reads only its hosted tensors from "
                    "the safetensors files (docs/omni/hf_llava.md). Or pass "
                    "OmniStrategy(meta_init=False) to load the whole model on every rank"
                ) from err
            raise
        if not torch.equal(torch.get_rng_state(), recording.cpu_rng):
            raise MetaInitError("configure_model: it reseeded the random generator while "
                                "building (torch.manual_seed?), which a meta-device build "
                                "cannot replay; seed before Trainer.fit (seed_everything) or "
                                "pass OmniStrategy(meta_init=False)")
        if recording.calls or recording.sources:
            self._init_recording = recording

    def _materialize(self, module) -> bool:
        """Replay the meta build for this rank (rank 0's RNG state on every rank, so every
        stage gets the values of the one module rank 0 would build). False: nothing to do."""
        recording = self._init_recording
        if recording is None or not any(p.is_meta for p in module.parameters()):
            return False
        spec = get_spec(module)
        # the layout balances blocks by parameter counts: fixed now, while every rank still
        # sees the full shapes (afterwards the blocks hosted elsewhere are empty here)
        self._meta_layout = layout = self._layout(spec)
        hosting = param_hosting(spec, layout, self.dims.schedule)
        elsewhere = [p for p, h in zip(hosting.params, hosting.holders, strict=True)
                     if layout.rank not in h]
        recording.cpu_rng, recording.cuda_rng = self.broadcast(
            (recording.cpu_rng, recording.cuda_rng), src=0)
        self._elsewhere = {id(p): tuple(p.shape) for p in elsewhere}  # for the shape probe
        # pretrained weights (hf_pretrained.from_pretrained): allocated, then read from their
        # files for what this rank hosts, never initialized first
        filled = [t for source in recording.sources for t in source.tensors()]
        shards = {}
        if self.dims.tp > 1:  # each TP-sharded parameter cut to this process's shard at once
            self._tp_meshes = make_meshes(layout, self.dims.encoder_tp, self.root_device,
                                          self.omni_timeout)
            shards = shard_cuts(spec, layout, layout.rank in encoder_plan_ranks(
                self.dims, layout), self._tp_meshes)
        materialize(module, recording, elsewhere, self.root_device, filled=filled,
                    shards=shards)
        # read after parallelize: under TP each rank reads only its shards (TP 1: the whole)
        self._pretrained = (list(recording.sources), {id(p) for p in elsewhere})
        recording.sources.clear()
        self._init_recording = None
        return True

    def _layout(self, spec: OmniSpec) -> Layout:
        spec.validate(self.dims.pp)
        return self.dims.layout(self.global_rank, spec.costs_of_blocks())

    # -- model: no wrapper; one engine per module and layout ----------------------------------
    def setup(self, trainer) -> None:
        assert self.accelerator is not None
        self.accelerator.setup(trainer)
        module = self.lightning_module
        check_trainer(trainer, self)
        check_module(module)
        self._built_here = self._materialize(module)  # a meta build, before it is moved
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        self.engine = self._engine_for(module)
        self.engine.check_finite = self.check_finite
        if self._pretrained is not None:  # the meta build's pretrained tensors, now sharded
            sources, skip = self._pretrained
            self._pretrained = None
            self.pretrained_loads = [source.load(skip, self.root_device, sharded=True)
                                     for source in sources]
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
            if self.dims.zero_stage == 1:
                self._shard_optimizers()
        self.setup_precision_plugin()

    def _shard_optimizers(self) -> None:
        """ZeRO-1 (``runtime/zero.py``): each optimizer over this rank's parameters, state
        sharded over the stage's data-parallel group; LR schedulers follow it."""
        engine = self.engine
        lay = engine.layout
        group = engine.groups.get(lay.stage_group(lay.stage))
        if group is None:  # one replica: nothing to shard over
            return
        from .runtime.zero import shard_optimizer  # torch.distributed.optim only when asked

        sharded = [shard_optimizer(opt, engine.hosting.held(), group) for opt in self.optimizers]
        for old, new in zip(self.optimizers, sharded, strict=True):
            for config in self.lr_scheduler_configs:
                if config.scheduler.optimizer is old:
                    config.scheduler.optimizer = new
        self.optimizers = sharded

    def optimizer_state(self, optimizer) -> dict[str, Any]:
        """A ZeRO-1 optimizer's state gathered on replica 0 of each stage (the rank that
        writes the stage's shard); every rank of the stage's group takes part."""
        inner = getattr(optimizer, "_optimizer", optimizer)
        with naming_lost_peers(f"rank {self.global_rank}: gathering the optimizer state for a "
                               "checkpoint"):
            if hasattr(inner, "consolidate_state_dict") and self.engine is not None:
                inner.consolidate_state_dict(to=0)
                if self.engine.layout.replica != 0:
                    return {}
                # whole tensors: under TP every TP rank of replica 0's stage gathers (TP 1: as is)
                return full_optimizer_state(inner.state_dict(), inner)
            return full(super().optimizer_state(optimizer))  # under TP every TP rank gathers

    def _engine_for(self, module) -> OmniEngine:
        """This strategy's engine; a module already split by another OmniStrategy of the same
        dims keeps that one (its other stages' parameters are gone)."""
        if self.engine is not None:
            return self.engine
        previous = getattr(module, "_omni_engine", None)
        if previous is not None:
            if previous.dims != self.dims:
                raise ValueError(
                    f"{type(module).__name__}: this module was already split into pipeline "
                    f"stages by another OmniStrategy ({previous.dims}) and holds only its "
                    f"stage's parameters; expected {self.dims}. Reuse that OmniStrategy (or "
                    "Trainer), or build a new module and load a consolidated checkpoint "
                    "(lightning_omni.runtime.consolidate)")
            return previous
        self.spec = get_spec(module)
        layout = self._meta_layout or self._layout(self.spec)
        if not self._built_here:  # each rank built the whole module: take rank 0's values
            sync_parameters(self.spec, self.omni_timeout, self.global_rank)  # before sharding
        engine = parallelize(self.spec, self.dims, layout, self.root_device, self.omni_timeout,
                             self._elsewhere, self._tp_meshes)
        module.__dict__["_omni_engine"] = engine  # the module's split, under its dims
        if layout.global_rank == 0:  # the same on every rank: said once per run
            per = "stage" if layout.vpp == 1 else \
                f"virtual stage ({layout.vpp} model chunks per stage)"
            log.info("OmniStrategy layout: %s; LLM blocks per %s %s; meta build materialized "
                     "per stage: %s", self.dims, per,
                     [hi - lo for lo, hi in layout.block_bounds], self._built_here)
        log.debug("rank %d: stage %d, replica %d, TP rank %d, LLM blocks %s",
                  layout.global_rank, layout.stage, layout.replica, layout.tp_rank,
                  layout.block_bounds[layout.stage] if layout.vpp == 1
                  else layout.chunk_bounds(layout.stage))
        return engine

    def on_train_start(self) -> None:
        """Refuse a loader whose batches cannot split into the microbatches, before step 1."""
        super().on_train_start()
        loader = self.lightning_module.trainer.train_dataloader
        size = getattr(loader, "batch_size", None)
        if isinstance(size, int):
            check_microbatches(size, self.num_microbatches, " (the train loader's batch_size)")
        if isinstance(size, int) and not getattr(loader, "drop_last", True):
            n = len(getattr(loader, "sampler", ()) or ())
            if n % size % self.num_microbatches != 0:
                raise ValueError(f"batch: the last batch of an epoch has {n % size} samples, "
                                 f"not divisible by num_microbatches={self.num_microbatches}; "
                                 "use drop_last=True or a matching dataset size")

    # -- steps: Lightning's public Strategy hooks ----------------------------------------------
    def training_step(self, batch: dict[str, Tensor], batch_idx: int, *args: Any) -> dict:
        """One pipelined step: every microbatch's forward and backward. Lightning zeroes the
        gradients between ``training_step`` and ``backward``, so they wait aside until
        ``backward`` puts them back."""
        trainer = self.lightning_module.trainer
        result = self.engine.step(batch, StepMode.TRAIN, self.precision_plugin.train_step_context,
                                  where=f"training step {trainer.global_step}")
        self.last_step = result
        if log.isEnabledFor(logging.DEBUG):
            log.debug("training step %d: %d tokens, %d actions on this rank, %s",
                      trainer.global_step, result.tokens,
                      len(result.plan.actions[self.engine.layout.rank]),
                      "grouped encoder plan" if result.grouped is not None
                      else "per-replica encoder plan")
        self._step_grads = [(p, p.grad) for p in self.engine.executor.owned_params()]
        for p, _ in self._step_grads:
            p.grad = None
        if trainer.logger is not None and trainer.global_step % trainer.log_every_n_steps == 0:
            whole = replace(result, plan=self.engine.global_plan(result))
            metrics = step_metrics(whole, self.engine.layout)
            if dist.get_rank() == 0:
                trainer.logger.log_metrics(metrics, step=trainer.global_step)
        return self._outputs(result)

    def backward(self, closure_loss: Tensor, optimizer, *args: Any, **kwargs: Any) -> Tensor:
        """The gradients were computed by ``training_step``; run the precision plugin's and
        the module's backward hooks around putting them in place."""
        module = self.lightning_module
        closure_loss = self.precision_plugin.pre_backward(closure_loss, module)
        for p, grad in self._step_grads:
            p.grad = grad
        self._step_grads = []
        for opt in self.optimizers:  # ZeRO-1 under TP: the optimizer's local-shard gradients,
            pull = getattr(getattr(opt, "_optimizer", opt), "pull_grads", None)  # for clipping
            if pull is not None:  # by value (Lightning clips the optimizer's parameters)
                pull()
        return self.precision_plugin.post_backward(closure_loss, module)

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int, *args: Any) -> dict:
        return self._evaluate(batch, self.precision_plugin.val_step_context,
                              f"validation batch {batch_idx}")

    def test_step(self, batch: dict[str, Tensor], batch_idx: int, *args: Any) -> dict:
        return self._evaluate(batch, self.precision_plugin.test_step_context,
                              f"test batch {batch_idx}")

    def predict_step(self, batch: dict[str, Tensor], batch_idx: int, *args: Any) -> Tensor:
        """The head's output for this replica's batch, in batch order, on every stage."""
        result = self.engine.step(batch, StepMode.PREDICT,
                                  self.precision_plugin.predict_step_context,
                                  where=f"predict batch {batch_idx}")
        return result.outputs

    def _evaluate(self, batch: dict[str, Tensor], context, where: str) -> dict:
        return self._outputs(self.engine.step(batch, StepMode.EVAL, context, where=where))

    def _outputs(self, result: StepResult) -> dict[str, Tensor]:
        """What the module's ``*_batch_end`` hooks get: the global loss (as the plain run's
        ``training_step`` would return it) and the spec's metrics."""
        out = {"loss": result.loss.to(self.root_device)}
        out.update({k: v.to(self.root_device) for k, v in result.metrics.items()})
        return out

    # -- checkpoints: one shard per stage ---------------------------------------------------
    def lightning_module_state_dict(self) -> dict[str, Any]:
        module = self.lightning_module
        state = module.state_dict()
        if self.engine is None:
            return state
        hosted = self.engine.hosted_param_ids()
        params = dict(module.named_parameters())
        mine = {k: v for k, v in state.items() if k not in params or id(params[k]) in hosted}
        # tensor parallel: full tensors, gathered by every TP rank of the stage in one order,
        # so a checkpoint is the plain module's whatever the TP degree (consolidate, resume)
        with naming_lost_peers(f"rank {self.global_rank}: gathering the stage's tensors for a "
                               "checkpoint"):
            return full(mine)

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath, storage_options=None) -> None:
        if self.engine is None:
            use_atomic_checkpoint_io(self)  # a plain file: durable, with its digest
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        layout = self.engine.layout
        ckpt.save_sharded(filepath, checkpoint, layout.stage,
                          writes_shard=layout.replica == 0 and layout.tp_rank == 0,
                          rank_zero=self.is_global_zero, pp=layout.pp, vpp=layout.vpp,
                          barrier=self.barrier)

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict[str, Any]:
        if not ckpt.is_sharded(checkpoint_path):
            use_atomic_checkpoint_io(self)  # a plain file: its digest checked
            return super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        stages = ckpt.num_stages(checkpoint_path)
        if stages != self.pipeline_parallel:
            raise ValueError(f"checkpoint {checkpoint_path}: written with {stages} pipeline "
                             f"stages, expected pipeline_parallel={self.pipeline_parallel}; "
                             "consolidate it (lightning_omni.runtime.checkpoint.consolidate) to "
                             "change the layout")
        chunks = ckpt.num_chunks(checkpoint_path)
        if chunks != self.virtual_pipeline_parallel:
            raise ValueError(f"checkpoint {checkpoint_path}: written with {chunks} model chunks "
                             "per stage, expected virtual_pipeline_parallel="
                             f"{self.virtual_pipeline_parallel} (each stage's shard holds the "
                             "blocks of its own chunks); consolidate it "
                             "(lightning_omni.runtime.checkpoint.consolidate) to change the "
                             "layout")
        stage = self.global_rank // self.tensor_parallel % self.pipeline_parallel
        return ckpt.read_shard(checkpoint_path, stage, weights_only=weights_only)

    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        """The stage's tensors into the module (full tensors cut into this rank's shards)."""
        module = self.lightning_module
        state = module.state_dict()
        state.update({k: reshard(v, state[k]) if k in state else v
                      for k, v in checkpoint["state_dict"].items()})
        module.load_state_dict(state, strict=strict)

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        # full tensors cut into this rank's shards under TP (TP 1: as they are)
        checkpoint = {**checkpoint, "optimizer_states": [
            reshard_optimizer_state(state, getattr(opt, "_optimizer", opt))
            for state, opt in zip(checkpoint["optimizer_states"], self.optimizers,
                                  strict=False)]}
        super().load_optimizer_state_dict(checkpoint)

    def remove_checkpoint(self, filepath) -> None:
        if self.is_global_zero:
            ckpt.remove(filepath)

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(_registration.NAME, cls, description=_registration.DESCRIPTION)


def _from_pretrained_on_meta(err: BaseException) -> bool:
    """Whether ``err`` was raised inside ``transformers``' ``from_pretrained`` (which refuses a
    meta-device context): its traceback passes through that function in ``transformers``."""
    import traceback

    return any(frame.f_code.co_name == "from_pretrained"
               and f"{os.sep}transformers{os.sep}" in frame.f_code.co_filename
               for frame, _ in traceback.walk_tb(err.__traceback__))


def _as_list(values: tuple[int, ...] | None) -> list[int] | None:
    return None if values is None else list(values)


class _GlobalClipping:
    """Mixed into the precision plugin Lightning chose: clipping by norm uses the norm of the
    whole pipelined model (every parameter counted once), as ``clip_grad_norm_`` on the plain
    module would. Clipping by value is elementwise, so the plugin's own is already exact."""

    omni_strategy: OmniStrategy

    def clip_grad_by_norm(self, optimizer, clip_val: float) -> None:
        if self.omni_strategy.engine is None:
            return super().clip_grad_by_norm(optimizer, clip_val)
        self.omni_strategy.clip_grad_norm(clip_val)


def _with_global_clipping(plugin: Precision, strategy: OmniStrategy) -> Precision:
    """The same plugin object (its scaler, dtype and state kept), with ``_GlobalClipping``
    in front of its class: Lightning routes ``gradient_clip_val`` through the precision
    plugin, and picks the plugin's class itself from ``Trainer(precision=...)``."""
    if not isinstance(plugin, _GlobalClipping):
        cls = type(plugin)
        plugin.__class__ = type(f"Omni{cls.__name__}", (_GlobalClipping, cls), {})
    plugin.omni_strategy = strategy
    return plugin
