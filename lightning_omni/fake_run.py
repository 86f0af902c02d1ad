"""One rank of an Omni layout, set up and stepped on fake tensors: its memory and FLOPs.

As torchtitan's memory estimator: this process pretends to be rank ``rank`` of a layout's world
(``torch.distributed`` over the ``fake`` backend: every collective returns at once) and runs the
runtime's own path under ``FakeTensorMode`` (tensors with shapes, dtypes and strides but no
data): the user's module built, ``sync_parameters`` and ``parallelize`` (TP shards, process
groups, the engine), the module's optimizer (ZeRO-1 as OmniStrategy shards it), one training
step of ``OmniEngine`` and the optimizer's step. Nothing is allocated for weights, gradients,
optimizer state or activations, so a layout of any size runs on one CPU process.

An Omni step is planned from its batch (encoder lengths, sample placement), so unlike a plain
LLM step it reads the batch on the host. ``_BatchRunsReal`` keeps that exact: an op whose tensor
inputs are all real (the batch's token ids, lengths, masks, positions, and integer or boolean
tensors a factory makes) runs for real; any op touching a fake tensor (a weight, an activation)
runs fake, a boolean mask from the batch turned into the indices it selects (so an activation's
rows picked by the batch keep exact shapes). A host read of a fake value gives NaN (a
floating-point one: the loss, a norm; no shape depends on one, and the runtime's checks of
values pass on NaN), 1 (an integer) or True. An object collective (the step's metadata
all-gather) fills every rank's slot with this rank's object: every replica is measured on a
batch like this one.

What is counted for the rank: parameter, gradient and optimizer-state bytes it holds (local
shards under tensor parallelism), the peak of activation bytes saved for backward (the runtime's
``SavedTensorMeter``, as a real run reports it), the peak of all fake tensor bytes alive during
setup and the step (``torch.distributed._tools.mem_tracker.MemTracker``) and the step's
floating-point operations (``torch.utils.flop_counter.FlopCounterMode``, forward and backward).

FLOPs are the rank's own (``_RankFlops``): FlopCounterMode sees a DTensor op before DTensor
splits it into its local op, so it would count the global GEMM of a tensor-parallel layer, TP
times what the rank runs; here each DTensor op is let through uncounted and the local ops it
runs are counted. Attention on the CPU runs SDPA's CPU flash kernel, which FlopCounterMode has
no formula for: it gets torch's formula for the CUDA flash kernel (the forward's two GEMMs; the
backward's five, the scores recomputed), halved for a causal call as the kernel skips the masked
half. The first batch's one-sample shape check (``OmniSpec.check_shapes``, run once per engine,
not in later steps) is not counted.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode, _FlopCounterMode, flop_registry

from lightning_omnilab.validate import fail, require

from .runtime.executor import StepMode
from .runtime.hosting import param_hosting
from .runtime.parallel_dims import ParallelDims
from .runtime.parallelize import parallelize
from .runtime.zero import local_bytes, state_bytes
from .spec import get_spec

__all__ = ["RankMeasurement", "measure_rank"]


@dataclass(frozen=True)
class RankMeasurement:
    """What one rank holds and does in one training step (bytes; FLOPs of the step).

    ``role``: (stage, TP rank, replica) of the rank; ``activation_peak_bytes``: the peak of
    bytes saved for backward during the step; ``measured_peak_bytes``: the peak of all tensor
    bytes alive on the rank (weights, gradients, optimizer state, activations, buffers and
    temporaries) from the module's build to the end of the optimizer step."""

    rank: int
    world_size: int
    role: tuple[int, int, int]
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    activation_peak_bytes: int
    measured_peak_bytes: int
    flops: int


