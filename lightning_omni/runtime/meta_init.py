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

Under tensor parallelism (``materialize(shards=...)``, ``tp_stage.shard_cuts``) each parameter
the plan shards is cut to this process's shard as soon as the replay no longer uses its whole
value, and every intermediate is freed after its last use: a rank holds its shards plus about
one whole parameter at a time.

A value the replay cannot reproduce (a tensor made outside the recording, a parameter only
ever allocated because its initializer skipped meta tensors unseen) raises ``MetaInitError``
naming it.

Pretrained weights: code that runs inside the recording may register a ``WeightSource``
(``active_recording().sources``), such as a checkpoint directory. The parameters it supplies
are then allocated without replaying their initialization (``materialize(filled=...)``), and
the source writes this rank's hosted ones straight from its files
(``lightning_omni.integrations.hf_pretrained``).
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

# calls that only read metadata or make views: nothing to replay (views are rebuilt with
# as_strided from the tensor they alias)
_NO_VALUES = {"dim", "size", "numel", "stride", "storage_offset", "is_contiguous", "__get__",
              "__set__", "_has_compatible_shallow_copy_type",
              "__len__", "element_size", "_set_grad_enabled", "__repr__", "__format__",
              "requires_grad_", "__setstate__", "is_floating_point", "is_complex",
              "untyped_storage", "data_ptr", "nbytes", "itemsize", "get_device"}


# calls that draw from the RNG: replayed even for a parameter hosted elsewhere
_RANDOM = {"uniform_", "normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
           "xavier_normal_", "trunc_normal_", "_no_grad_trunc_normal_", "orthogonal_", "sparse_",
           "random_",
           "bernoulli_", "exponential_", "geometric_", "log_normal_", "cauchy_", "randn",
           "rand", "randint", "randperm", "normal", "bernoulli", "multinomial", "rand_like",
           "randn_like", "randint_like", "dropout"}


class MetaInitError(RuntimeError):
    """The recorded initialization cannot be replayed exactly."""


def _key(t: Tensor) -> int:
    return t.untyped_storage()._cdata


@dataclass(frozen=True)
class _Ref:
    """A meta tensor as a call saw it (a later ``.data`` assignment rebinds the Python object
    to another storage, so nothing is read from the object afterwards)."""

    key: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype
    storage_numel: int

    def view_of(self, base: Tensor) -> Tensor:
        return base.as_strided(self.size, self.stride, self.offset)


def _ref(x: Any, alive: dict[int, Any]) -> Any:
    if isinstance(x, Tensor) and x.is_meta:
        storage = x.untyped_storage()
        alive.setdefault(storage._cdata, storage)  # no later tensor reuses its address
        return _Ref(_key(x), tuple(x.size()), tuple(x.stride()), x.storage_offset(), x.dtype,
                    x.untyped_storage().nbytes() // max(1, x.element_size()))
    return x


def _refs(tree: Any) -> list[_Ref]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, _Ref)]


@dataclass
class _Call:
    func: Any
    args: tuple
    kwargs: dict
    out: Any
    default_dtype: torch.dtype
    draws: bool = True  # False: on the meta device in the plain run too (``draws_on_meta``)

    @staticmethod
    def of(func: Any, args: tuple, kwargs: dict, out: Any, alive: dict[int, Any]) -> _Call:
        def ref(x: Any) -> Any:
            return _ref(x, alive)

        return _Call(func, tree_map(ref, args), tree_map(ref, kwargs), tree_map(ref, out),
                     torch.get_default_dtype())

    @property
    def name(self) -> str:
        return getattr(self.func, "__name__", str(self.func))

    def reads(self) -> list[_Ref]:
        return _refs((self.args, self.kwargs))

    def writes(self) -> set[int]:
        """Storages this call gives values to: its outputs, an in-place call's target."""
        keys = {r.key for r in _refs(self.out)}
        if self.name.endswith("_") or self.name == "__setitem__":
            target = self.args[0] if self.args else self.kwargs.get("tensor")
            if isinstance(target, _Ref):
                keys.add(target.key)
        return keys


class WeightSource(Protocol):
    """Values for some of a meta build's tensors, read after it is materialized (a pretrained
    checkpoint): ``tensors()`` the parameters and buffers it supplies (the module's own
    objects), ``load(skip, device)`` writes every one of them whose ``id`` is not in ``skip``
    (hosted on other ranks) and returns what it read (``bytes_read``)."""

    def tensors(self) -> list[Tensor]: ...

    def load(self, skip: set[int], device: torch.device) -> Any: ...


