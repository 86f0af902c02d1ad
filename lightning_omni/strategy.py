"""OmniStrategy: Lightning glue around ``lightning_omni.runtime``.

It reuses DDPStrategy's process launch and process-group setup (gloo on CPU, NCCL on GPU),
leaves the module unwrapped, and replaces the epoch loop's automatic optimization with one
that runs a pipelined step (``OmniEngine``) inside the optimizer's closure, so Lightning's
optimizer, LR scheduler, checkpoint and logging machinery stay as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.loops.optimization.automatic import ClosureResult, _AutomaticOptimization
from lightning.pytorch.strategies import DDPStrategy

from .plan.lssp_schedule import GroupOptions
from .runtime import checkpoint as ckpt
from .runtime.engine import SCHEDULES, OmniEngine, StepResult
from .runtime.layout import make_layout
from .runtime.metrics import step_metrics
from .runtime.ulysses import BACKENDS
from .spec import OmniSpec, get_spec


class OmniStrategy(DDPStrategy):
    """Pipeline x data parallel training of an ``OmniSpec`` module with encoder multiplexing.

    Args:
        pipeline_parallel: LLM pipeline stages per replica.
        data_parallel: replicas (default: world size / pipeline_parallel).
        schedule: ``"uniform_insertion"`` (encoder work spread over every rank of the pipeline)
            or ``"encoder_first_stage"`` (stage 0 runs all encoder work, Megatron-like).
        num_microbatches: microbatches per replica and step (default: 2 * pipeline_parallel).
        stage_blocks: LLM blocks per stage (default: balanced by ``OmniSpec.block_costs``).
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
    """

    strategy_name = "omni"

    def __init__(self, pipeline_parallel: int = 1, data_parallel: int | None = None,
                 schedule: str = "uniform_insertion", num_microbatches: int | None = None,
                 stage_blocks: list[int] | None = None,
                 timeout: timedelta = timedelta(minutes=10), lssp: bool = False,
                 reorder: bool = False, locality_groups: list[int] | None = None,
                 lssp_max_rows: float | None = None,
                 encoder_cost: tuple[float, float] = (1.0, 0.0),
                 ulysses_backend: str = "auto", **kwargs: Any) -> None:
        if not isinstance(pipeline_parallel, int) or pipeline_parallel < 1:
            raise ValueError(f"pipeline_parallel: expected an int >= 1, got {pipeline_parallel!r}")
        if data_parallel is not None and (not isinstance(data_parallel, int) or data_parallel < 1):
            raise ValueError(f"data_parallel: expected an int >= 1, got {data_parallel!r}")
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule: expected one of {SCHEDULES}, got {schedule!r}")
        if num_microbatches is not None and (not isinstance(num_microbatches, int)
                                             or num_microbatches < 1):
            raise ValueError(f"num_microbatches: expected an int >= 1, got {num_microbatches!r}")
        if lssp_max_rows is not None and not lssp_max_rows > 0:
            raise ValueError(f"lssp_max_rows: expected a number > 0 or None, got "
                             f"{lssp_max_rows!r}")
        if len(encoder_cost) != 2 or any(c < 0 for c in encoder_cost) or sum(encoder_cost) <= 0:
            raise ValueError(f"encoder_cost: expected (a, b) >= 0, not both 0, got "
                             f"{encoder_cost!r}")
        if ulysses_backend not in BACKENDS:
            raise ValueError(f"ulysses_backend: expected one of {BACKENDS}, got "
                             f"{ulysses_backend!r}")
        super().__init__(timeout=timeout, **kwargs)
        self.lssp, self.reorder = bool(lssp), bool(reorder)
        self.locality_groups = None if locality_groups is None else list(locality_groups)
        self.lssp_max_rows = lssp_max_rows
        self.encoder_cost = (float(encoder_cost[0]), float(encoder_cost[1]))
        self.ulysses_backend = ulysses_backend
        self.pipeline_parallel = pipeline_parallel
        self.data_parallel = data_parallel
        self.schedule = schedule
        self.num_microbatches = num_microbatches or 2 * pipeline_parallel
        self.stage_blocks = stage_blocks
        self.omni_timeout = timeout
        self.engine: OmniEngine | None = None
        self.spec: OmniSpec | None = None
        self.last_step: StepResult | None = None

    # -- checks before processes and process groups exist --------------------------------
    def connect(self, model) -> None:
        get_spec(model).validate(self.pipeline_parallel)
        super().connect(model)

    def _world(self) -> int:
        return self.num_nodes * self.num_processes

    def setup_environment(self) -> None:
        world = self._world()
        dp = self.data_parallel or max(1, world // self.pipeline_parallel)
        if self.pipeline_parallel * dp != world:
            raise ValueError(f"pipeline_parallel * data_parallel: expected the world size {world} "
                             f"(devices * num_nodes), got {self.pipeline_parallel} * {dp} = "
                             f"{self.pipeline_parallel * dp}")
        self.data_parallel = dp
        super().setup_environment()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        # every rank of a pipeline replica reads the same samples
        return {"num_replicas": self.data_parallel or 1,
                "rank": self.global_rank // self.pipeline_parallel}

    # -- model: no wrapper; build the runtime and install the pipelined loop --------------
    def configure_ddp(self) -> None:
        trainer = self.lightning_module.trainer
        module = self.lightning_module
        if not module.automatic_optimization:
            raise ValueError("OmniStrategy: expected automatic_optimization=True (the pipelined "
                             "step computes gradients itself), got manual optimization")
        if trainer.accumulate_grad_batches != 1:
            raise ValueError("accumulate_grad_batches: expected 1 with OmniStrategy (use "
                             f"num_microbatches), got {trainer.accumulate_grad_batches}")
        self.spec = get_spec(module)
        self.spec.validate(self.pipeline_parallel)
        layout = make_layout(self._world(), self.global_rank, self.pipeline_parallel,
                             self.data_parallel, self.spec.costs_of_blocks(), self.stage_blocks)
        self.engine = OmniEngine(self.spec, layout, self.schedule, self.num_microbatches,
                                 self.omni_timeout, self.root_device, self._group_options(),
                                 self.ulysses_backend)
        epoch_loop = trainer.fit_loop.epoch_loop
        old = epoch_loop.automatic_optimization
        loop = _OmniOptimization(trainer, self)
        loop.optim_progress = old.optim_progress  # keep counters (checkpoint/resume)
        epoch_loop.automatic_optimization = loop

    def _group_options(self) -> GroupOptions | None:
        """Encoder group actions (LSSP / grouped reordering), or None: per-replica plans."""
        if not (self.lssp or self.reorder):
            return None
        world = self._world()
        if self.locality_groups is None:
            locality = tuple(r // self.num_processes for r in range(world))  # one per node
        else:
            locality = tuple(int(g) for g in self.locality_groups)
            if len(locality) != world:
                raise ValueError(f"locality_groups: expected one group id per rank ({world}), "
                                 f"got {len(locality)}")
        heads = []
        for m in self.spec.modalities:
            h = getattr(m.encoder, "heads", None)
            if self.lssp and not (isinstance(h, int) and h >= 1):
                raise ValueError(f"modalities[{m.name}].encoder: lssp=True needs an encoder "
                                 "with an int `heads` attribute whose forward accepts "
                                 "`attention=` (e.g. lightning_omni.runtime.token_encoder."
                                 f"TokenEncoder), got {type(m.encoder).__name__}")
            heads.append(h if isinstance(h, int) and self.lssp else 0)
        cap = self.lssp_max_rows if self.lssp_max_rows is not None else float("inf")
        return GroupOptions(self.lssp, self.reorder, locality, tuple(heads),
                            self.encoder_cost[0], self.encoder_cost[1], float(cap))

    def on_train_start(self) -> None:
        """Refuse a loader whose batches cannot split into the microbatches, before step 1."""
        super().on_train_start()
        loader = self.lightning_module.trainer.train_dataloader
        size = getattr(loader, "batch_size", None)
        if isinstance(size, int) and size % self.num_microbatches != 0:
            raise ValueError(f"batch: {size} samples per data-parallel replica (the train "
                             "loader's batch_size) cannot be split into num_microbatches="
                             f"{self.num_microbatches} equal microbatches; use a batch size "
                             f"divisible by {self.num_microbatches}")
        if isinstance(size, int) and not getattr(loader, "drop_last", True):
            n = len(getattr(loader, "sampler", ()) or ())
            if n % size % self.num_microbatches != 0:
                raise ValueError(f"batch: the last batch of an epoch has {n % size} samples, "
                                 f"not divisible by num_microbatches={self.num_microbatches}; "
                                 "use drop_last=True or a matching dataset size")

    def pre_backward(self, closure_loss: torch.Tensor) -> None:
        pass

    def post_backward(self, closure_loss: torch.Tensor) -> None:
        pass

    # -- checkpoints: one shard per stage ---------------------------------------------------
    def lightning_module_state_dict(self) -> dict[str, Any]:
        module = self.lightning_module
        state = module.state_dict()
        if self.engine is None:
            return state
        hosted = self.engine.hosted_param_ids()
        params = dict(module.named_parameters())
        return {k: v for k, v in state.items() if k not in params or id(params[k]) in hosted}

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath, storage_options=None) -> None:
        if self.engine is None:
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        layout = self.engine.layout
        if layout.replica == 0:
            ckpt.write_shard(filepath, layout.stage, checkpoint)
        self.barrier("omni_save_shards")
        if self.is_global_zero:
            ckpt.write_marker(filepath, layout.pipeline)
        self.barrier("omni_save_marker")

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict[str, Any]:
        if not ckpt.is_sharded(checkpoint_path):
            return super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        stages = ckpt.num_stages(checkpoint_path)
        if stages != self.pipeline_parallel:
            raise ValueError(f"checkpoint {checkpoint_path}: written with {stages} pipeline "
                             f"stages, expected pipeline_parallel={self.pipeline_parallel}; "
                             "consolidate it (lightning_omni.runtime.checkpoint.consolidate) to "
                             "change the layout")
        return ckpt.read_shard(checkpoint_path, self.global_rank % self.pipeline_parallel)

    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        module = self.lightning_module
        state = module.state_dict()
        state.update(checkpoint["state_dict"])
        module.load_state_dict(state, strict=strict)

    def remove_checkpoint(self, filepath) -> None:
        if self.is_global_zero:
            ckpt.remove(filepath)

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register("omni", cls, description="MegaScale-Omni encoder-LLM "
                                   "multiplexing with a pipelined step")


class _OmniOptimization(_AutomaticOptimization):
    """Automatic optimization whose closure runs one pipelined step (zero grad included)."""

    def __init__(self, trainer, strategy: OmniStrategy) -> None:
        super().__init__(trainer)
        self._omni = strategy

    def _make_step_fn(self, kwargs):
        return partial(self._pipelined_step, kwargs)

    def _make_backward_fn(self, optimizer):
        return None

    def _make_zero_grad_fn(self, batch_idx, optimizer):
        return None

    def run(self, optimizer, batch_idx, kwargs):
        self._batch_idx, self._optimizer = batch_idx, optimizer
        return super().run(optimizer, batch_idx, kwargs)

    def _pipelined_step(self, kwargs) -> ClosureResult:
        strategy = self._omni
        self._on_before_zero_grad(self._optimizer)
        self._optimizer_zero_grad(self._batch_idx, self._optimizer)
        batch = kwargs["batch"]
        result = strategy.engine.step(batch)
        strategy.last_step = result
        trainer = self.trainer
        if trainer.logger is not None and trainer.global_step % trainer.log_every_n_steps == 0:
            metrics = step_metrics(result, strategy.engine.layout)
            if dist.get_rank() == 0:
                trainer.logger.log_metrics(metrics, step=trainer.global_step)
        return ClosureResult.from_training_step_output(result.loss.to(strategy.root_device))