def measure_rank(model_factory: Callable[[], torch.nn.Module], dims: ParallelDims, rank: int,
                 batch: Mapping[str, Tensor], *, count_flops: bool = True,
                 timeout: timedelta = timedelta(minutes=10)) -> RankMeasurement:
    """Rank ``rank`` of ``dims`` (``dp`` set, e.g. by ``ParallelDims.for_world``) building
    ``model_factory()``'s module (an ``OmniSpec`` module whose ``configure_optimizers`` returns
    its optimizer) and training it one step on ``batch`` (this rank's replica's batch, real
    tensors), on fake tensors. Needs ``torch.distributed`` not yet initialized in this process
    (it initializes and destroys a fake process group of the layout's world size)."""
    if not isinstance(dims, ParallelDims):
        fail("dims", "a ParallelDims", type(dims).__name__)
    require(dims.dp is not None, "dims", "a layout with dp set (ParallelDims.for_world)",
            str(dims))
    world = dims.world_size
    require(isinstance(rank, int) and 0 <= rank < world, "rank",
            f"an int in [0, {world}) (the layout's world size)", rank)
    require(not dist.is_initialized(), "torch.distributed",
            "not initialized (measure_rank makes its own fake process group)", "initialized")
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    with torch.device("meta"):  # as OmniStrategy's meta build (configure_model)
        module = model_factory()
    spec = get_spec(module)
    spec.validate(dims.pp)
    layout = dims.layout(rank, spec.costs_of_blocks())
    hosting = param_hosting(spec, layout, dims.schedule)
    elsewhere = {id(p): tuple(p.shape) for p, h in zip(hosting.params, hosting.holders,
                                                        strict=True) if layout.rank not in h}
    del hosting  # as OmniStrategy's meta build: nothing holds the whole weights once TP
    # has sharded them (its list of parameters would keep every one alive through the step)
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        flops = _RankFlops()
        with ExitStack() as stack:
            fake = stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
            stack.enter_context(_object_collectives_echo())
            live = stack.enter_context(_BatchRunsReal(fake))
            _materialize_fake(module, elsewhere)
            engine = parallelize(spec, dims, layout, torch.device("cpu"), timeout, elsewhere)
            optimizer = _optimizer(module.configure_optimizers())
            if dims.zero_stage == 1:
                optimizer = _zero(optimizer, engine)
            with flops if count_flops else ExitStack(), flops.paused_in_shape_check():
                result = engine.step(dict(batch), StepMode.TRAIN)  # forward and backward
            owned = engine.executor.owned_params()
            grad_bytes = sum(local_bytes(p.grad) for p in owned if p.grad is not None)
            optimizer.step()
        return RankMeasurement(
            rank=rank, world_size=world, role=(layout.stage, layout.tp_rank, layout.replica),
            param_bytes=sum(local_bytes(p) for p in module.parameters()),
            grad_bytes=grad_bytes, optimizer_bytes=state_bytes(optimizer),
            activation_peak_bytes=result.record.peak_saved_bytes,
            measured_peak_bytes=live.peak, flops=int(flops.get_total_flops()))
    finally:
        dist.destroy_process_group()


def _materialize_fake(module: torch.nn.Module, elsewhere: Mapping[int, tuple[int, ...]]
                      ) -> None:
    """The meta build's parameters and buffers as fake tensors (under the fake mode), those
    hosted elsewhere empty, as ``runtime/meta_init.materialize`` leaves a rank's module. Each
    tensor keeps its Python object (``swap_tensors``: ties, the spec's references hold); a new
    ``nn.Parameter`` of a fake tensor could not be swapped in (it holds a weak reference)."""
    for t in {id(t): t for t in (*module.parameters(), *module.buffers())}.values():
        if not t.is_meta:
            continue
        shape = (0,) if id(t) in elsewhere else t.shape
        value = torch.empty(shape, dtype=t.dtype, device="cpu")
        value.requires_grad_(t.requires_grad)
        is_param = isinstance(t, torch.nn.Parameter)
        torch.utils.swap_tensors(t, value)
        if is_param:
            t._is_param = True  # still an nn.Parameter to the module (see Parameter.__new__)


