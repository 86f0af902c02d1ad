"""Build on the meta device, then materialize only what a rank hosts, with the plain values.

Under ``OmniStrategy``, Lightning's ``configure_model`` runs with every tensor created on the
meta device (no memory), while a ``TorchFunctionMode`` records each top-level torch call that
touches a meta tensor: factories (``torch.empty``, ``zeros``, ``randn``), initializers
(``nn.init.kaiming_uniform_``, ``normal_``, ``fill_`` through views such as an embedding's
padding row) and computations (a rotary table from ``arange``). Once the layout says which
parameters this rank hosts, the recording is replayed in order on the real device from the RNG
state ``configure_model`` started with: a hosted parameter, every buffer and every
intermediate get their real values; a parameter hosted elsewhere is never allocated, but the
random draws of its initializers still run on a scratch tensor of its shape (one at a time),
so every later draw lands where the plain run's did. The values are therefore exactly the plain
module's, with peak memory of the hosted part plus one scratch parameter.

A call the replay cannot reproduce (a hosted parameter computed from one hosted elsewhere, a
tensor whose values came from outside the recording) raises ``MetaInitError`` naming it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

# calls that only read metadata or make views: nothing to replay (views are rebuilt with
# as_strided from the tensor they alias)
_NO_VALUES = {"dim", "size", "numel", "stride", "storage_offset", "is_contiguous", "__get__",
              "__len__", "element_size", "_set_grad_enabled", "__repr__", "__format__",
              "requires_grad_", "__setstate__", "is_floating_point", "is_complex"}


# calls that draw from the RNG: replayed even for a parameter hosted elsewhere
_RANDOM = {"uniform_", "normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
           "xavier_normal_", "trunc_normal_", "orthogonal_", "sparse_", "random_",
           "bernoulli_", "exponential_", "geometric_", "log_normal_", "cauchy_", "randn",
           "rand", "randint", "randperm", "normal", "bernoulli", "multinomial", "rand_like",
           "randn_like", "randint_like", "dropout"}


class MetaInitError(RuntimeError):
    """The recorded initialization cannot be replayed exactly."""


def _key(t: Tensor) -> int:
    return t.untyped_storage()._cdata


@dataclass
class _Call:
    func: Any
    args: tuple
    kwargs: dict
    out: Any
    default_dtype: torch.dtype

    @property
    def name(self) -> str:
        return getattr(self.func, "__name__", str(self.func))


@dataclass
class InitRecording:
    """What ``configure_model`` did on the meta device, and the RNG state it started from."""

    calls: list[_Call] = field(default_factory=list)
    cpu_rng: Tensor | None = None
    cuda_rng: Tensor | None = None


# torch.nn.init functions that return at once for a meta tensor (no torch call to see):
# wrapped while recording, replayed whole (trunc_normal_ draws until its samples fit)
_SKIP_META = ("trunc_normal_", "orthogonal_", "sparse_", "dirac_")


class RecordInit(TorchFunctionMode):
    """Record every top-level torch call that reads or writes a meta tensor."""

    def __init__(self, recording: InitRecording) -> None:
        super().__init__()
        self.recording = recording
        self._originals: dict[str, Any] = {}

    def __enter__(self):
        for name in _SKIP_META:
            self._originals[name] = original = getattr(nn.init, name)
            setattr(nn.init, name, self._recorded(original))
        return super().__enter__()

    def __exit__(self, *exc):
        for name, original in self._originals.items():
            setattr(nn.init, name, original)
        return super().__exit__(*exc)

    def _recorded(self, original):
        def init(tensor: Tensor, *args: Any, **kwargs: Any) -> Tensor:
            if isinstance(tensor, Tensor) and tensor.is_meta:
                self.recording.calls.append(_Call(original, (tensor, *args), kwargs, tensor,
                                                  torch.get_default_dtype()))
                return tensor
            return original(tensor, *args, **kwargs)
        init.__name__ = original.__name__
        return init

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        tensors = [t for t in _tensors((args, kwargs, out)) if t.is_meta]
        if tensors and getattr(func, "__name__", "") not in _NO_VALUES:
            self.recording.calls.append(_Call(func, args, kwargs, out,
                                              torch.get_default_dtype()))
        return out


def _tensors(tree: Any) -> list[Tensor]:
    found: list[Tensor] = []
    tree_map(lambda x: found.append(x) if isinstance(x, Tensor) else None, tree)
    return found


def materialize(module: nn.Module, recording: InitRecording, elsewhere: Iterable[Tensor],
                device: torch.device) -> None:
    """Replace ``module``'s meta parameters and buffers by real ones with the values the plain
    build gives, except the parameters in ``elsewhere`` (hosted on other ranks only), which
    become empty tensors (see the module doc). The RNG ends where the plain build leaves it."""
    skipped = {_key(p) for p in elsewhere if p.is_meta}
    _check_written(module, recording, skipped)
    if recording.cpu_rng is not None:
        torch.set_rng_state(recording.cpu_rng)
    if recording.cuda_rng is not None and device.type == "cuda":
        torch.cuda.set_rng_state(recording.cuda_rng, device)
    real: dict[int, Tensor] = {}  # meta storage -> real tensor over its whole storage
    for call in recording.calls:
        _replay(call, real, skipped, device)
    recording.calls.clear()  # its references to the meta tensors would block the swap below
    gc.collect()
    names = [n for n, t in (*module.named_parameters(), *module.named_buffers()) if t.is_meta]
    for name in names:
        t = module.get_parameter(name) if name in dict(module.named_parameters()) \
            else module.get_buffer(name)
        if _key(t) in skipped:
            value = torch.empty(0, dtype=t.dtype, device=device)
        else:
            base = real.get(_key(t))
            if base is None:
                raise MetaInitError(f"{name}: its values were not made by torch calls inside "
                                    "configure_model, so they cannot be rebuilt on this rank; "
                                    "create it there (or in __init__ without OmniStrategy's "
                                    "configure_model)")
            value = base.as_strided(t.size(), t.stride(), t.storage_offset())
        if isinstance(t, nn.Parameter):
            value = nn.Parameter(value, requires_grad=t.requires_grad)
        # the same Python object (an optimizer, a tie, a hook keeps it), now real
        torch.utils.swap_tensors(t, value)


def _check_written(module: nn.Module, recording: InitRecording, skipped: set[int]) -> None:
    """A parameter only ever allocated (``torch.empty``) was most likely initialized by a
    call the recording could not see (an initializer that returns at once for meta tensors,
    imported by direct reference): refuse rather than replay uninitialized memory."""
    writers: dict[int, list[str]] = {}
    for call in recording.calls:
        ins = {_key(t) for t in _tensors((call.args, call.kwargs)) if t.is_meta}
        for t in _tensors(call.out):
            if t.is_meta and (call.name.endswith("_") or call.name == "__setitem__"
                              or _key(t) not in ins):
                writers.setdefault(_key(t), []).append(call.name)
    for name, p in module.named_parameters():
        if p.is_meta and _key(p) not in skipped and \
                set(writers.get(_key(p), [])) <= {"empty", "empty_strided"}:
            raise MetaInitError(f"{name}: allocated on the meta device but never initialized "
                                "by a call OmniStrategy could record (an initializer that "
                                "skips meta tensors, such as a directly imported "
                                "torch.nn.init.trunc_normal_?); call it as nn.init.<name> or "
                                "initialize the parameter with in-place tensor operations")


def _real_view(meta: Tensor, real: dict[int, Tensor], what: str) -> Tensor:
    base = real.get(_key(meta))
    if base is None:
        raise MetaInitError(f"{what}: reads a tensor whose values this rank does not have "
                            "(a parameter hosted on another stage, or one made outside "
                            "configure_model)")
    return base.as_strided(meta.size(), meta.stride(), meta.storage_offset())


def _replay(call: _Call, real: dict[int, Tensor], skipped: set[int], device: torch.device
            ) -> None:
    outs = [t for t in _tensors(call.out) if t.is_meta]
    ins = [t for t in _tensors((call.args, call.kwargs)) if t.is_meta]
    written = {_key(t) for t in outs}
    if written and written <= skipped:
        # only parameters hosted elsewhere change: replay the random draws on scratch
        # tensors (the generator must advance as in the plain build), nothing else
        if call.name not in _RANDOM:
            return
        scratch: dict[int, Tensor] = {}
        for t in ins:
            if _key(t) not in scratch:
                scratch[_key(t)] = torch.empty(t.untyped_storage().nbytes() // t.element_size(),
                                               dtype=t.dtype, device=device)
        _run(call, lambda t: scratch[_key(t)].as_strided(t.size(), t.stride(),
                                                         t.storage_offset()),
             real, device, record=False)
        return
    if any(_key(t) in skipped for t in ins if _key(t) not in written):
        raise MetaInitError(f"{call.name}: computes a tensor this rank needs from a parameter "
                            "hosted on another stage")
    _run(call, lambda t: _real_view(t, real, call.name), real, device, record=True)


def _run(call: _Call, view, real: dict[int, Tensor], device: torch.device,
         record: bool) -> None:
    def swap(x: Any) -> Any:
        if isinstance(x, Tensor) and x.is_meta:
            return view(x)
        if isinstance(x, torch.device) and x.type == "meta":
            return device
        return x

    fresh = [t for t in _tensors(call.out) if t.is_meta and _key(t) not in real]
    ins = {_key(t) for t in _tensors((call.args, call.kwargs)) if t.is_meta}
    kwargs = {k: swap(v) for k, v in call.kwargs.items()}
    if fresh and not ins:  # a factory: make it on the real device, with the recorded dtype
        kwargs["device"] = device
        if "dtype" in _factory_kwargs(call) and "dtype" not in kwargs:
            kwargs["dtype"] = fresh[0].dtype
    previous = torch.get_default_dtype()
    torch.set_default_dtype(call.default_dtype)
    try:
        out = call.func(*tree_map(swap, call.args), **kwargs)
    finally:
        torch.set_default_dtype(previous)
    if not record:
        return
    for meta_t, real_t in zip(_tensors(call.out), _tensors(out), strict=False):
        if isinstance(meta_t, Tensor) and meta_t.is_meta and _key(meta_t) not in real:
            if meta_t.storage_offset() != 0 or not meta_t.is_contiguous():
                raise MetaInitError(f"{call.name}: made a view of a new tensor; cannot "
                                    "rebuild its storage")
            real[_key(meta_t)] = real_t


def _factory_kwargs(call: _Call) -> set[str]:
    return {"dtype"} if call.name in {"empty", "zeros", "ones", "full", "randn", "rand",
                                      "randint", "arange", "linspace", "logspace", "eye",
                                      "empty_strided", "normal", "tensor"} else set()


def capture_rng(recording: InitRecording, device: torch.device) -> None:
    """The RNG state ``configure_model`` starts from (replayed from there)."""
    recording.cpu_rng = torch.get_rng_state()
    if device.type == "cuda":
        recording.cuda_rng = torch.cuda.get_rng_state(device)