@dataclass
class InitRecording:
    """What ``configure_model`` did on the meta device, and the RNG state it started from."""

    calls: list[_Call] = field(default_factory=list)
    alive: dict[int, Any] = field(default_factory=dict)  # meta storages seen, by key
    cpu_rng: Tensor | None = None
    cuda_rng: Tensor | None = None
    sources: list[WeightSource] = field(default_factory=list)  # pretrained values, by tensors


@contextmanager
def draws_on_meta(recording: InitRecording) -> Iterator[None]:
    """Calls recorded inside ran on the meta device in the plain run as well (``transformers``
    builds ``from_pretrained``'s model there, then loads or initializes it): their random
    draws never advanced the plain run's generator, so they are replayed for values only, with
    the generator's state put back, and skipped where nothing kept depends on them."""
    start = len(recording.calls)
    try:
        yield
    finally:
        for call in recording.calls[start:]:
            call.draws = False


# the recordings being made (innermost last): where code running inside one registers sources
_ACTIVE: list[InitRecording] = []


def active_recording() -> InitRecording | None:
    """The recording of the meta build in progress, or None outside one."""
    return _ACTIVE[-1] if _ACTIVE else None


# torch.nn.init functions that return at once for a meta tensor (no torch call to see):
# wrapped while recording, replayed whole (a truncated normal draws until its samples fit).
# The truncated normal is caught in the private function every caller of ``trunc_normal_``
# reaches, however it was imported; the others where ``nn.init`` and ``transformers`` (which
# keeps its own references) look them up.
_SKIP_META = ("_no_grad_trunc_normal_", "orthogonal_", "sparse_", "dirac_")


def _init_tables() -> list[dict[str, Any]]:
    """The namespaces initializers are looked up in while a model is built."""
    import sys

    tables = [vars(nn.init)]
    hf = sys.modules.get("transformers.initialization")
    if hf is not None and isinstance(getattr(hf, "TORCH_INIT_FUNCTIONS", None), dict):
        tables.append(hf.TORCH_INIT_FUNCTIONS)
    return tables


class RecordInit(TorchFunctionMode):
    """Record every top-level torch call that reads or writes a meta tensor."""

    def __init__(self, recording: InitRecording) -> None:
        super().__init__()
        self.recording = recording
        self._originals: list[tuple[dict[str, Any], str, Any]] = []

    def __enter__(self):
        for table in _init_tables():
            for name in _SKIP_META:
                if name in table:
                    original = table[name]
                    self._originals.append((table, name, original))
                    table[name] = self._recorded(original)
        _ACTIVE.append(self.recording)
        return super().__enter__()

    def __exit__(self, *exc):
        for table, name, original in reversed(self._originals):
            table[name] = original
        self._originals.clear()
        if _ACTIVE and _ACTIVE[-1] is self.recording:
            _ACTIVE.pop()
        return super().__exit__(*exc)

    def _recorded(self, original):
        def init(tensor: Tensor, *args: Any, **kwargs: Any) -> Tensor:
            if isinstance(tensor, Tensor) and tensor.is_meta:
                self.recording.calls.append(
                    _Call.of(original, (tensor, *args), kwargs, None, self.recording.alive))
                return tensor
            return original(tensor, *args, **kwargs)
        init.__name__ = original.__name__
        return init

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if getattr(func, "__name__", "") not in _NO_VALUES and any(
                isinstance(t, Tensor) and t.is_meta
                for t in tree_flatten((args, kwargs, out))[0]):
            self.recording.calls.append(_Call.of(func, args, kwargs, out,
                                                 self.recording.alive))
        return out