def _optimizer(configured: Any) -> Optimizer:
    """The one optimizer of ``configure_optimizers``' forms Lightning accepts."""
    if isinstance(configured, Mapping):
        configured = configured.get("optimizer")
    if isinstance(configured, list | tuple) and len(configured) >= 1:
        configured = configured[0]
        if isinstance(configured, list | tuple) and configured:
            configured = configured[0]
    if not isinstance(configured, Optimizer):
        fail("configure_optimizers", "one torch.optim.Optimizer (or Lightning's forms holding "
             "one)", type(configured).__name__)
    return configured


def _zero(optimizer: Optimizer, engine) -> Optimizer:
    """ZeRO-1 as OmniStrategy applies it: sharded over the stage's data-parallel group."""
    lay = engine.layout
    group = engine.groups.get(lay.stage_group(lay.stage))
    if group is None:
        return optimizer
    from .runtime.zero import shard_optimizer

    return shard_optimizer(optimizer, engine.hosting.held(), group)


def _attention_flops(cuda_op: Any, tensors: int, causal_at: int) -> Callable[..., int]:
    """A FlopCounterMode formula for SDPA's CPU flash kernel: torch's formula for the CUDA
    kernel ``cuda_op`` on the first ``tensors`` arguments (the backward's: grad_out, q, k, v),
    halved when the causal flag (positional ``causal_at``) is set (see the module's
    docstring)."""
    formula = flop_registry[cuda_op]

    def flops(*args: Any, out_val: Any = None, **kwargs: Any) -> int:
        causal = kwargs.get("is_causal", args[causal_at] if len(args) > causal_at else False)
        full = formula(*args[:tensors], out_val=out_val)
        return full // 2 if causal else full

    flops._get_raw = True  # FlopCounterMode: called with the tensors, not their shapes
    return flops


class _LocalOps(_FlopCounterMode):
    """FlopCounterMode's dispatch mode, leaving each DTensor op to DTensor: its local ops come
    back here and are counted."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(isinstance(x, DTensor) for x in tree_flatten((args, kwargs))[0]):
            return NotImplemented
        return super().__torch_dispatch__(func, types, args, kwargs)


class _RankFlops(FlopCounterMode):
    """A FlopCounterMode counting what this rank runs (see the module's docstring)."""

    def __init__(self) -> None:
        aten = torch.ops.aten
        super().__init__(display=False, custom_mapping={
            aten._scaled_dot_product_flash_attention_for_cpu: _attention_flops(
                aten._scaled_dot_product_flash_attention, 3, 4),
            aten._scaled_dot_product_flash_attention_for_cpu_backward: _attention_flops(
                aten._scaled_dot_product_flash_attention_backward, 4, 7)})
        self.counting = True

    def __enter__(self) -> _RankFlops:  # FlopCounterMode's, with _LocalOps as its mode
        self.flop_counts.clear()
        self.mod_tracker.__enter__()
        self.mode = _LocalOps(self)
        self.mode.__enter__()
        return self

    def _count_flops(self, func_packet, out, args, kwargs):
        if not self.counting:
            return out
        return super()._count_flops(func_packet, out, args, kwargs)

    @contextmanager
    def paused_in_shape_check(self) -> Iterator[None]:
        """Inside: ``OmniSpec.check_shapes`` (the first batch's probe) is not counted."""
        from .spec import OmniSpec

        check = OmniSpec.check_shapes

        def uncounted(spec: OmniSpec, *args: Any, **kwargs: Any) -> Any:
            self.counting = False
            try:
                return check(spec, *args, **kwargs)
            finally:
                self.counting = True

        with mock.patch.object(OmniSpec, "check_shapes", uncounted):
            yield


@contextmanager
def _object_collectives_echo() -> Iterator[None]:
    """``all_gather_object`` over the fake backend (which moves no data): every slot gets this
    rank's object, as if every rank read a batch like this one."""
    def gather(out: list, obj: object, group: object = None) -> None:
        out[:] = [obj] * len(out)

    with mock.patch.object(dist, "all_gather_object", gather):
        yield


class _BatchRunsReal(TorchDispatchMode):
    """Ops on real tensors only (the batch and what is computed from it alone, integer and
    boolean factories) run for real; the rest on fake tensors (see the module's docstring).
    Counts the bytes of fake storages alive (``live``, ``peak``): each storage once, from the
    op that made it until it is freed. (``torch.distributed._tools.mem_tracker.MemTracker``
    counts the same but refuses a module called more than once per step, as a pipeline calls
    its encoders.)"""

    _MASKED = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default,
               torch.ops.aten.index_put_.default, torch.ops.aten._unsafe_index_put.default}

    def __init__(self, fake_mode: Any) -> None:
        super().__init__()
        self.fake_mode = fake_mode
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        kwargs = kwargs or {}
        flat = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, Tensor)]
        if not any(_is_fake(x) for x in flat) and (flat or not _makes_floats(func, kwargs)):
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        if func is torch.ops.aten._local_scalar_dense.default:
            return _placeholder(args[0].dtype)
        if func in self._MASKED:
            args = (args[0], _mask_indices(args[1]), *args[2:])
        elif func is torch.ops.aten.masked_select.default and not _is_fake(args[1]):
            x, mask = args
            shape = torch.broadcast_shapes(x.shape, mask.shape)
            with unset_fake_temporarily():
                rows = list(mask.expand(shape).nonzero().unbind(1))
            func, args, kwargs = torch.ops.aten.index.Tensor, (x.expand(shape), rows), {}
        out = func(*args, **kwargs)
        for t in tree_flatten(out)[0]:
            for inner in _plain(t):
                self._count(inner.untyped_storage())
        return out

    def _count(self, storage: torch.UntypedStorage) -> None:
        key, nbytes = storage._cdata, storage.nbytes()
        if key in self._seen or not nbytes:
            return
        self._seen.add(key)
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, key, nbytes)

    def _free(self, key: int, nbytes: int) -> None:
        self._seen.discard(key)
        self.live -= nbytes


def _plain(t: object) -> list[Tensor]:
    """The fake tensors holding ``t``'s memory (a DTensor's local shard, see ``_is_fake``)."""
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(t, FakeTensor):
        return [t]
    if isinstance(t, Tensor) and hasattr(t, "__tensor_flatten__"):
        return [x for n in t.__tensor_flatten__()[0] for x in _plain(getattr(t, n))]
    return []


def _is_fake(x: object) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(x, FakeTensor) or (isinstance(x, Tensor)
                                         and hasattr(x, "__tensor_flatten__")
                                         and any(_is_fake(getattr(x, n))
                                                 for n in x.__tensor_flatten__()[0]))


def _makes_floats(func, kwargs: dict) -> bool:
    """Whether a factory op (no tensor inputs) makes floating-point tensors (weights,
    activation buffers: fake) rather than integer or boolean ones (indices, masks: real)."""
    dtype = kwargs.get("dtype")
    if dtype is None:
        returns = func._schema.returns
        if not returns or "Tensor" not in str(returns[0].type):
            return False
        dtype = torch.get_default_dtype() if func.__name__.split(".")[0] != "arange" else None
        if dtype is None:
            return False
    return dtype.is_floating_point or dtype.is_complex


def _mask_indices(indices: list) -> list:
    """Advanced indices with each real boolean mask replaced by the positions it selects (what
    torch does inside ``index``), so the output's shape is known without the mask's values."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    out: list = []
    for idx in indices:
        if isinstance(idx, Tensor) and idx.dtype in (torch.bool, torch.uint8) \
                and not _is_fake(idx):
            with unset_fake_temporarily():
                out.extend(idx.nonzero().unbind(1))
        else:
            out.append(idx)
    return out


def _placeholder(dtype: torch.dtype) -> object:
    if dtype == torch.bool:
        return True
    return math.nan if dtype.is_floating_point else 1