def materialize(module: nn.Module, recording: InitRecording, elsewhere: Iterable[Tensor],
                device: torch.device, filled: Iterable[Tensor] = (),
                shards: Mapping[int, Callable[[Tensor], Tensor]] | None = None) -> None:
    """Replace ``module``'s meta parameters and buffers by real ones with the values the plain
    build gives, except the parameters in ``elsewhere`` (hosted on other ranks only), which
    become empty tensors (see the module doc), and the parameters in ``filled`` (a
    ``WeightSource`` writes them next), which are allocated, uninitialized, without replaying
    what made them. The RNG ends where the plain build leaves it.

    ``shards`` (by the parameter's ``id``): what this rank keeps of a whole parameter (its
    tensor-parallel shard, a DTensor). It is cut as soon as the recording no longer uses the
    whole value, and every intermediate is freed after its last use, so whole parameters are
    held about one at a time; the module then holds the shard (a new Parameter, in every
    place that held the old one)."""
    skipped = {_key(p) for p in elsewhere if p.is_meta}
    unset = {_key(p) for p in filled if p.is_meta} - skipped
    _check_written(module, recording, skipped | unset)
    kept = {_key(t) for t in (*module.parameters(), *module.buffers())
            if t.is_meta and _key(t) not in skipped | unset}
    cuts = _cuts(module, shards or {}, skipped)
    needed = _needed(recording, kept)
    if recording.cpu_rng is not None:
        torch.set_rng_state(recording.cpu_rng)
    if recording.cuda_rng is not None and device.type == "cuda":
        torch.cuda.set_rng_state(recording.cuda_rng, device)
    real: dict[int, Tensor] = {}  # meta storage -> real tensor over its whole storage
    cut: dict[int, Tensor] = {}  # meta storage -> what the module keeps of it (a shard)
    ends = _last_uses(recording)
    for i, call in enumerate(recording.calls):
        _replay(call, real, needed, device)
        for key in ends.get(i, ()):  # no later call reads these: shard or free them
            if key in cuts and key in real:
                p, to_shard = cuts[key]
                cut[key] = to_shard(real.pop(key).as_strided(p.size(), p.stride(),
                                                             p.storage_offset()))
            elif key not in kept:
                real.pop(key, None)
    recording.calls.clear()
    recording.alive.clear()
    gc.collect()
    params = dict(module.named_parameters())
    names = [n for n, t in (*params.items(), *module.named_buffers()) if t.is_meta]
    holders = _holders(module, {id(p) for p, _ in cuts.values()})
    for name in names:
        t = params.pop(name) if name in params else module.get_buffer(name)
        key = _key(t)
        if key in skipped:
            value = torch.empty(0, dtype=t.dtype, device=device)
        elif key in unset:  # written by its WeightSource
            numel = t.untyped_storage().nbytes() // max(1, t.element_size())
            value = torch.empty(numel, dtype=t.dtype, device=device).as_strided(
                t.size(), t.stride(), t.storage_offset())
            if key in cuts:
                value = cuts[key][1](value)
        elif key in cut:
            value = cut.pop(key)
        elif key in real:
            value = real[key].as_strided(t.size(), t.stride(), t.storage_offset())
        else:
            raise MetaInitError(f"{name}: its values were not made by torch calls inside "
                                "configure_model, so they cannot be rebuilt on this rank; "
                                "create it there (or in __init__ with meta_init=False)")
        if isinstance(t, nn.Parameter):
            value = nn.Parameter(value, requires_grad=t.requires_grad)
        if key in cuts:  # another tensor class: a new Parameter wherever the old one sat
            for mod, attr in holders[id(t)]:
                mod._parameters[attr] = value
        else:  # the same Python object (an optimizer, a tie, a hook keeps it), now real
            torch.utils.swap_tensors(t, value)
        del t, value


def _cuts(module: nn.Module, shards: Mapping[int, Callable[[Tensor], Tensor]],
          skipped: set[int]) -> dict[int, tuple[Tensor, Callable[[Tensor], Tensor]]]:
    """Meta storage -> (the parameter, its cut) for the hosted ``shards`` parameters that are
    the only module tensor over their whole storage (a view into a shared storage is
    materialized whole and left to the caller)."""
    owners: dict[int, set[int]] = {}
    for t in (*module.parameters(), *module.buffers()):
        if t.is_meta:
            owners.setdefault(_key(t), set()).add(id(t))
    out = {}
    for p in module.parameters():
        key = _key(p) if p.is_meta else None
        if id(p) in shards and key not in skipped and len(owners.get(key, ())) == 1 and \
                p.storage_offset() == 0 and \
                p.numel() * p.element_size() == p.untyped_storage().nbytes():
            out[key] = (p, shards[id(p)])
    return out


def _last_uses(recording: InitRecording) -> dict[int, list[int]]:
    """Call index -> the storages no later call reads or writes."""
    last: dict[int, int] = {}
    for i, call in enumerate(recording.calls):
        for key in {r.key for r in (*call.reads(), *_refs(call.out))}:
            last[key] = i
    ends: dict[int, list[int]] = {}
    for key, i in last.items():
        ends.setdefault(i, []).append(key)
    return ends


def _holders(module: nn.Module, ids: set[int]) -> dict[int, list[tuple[nn.Module, str]]]:
    """(module, attribute) of every place each parameter in ``ids`` is registered."""
    out: dict[int, list[tuple[nn.Module, str]]] = {}
    for mod in module.modules():
        for attr, p in mod._parameters.items():
            if p is not None and id(p) in ids:
                out.setdefault(id(p), []).append((mod, attr))
    return out


def _needed(recording: InitRecording, kept: set[int]) -> set[int]:
    """Storages whose values the kept tensors depend on (themselves included): backwards
    over the recording, a call that writes a needed storage needs all it reads."""
    needed = set(kept)
    for call in reversed(recording.calls):
        if call.writes() & needed:
            needed |= {r.key for r in call.reads()}
    return needed


def _check_written(module: nn.Module, recording: InitRecording, skipped: set[int]) -> None:
    """A parameter only ever allocated (``torch.empty``) was most likely initialized by a
    call the recording could not see (an initializer that returns at once for meta tensors,
    imported by direct reference): refuse rather than replay uninitialized memory."""
    writers: dict[int, set[str]] = {}
    for call in recording.calls:
        for key in call.writes():
            writers.setdefault(key, set()).add(call.name)
    for name, p in module.named_parameters():
        if p.is_meta and _key(p) not in skipped and \
                writers.get(_key(p), set()) <= {"empty", "empty_strided"}:
            raise MetaInitError(f"{name}: allocated on the meta device but never initialized "
                                "by a call OmniStrategy could record (an initializer that "
                                "skips meta tensors, such as a directly imported "
                                "torch.nn.init.orthogonal_?); call it as nn.init.<name> or "
                                "initialize the parameter with in-place tensor operations")


def _replay(call: _Call, real: dict[int, Tensor], needed: set[int], device: torch.device
            ) -> None:
    written = call.writes()
    if written and not written & needed:
        # nothing this rank keeps depends on it: only random draws are replayed, on scratch
        # tensors, so that the generator advances as in the plain build
        if call.name not in _RANDOM or not call.draws:
            return
        target = call.args[0] if call.args else call.kwargs.get("tensor")
        if call.name in _UNIFORM and device.type == "cpu" and isinstance(target, _Ref):
            _draw_uniform(math.prod(target.size), target.dtype)
            return
        scratch = {r.key: torch.empty(r.storage_numel, dtype=r.dtype, device=device)
                   for r in call.reads()}
        _run(call, lambda r: r.view_of(scratch[r.key]), real, device, record=False)
        return

    def view(r: _Ref) -> Tensor:
        if r.key not in real:
            raise MetaInitError(f"{call.name}: reads a tensor whose values this rank does "
                                "not have (one made outside configure_model)")
        return r.view_of(real[r.key])

    if call.name in _RANDOM and not call.draws:
        with _rng_kept(device):
            _run(call, view, real, device, record=True)
        return
    _run(call, view, real, device, record=True)


@contextmanager
def _rng_kept(device: torch.device) -> Iterator[None]:
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda, device)


def _run(call: _Call, view, real: dict[int, Tensor], device: torch.device,
         record: bool) -> None:
    def swap(x: Any) -> Any:
        if isinstance(x, _Ref):
            return view(x)
        if isinstance(x, torch.device) and x.type == "meta":
            return device
        return x

    fresh = [r for r in _refs(call.out) if r.key not in real]
    kwargs = tree_map(swap, call.kwargs)
    if fresh and not call.reads():  # a factory: on the real device, with the recorded dtype
        kwargs["device"] = device
        if call.name in _FACTORIES and "dtype" not in kwargs:
            kwargs["dtype"] = fresh[0].dtype
    previous = torch.get_default_dtype()
    torch.set_default_dtype(call.default_dtype)
    try:
        out = call.func(*tree_map(swap, call.args), **kwargs)
    finally:
        torch.set_default_dtype(previous)
    if not record:
        return
    for r, t in zip(tree_flatten(call.out)[0], tree_flatten(out)[0], strict=False):
        if isinstance(r, _Ref) and r.key not in real:
            if r.offset != 0 or t.numel() != r.storage_numel:
                raise MetaInitError(f"{call.name}: made a view into a new tensor; its "
                                    "storage cannot be rebuilt")
            real[r.key] = t


# CPU draws of these take one random number per element, serially, whatever the bounds
# and the tensor's size: their draws for a parameter hosted elsewhere are replayed in chunks,
# without allocating the parameter (a large output head, say)
_UNIFORM = {"uniform_", "kaiming_uniform_", "xavier_uniform_"}
_CHUNK = 1 << 20


def _draw_uniform(numel: int, dtype: torch.dtype) -> None:
    buffer = torch.empty(min(numel, _CHUNK), dtype=dtype)
    for start in range(0, numel, _CHUNK):
        buffer[:min(_CHUNK, numel - start)].uniform_()


_FACTORIES = {"empty", "zeros", "ones", "full", "randn", "rand", "randint", "arange",
              "linspace", "logspace", "eye", "empty_strided", "normal", "tensor"}


def capture_rng(recording: InitRecording, device: torch.device) -> None:
    """The RNG state ``configure_model`` starts from (replayed from there)."""
    recording.cpu_rng = torch.get_rng_state()
    if device.type == "cuda":
        recording.cuda_rng = torch.cuda.get_rng_state(device)
