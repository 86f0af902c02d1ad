"""Hugging Face pretrained weights in and out of OmniStrategy, per rank.

In: ``from_pretrained(cls, path)`` in a LightningModule's ``configure_model``. In a plain run
(no meta-device build) it *is* ``cls.from_pretrained(path)``. Under OmniStrategy's meta init it
builds the model on the meta device as ``transformers``' ``from_pretrained`` does (same dtype,
config, init context, tied weights, missing keys initialized by the model's own init) and
registers the directory with the meta build. At setup, once the layout says which parameters a
rank hosts, the rank allocates only those and reads exactly their tensors' bytes from the
safetensors files (one file at a time, straight into the parameters), converted to the
parameter's dtype.

Out: ``save_pretrained(trainer, directory)`` after (or during) a fit, on every rank: each
pipeline stage writes the safetensors shards of the tensors it hosts, under the names
``transformers``' ``save_pretrained`` writes (its own key mapping reversed, tied weights once),
and rank 0 writes ``config.json`` and ``model.safetensors.index.json``. The file plan (which
tensor in which shard) is computed by every rank from the shapes alone, so no tensor and no
map crosses ranks; no rank holds more than its stage. The shards and the index are written
through ``lightning_omnilab.durable`` (atomic, ``fsync``ed, each with its SHA-256 beside it:
``sha256sum -c *.sha256`` in the directory); reading them back does not check the digests (a
rank reads only its own tensors' bytes, not whole files).

Names: checkpoint keys are mapped to the model's parameter names by ``transformers``' own
conversion mapping (``get_model_conversion_mapping`` + ``rename_source_key``, what
``from_pretrained`` applies) and back by ``revert_weight_conversion`` (what ``save_pretrained``
applies), so legacy LLaVA layouts (``language_model.model.*``, ``vision_tower.vision_model.*``)
load and export as ``transformers`` does. Renamings only: a checkpoint key that needs one of
``transformers``' tensor conversions (fused or split weights) is refused by name.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lightning_omnilab import durable

from ..runtime.meta_init import active_recording, draws_on_meta

log = logging.getLogger(__name__)

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
DEFAULT_SHARD_BYTES = 5 * 1024**3

# loading options that choose devices, quantize, fetch or rewrite weights: they have no
# meaning (or another one) when each rank reads its own tensors from a local directory
_REFUSED = ("device_map", "max_memory", "quantization_config", "key_mapping", "tp_plan",
            "tp_size", "distributed_config", "device_mesh", "gguf_file", "state_dict",
            "variant", "subfolder", "use_safetensors", "offload_folder", "offload_buffers",
            "revision", "token", "cache_dir", "force_download", "proxies", "use_kernels",
            "kernel_config", "trust_remote_code", "torch_dtype", "output_loading_info",
            "ignore_mismatched_sizes", "weights_only", "adapter_kwargs", "adapter_name")

_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
              "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
              "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
              "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


class PretrainedError(RuntimeError):
    """A pretrained directory that cannot be loaded (or a model that cannot be exported)
    per rank."""


# -- in ----------------------------------------------------------------------------------------
def from_pretrained(cls: type, path: str | os.PathLike, *, dtype: Any = None,
                    strict: bool = False, **kwargs: Any) -> nn.Module:
    """``cls.from_pretrained(path, dtype=dtype, **kwargs)``, per rank under OmniStrategy.

    Call it in ``configure_model``. Without a meta-device build (a plain run, or
    ``OmniStrategy(meta_init=False)``) it calls ``transformers`` directly. Inside OmniStrategy's
    meta build it returns the model on the meta device, built as ``from_pretrained`` builds it,
    and OmniStrategy's setup fills each rank's hosted parameters from ``path``'s safetensors
    files (docs/omni/hf_llava.md).

    ``path``: a local directory written by ``save_pretrained`` (``config.json``, safetensors
    shards and their index, or one ``model.safetensors``). ``dtype``: as ``from_pretrained``'s
    (None: ``"auto"``, the config's dtype, else the checkpoint's). ``strict``: refuse missing or
    unexpected keys (by name) instead of warning; missing ones are otherwise initialized by the
    model's own init, as ``from_pretrained`` does. ``kwargs``: ``attn_implementation``,
    ``config`` and config overrides, as ``from_pretrained`` takes them."""
    if not (isinstance(cls, type) and hasattr(cls, "config_class")
            and hasattr(cls, "get_init_context")):
        raise PretrainedError(f"cls: expected a transformers PreTrainedModel class (such as "
                              f"LlavaForConditionalGeneration), got {cls!r}")
    recording = active_recording()
    if recording is None:
        if torch.get_default_device().type == "meta":
            raise PretrainedError(
                "from_pretrained: called on the meta device outside OmniStrategy's meta build "
                "(another strategy's empty init?); only OmniStrategy reads the weights per rank "
                "afterwards. Call it without a meta-device context, or under OmniStrategy")
        model, info = cls.from_pretrained(path, dtype=dtype, output_loading_info=True,
                                          **kwargs)
        if strict:
            _refuse_keys(path, sorted(info.get("missing_keys", ())),
                         sorted(info.get("unexpected_keys", ())))
        return model
    source = _meta_build(cls, Path(path), dtype, strict, kwargs, recording)
    recording.sources.append(source)
    return source.model


@dataclass(frozen=True)
class LoadReport:
    """What one rank read from a pretrained directory."""

    path: str
    tensors: int  # tensors written on this rank
    bytes_read: int  # their bytes as stored in the files
    files: int  # safetensors files opened
    checkpoint_bytes: int  # the checkpoint's safetensors files, headers included


@dataclass
class SafetensorsSource:
    """A ``WeightSource`` (``runtime.meta_init``): which checkpoint key fills which of
    ``model``'s tensors, read at setup for the tensors this rank hosts."""

    model: nn.Module
    path: Path
    files: dict[str, str]  # checkpoint key -> file name in path
    keys: dict[int, tuple[str, str]] = field(default_factory=dict)  # id(tensor) -> (name, key)
    targets: dict[int, Tensor] = field(default_factory=dict)  # id(tensor) -> tensor
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)

    def tensors(self) -> list[Tensor]:
        return [t for t in self.targets.values() if isinstance(t, nn.Parameter)]

    @torch.no_grad()
    def load(self, skip: set[int], device: torch.device, sharded: bool = False) -> LoadReport:
        """Write every supplied tensor not in ``skip``: reads only their byte ranges, file by
        file, straight into the parameter where it is a contiguous CPU tensor of the stored
        dtype (else through one temporary tensor, converted by ``copy_`` as
        ``load_state_dict`` converts).

        ``sharded``: the model has been sharded for tensor parallelism since the meta build
        (its tensors replaced by DTensors): look each tensor up by name and read only the
        bytes of this rank's shard into the shard."""
        by_file: dict[str, list[int]] = {}
        for tid in self.keys:
            if tid not in skip:
                by_file.setdefault(self.files[self.keys[tid][1]], []).append(tid)
        read = count = 0
        for name in sorted(by_file):
            file = self.path / name
            with open(file, "rb", buffering=0) as f:
                header, start = _header(f, file)
                for tid in by_file[name]:
                    param_name, key = self.keys[tid]
                    target = (_current(self.model, param_name) if sharded
                              else self.targets[tid])
                    info = header.get(key)
                    if not isinstance(info, dict):
                        raise PretrainedError(f"{file}: expected {key} (for {param_name}) in "
                                              "it, as the index says; it is not")
                    shape = tuple(info["shape"])
                    if shape != tuple(target.shape):
                        raise PretrainedError(
                            f"{file}: {key} (for {param_name}): expected shape "
                            f"{tuple(target.shape)} (the model's), got {shape}")
                    begin, end = info["data_offsets"]
                    read += _read_shard_into(f, file, key, start + begin, end - begin,
                                             info["dtype"], target)
                    count += 1
        return LoadReport(str(self.path), count, read, len(by_file), _checkpoint_bytes(self))


def _header(f: Any, file: Path) -> tuple[dict[str, Any], int]:
    """The safetensors header (an 8-byte little-endian length, then JSON) and where the data
    starts."""
    head = f.read(8)
    if len(head) != 8:
        raise PretrainedError(f"{file}: expected a safetensors file, got {len(head)} bytes")
    size = int.from_bytes(head, "little")
    header = json.loads(f.read(size))
    return header, 8 + size


def _read_into(f: Any, file: Path, key: str, offset: int, nbytes: int, stored: str,
               target: Tensor) -> None:
    """Bytes ``offset:offset + nbytes`` of ``f`` as ``target``'s values.

    Written here rather than with ``safetensors.safe_open``: ``get_tensor`` copies each tensor
    out of a memory map of the file, so while a file is open its touched pages and the copy
    are resident besides the parameter (measured: 0.15 GB over the parameters for a 0.73 GB
    stage, which cost the per-rank RSS target). Reading the byte range into the parameter's
    own storage holds nothing else; the format (header, offsets, little-endian data) is
    safetensors' documented layout."""
    dtype = _ST_DTYPES.get(stored)
    if dtype is None or sys.byteorder != "little":  # an exotic dtype: safetensors reads it
        from safetensors import safe_open

        with safe_open(str(file), framework="pt", device="cpu") as g:
            target.copy_(g.get_tensor(key))
        return
    direct = (target.device.type == "cpu" and target.dtype == dtype
              and target.is_contiguous())
    buffer = target if direct else torch.empty(target.shape, dtype=dtype)
    if buffer.numel() * buffer.element_size() != nbytes:
        raise PretrainedError(f"{file}: {key} holds {nbytes} bytes, expected "
                              f"{buffer.numel() * buffer.element_size()} for "
                              f"{tuple(target.shape)} {stored}")
    raw = memoryview(buffer.detach().reshape(-1).view(torch.uint8).numpy())
    f.seek(offset)
    done = 0
    while done < nbytes:
        n = f.readinto(raw[done:])
        if not n:
            raise PretrainedError(f"{file}: ended inside {key} ({done} of {nbytes} bytes)")
        done += n
    if not direct:
        target.copy_(buffer)  # the parameter's dtype and device, as load_state_dict does


def _current(model: nn.Module, name: str) -> Tensor:
    """``model``'s tensor ``name`` as it is now (a parameter, else a buffer)."""
    try:
        return model.get_parameter(name)
    except AttributeError:
        return model.get_buffer(name)


def _read_shard_into(f: Any, file: Path, key: str, offset: int, nbytes: int, stored: str,
                     target: Tensor) -> int:
    """Like ``_read_into``; a DTensor sharded on one dimension of a 1-D mesh gets only its
    shard's bytes (one contiguous run per index of the dimensions before the sharded one).
    Returns the bytes read."""
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(target, DTensor):
        _read_into(f, file, key, offset, nbytes, stored, target)
        return nbytes
    local = target.to_local()
    (placement,) = target.placements  # the runtime's TP meshes are 1-D
    if not isinstance(placement, Shard):  # replicated: the whole tensor on every rank
        _read_into(f, file, key, offset, nbytes, stored, local)
        return nbytes
    shape, dim = tuple(target.shape), placement.dim % target.dim()
    mesh = target.device_mesh
    sizes = [c.shape[dim] for c in torch.empty(shape, device="meta").chunk(mesh.size(), dim)]
    sizes += [0] * (mesh.size() - len(sizes))
    rank = mesh.get_local_rank()
    first, count = sum(sizes[:rank]), sizes[rank]
    if tuple(local.shape) != shape[:dim] + (count,) + shape[dim + 1:]:
        raise PretrainedError(f"{file}: {key}: this rank's shard has shape "
                              f"{tuple(local.shape)}, expected rows {first}:{first + count} "
                              f"of dimension {dim} of {shape}")
    item = nbytes // max(1, math.prod(shape))
    inner = math.prod(shape[dim + 1:])
    outer = math.prod(shape[:dim])
    run = count * inner * item  # bytes of one contiguous run
    rows = local.reshape(outer, count * inner) if local.is_contiguous() else None
    buffer = rows if rows is not None else torch.empty(outer, count * inner, dtype=local.dtype)
    for i in range(outer):
        at = offset + (i * shape[dim] + first) * inner * item
        _read_into(f, file, key, at, run, stored, buffer[i])
    if rows is None:
        local.copy_(buffer.reshape(local.shape))
    return outer * run


def _checkpoint_bytes(source: SafetensorsSource) -> int:
    total = 0
    for name in sorted(set(source.files.values())):
        total += (source.path / name).stat().st_size
    return total


def _meta_build(cls: type, path: Path, dtype: Any, strict: bool, kwargs: dict[str, Any],
                recording: Any) -> SafetensorsSource:
    """``from_pretrained``'s model on the meta device, its weights left to the source."""
    refused = sorted(set(kwargs) & set(_REFUSED))
    if refused:
        raise PretrainedError(f"from_pretrained: {refused} are not supported when OmniStrategy "
                              "loads per rank (a local directory, read as stored); pass them "
                              "only with OmniStrategy(meta_init=False)")
    files = checkpoint_files(path)
    config = kwargs.pop("config", None)
    attn = kwargs.pop("attn_implementation", None)
    if config is None:
        config, model_kwargs = cls.config_class.from_pretrained(path, return_unused_kwargs=True,
                                                                **kwargs)
    else:
        import copy

        config, model_kwargs = copy.deepcopy(config), kwargs
    if attn is not None:
        config._attn_implementation = attn
    main = _resolve_dtype(dtype, config, path, files)
    config.dtype = main
    for key in getattr(config, "sub_configs", {}):
        sub = getattr(config, key, None)
        if sub is not None:
            sub.dtype = main
    config.name_or_path = str(path)
    # transformers' own init context: the default dtype, no tying during __init__, its
    # patches, the meta device; what __init__ draws (torch's default inits) happens on the
    # meta device in from_pretrained too, so it must not advance the replayed generator
    from transformers.utils.generic import ContextManagers

    with draws_on_meta(recording), \
            ContextManagers(cls.get_init_context(main, False, False, False)):
        model = cls(config, **model_kwargs)
    model.tie_weights()
    source = SafetensorsSource(model, path, files)
    _map_keys(source)
    if strict:
        _refuse_keys(path, source.missing, source.unexpected)
    if source.missing:
        log.warning("from_pretrained %s: %d keys missing from the checkpoint, initialized by "
                    "the model's init: %s", path, len(source.missing), source.missing)
    if source.unexpected:
        log.warning("from_pretrained %s: %d checkpoint keys the model does not use: %s", path,
                    len(source.unexpected), source.unexpected)
    # as from_pretrained: what the checkpoint supplies is marked initialized, and the model's
    # init runs for the rest (missing keys, non-persistent buffers such as rotary tables),
    # recorded here and replayed per rank with the same draws in the same order
    for t in source.targets.values():
        t._is_hf_initialized = True
    model.initialize_weights()
    model.tie_weights()
    model.eval()
    return source


def _refuse_keys(path: Any, missing: list[str], unexpected: list[str]) -> None:
    if missing or unexpected:
        raise PretrainedError(f"from_pretrained {path} (strict=True): expected every key of the "
                              f"model and no other, got missing keys {missing} and unexpected "
                              f"keys {unexpected}")


def checkpoint_files(path: Path) -> dict[str, str]:
    """Checkpoint key -> safetensors file name, from the index (or the single file)."""
    if not path.is_dir():
        raise PretrainedError(f"path: expected a local directory written by save_pretrained, got "
                              f"{str(path)!r}")
    index = path / INDEX
    if index.exists():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise PretrainedError(f"{index}: expected a non-empty 'weight_map', got "
                                  f"{type(weight_map).__name__}")
        absent = sorted({f for f in weight_map.values() if not (path / f).exists()})
        if absent:
            raise PretrainedError(f"{index}: names files that are not in {path}: {absent}")
        return dict(weight_map)
    single = path / SINGLE
    if single.exists():
        from safetensors import safe_open

        with safe_open(str(single), framework="pt") as f:
            return dict.fromkeys(f.keys(), SINGLE)
    raise PretrainedError(f"path: expected {INDEX} or {SINGLE} in {path} (safetensors; a "
                          f"pytorch_model.bin checkpoint is not read per rank), got "
                          f"{sorted(p.name for p in path.iterdir())}")


def _resolve_dtype(dtype: Any, config: Any, path: Path, files: dict[str, str]) -> torch.dtype:
    """``from_pretrained``'s dtype rule: None is "auto": the config's dtype, else the first
    floating tensor's in the checkpoint; a string names a torch dtype."""
    if dtype is None or dtype == "auto":
        dtype = getattr(config, "dtype", None)
        if dtype is None:
            from safetensors import safe_open

            first = sorted(set(files.values()))[0]
            with safe_open(str(path / first), framework="pt") as f:
                stored = [_ST_DTYPES.get(f.get_slice(k).get_dtype()) for k in f.keys()]
            dtype = next((d for d in stored if d is not None and d.is_floating_point),
                         torch.get_default_dtype())
    if isinstance(dtype, str):
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise PretrainedError(f"dtype: expected 'auto', a torch.dtype or its name, got "
                                  f"{dtype!r}")
        dtype = getattr(torch, dtype)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise PretrainedError(f"dtype: expected a floating torch.dtype, got {dtype!r}")
    return dtype


def _conversions(model: nn.Module) -> tuple[list, list]:
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming

    mapping = get_model_conversion_mapping(model)
    return ([m for m in mapping if isinstance(m, WeightRenaming)],
            [m for m in mapping if isinstance(m, WeightConverter)])


def _map_keys(source: SafetensorsSource) -> None:
    """Checkpoint keys to the model's tensors, as ``from_pretrained`` renames them."""
    from transformers.core_model_loading import rename_source_key

    model = source.model
    state = model.state_dict(keep_vars=True)
    renamings, converters = _conversions(model)
    prefix = model.base_model_prefix
    found: dict[str, str] = {}  # model name -> checkpoint key
    for key in sorted(source.files):
        name, pattern = rename_source_key(key, renamings, converters, prefix, state)
        if name not in state and key in state:
            name, pattern = rename_source_key(key, [], [], prefix, state)
        if name not in state:
            source.unexpected.append(key)
            continue
        if pattern is not None:
            raise PretrainedError(
                f"{source.path}: {key} needs transformers' weight conversion {pattern!r} "
                f"(tensors fused or split on load), which per-rank loading does not do; use "
                "OmniStrategy(meta_init=False), or convert the checkpoint once with "
                "from_pretrained + save_pretrained")
        found.setdefault(name, key)
    for name, t in state.items():  # tied names share one tensor: its first supplied name
        if name in found and id(t) not in source.keys:
            source.keys[id(t)] = (name, found[name])
            source.targets[id(t)] = t
    source.missing = [n for n, t in state.items() if id(t) not in source.keys]
    source.missing = _ignored(source.missing, getattr(model, "_keys_to_ignore_on_load_missing",
                                                      None))
    source.unexpected = _ignored(source.unexpected,
                                 getattr(model, "_keys_to_ignore_on_load_unexpected", None))


def _ignored(keys: list[str], patterns: Iterable[str] | None) -> list[str]:
    pats = [re.compile(p) for p in (patterns or ())]
    return [k for k in keys if not any(p.search(k) for p in pats)]


# -- out ---------------------------------------------------------------------------------------
def hf_names(model: nn.Module, names: Iterable[str]) -> dict[str, str]:
    """The model's tensor names -> the names ``save_pretrained`` writes (``transformers``'
    loading renames reversed). Renamings only: a reverse conversion is refused by name."""
    from transformers.core_model_loading import revert_weight_conversion

    names = list(names)
    dummies = {n: torch.empty(0) for n in names}  # distinct objects, to follow each name
    out = revert_weight_conversion(model, dict(dummies))
    back = {id(t): n for n, t in dummies.items()}
    mapped = {back[id(t)]: new for new, t in out.items() if id(t) in back}
    if len(mapped) != len(names):
        odd = sorted(set(names) - set(mapped))
        raise PretrainedError(f"{type(model).__name__}: {odd} are saved through transformers' "
                              "weight conversions (fused or split tensors), which the per-stage "
                              "export does not do")
    return mapped


def parse_size(size: int | str) -> int:
    """Bytes of ``5GB``, ``500MB``, ``100KB`` (powers of 1000 as ``transformers``) or an int."""
    if isinstance(size, int):
        if size <= 0:
            raise ValueError(f"max_shard_size: expected a positive size, got {size}")
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B)\s*", str(size), re.IGNORECASE)
    if not m:
        raise ValueError(f"max_shard_size: expected bytes or a size like '5GB', got {size!r}")
    unit = m.group(2).upper()
    base = 1024 if "I" in unit else 1000
    return int(float(m.group(1)) * base ** "KMG".index(unit[0]) * base)


@dataclass(frozen=True)
class Entry:
    """One tensor of the export: its saved name, the plan rank that writes it, its bytes."""

    name: str
    writer: int
    nbytes: int


def plan_files(entries: list[Entry], max_shard_bytes: int) -> dict[str, str]:
    """Saved name -> shard file, pure: writers in ascending order, each one's tensors in the
    given order cut into files of at most ``max_shard_bytes`` (a bigger tensor alone), named
    ``model-0000i-of-0000n.safetensors`` as ``save_pretrained`` names them."""
    groups: list[list[str]] = []
    for writer in sorted({e.writer for e in entries}):
        size = None
        for e in (e for e in entries if e.writer == writer):
            if size is None or size + e.nbytes > max_shard_bytes:
                groups.append([])
                size = 0
            groups[-1].append(e.name)
            size += e.nbytes
    n = len(groups)
    return {name: f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            for i, group in enumerate(groups) for name in group}


def hf_model_of(module: nn.Module) -> nn.Module:
    """The one top-level ``transformers`` ``PreTrainedModel`` inside ``module``."""
    from transformers import PreTrainedModel

    found: list[nn.Module] = []
    for m in module.modules():
        if isinstance(m, PreTrainedModel) and not any(m in set(f.modules()) for f in found):
            found.append(m)
    if len(found) != 1:
        raise PretrainedError(f"{type(module).__name__}: expected one transformers "
                              f"PreTrainedModel inside it (else pass model=), got {len(found)}")
    return found[0]


def _one_name_each(hf: nn.Module) -> tuple[dict[int, str], dict[int, Tensor], dict[str, str]]:
    """Each tensor of ``hf``'s state once (tied ones under the tie's source name, as
    ``save_pretrained`` keeps them): id -> model name, id -> tensor, model name -> saved name."""
    state = hf.state_dict(keep_vars=True)
    tied = set(getattr(hf, "all_tied_weights_keys", None) or {})
    names: dict[int, str] = {}
    for name, t in state.items():
        if id(t) not in names or names[id(t)] in tied:
            names[id(t)] = name
    tensors = {id(t): t for t in state.values()}
    return names, tensors, hf_names(hf, names.values())


def save_pretrained(trainer: Any, directory: str | os.PathLike, model: nn.Module | None = None,
                    max_shard_size: int | str = DEFAULT_SHARD_BYTES) -> dict[str, str]:
    """Write ``model`` (default: the LightningModule's one ``PreTrainedModel``) as a
    ``save_pretrained`` directory, on every rank of an OmniStrategy run (a collective): each
    tensor is written by the lowest rank hosting it (replica 0 of its stage, TP rank 0, the
    stage's TP group gathering it), rank 0 writes ``config.json`` and the index last. Returns
    the index's ``weight_map``."""
    from ..runtime.tp_stage import full

    strategy = trainer.strategy
    engine = getattr(strategy, "engine", None)
    if engine is None:
        raise PretrainedError("save_pretrained: expected an OmniStrategy after setup (during or "
                              f"after fit), got {type(strategy).__name__} without its engine")
    hf = model if model is not None else hf_model_of(trainer.lightning_module)
    layout, hosting = engine.layout, engine.hosting
    holders = {id(p): h for p, h in zip(hosting.params, hosting.holders, strict=True)}
    shapes = getattr(strategy, "_elsewhere", {})  # what a meta build never allocated here
    names, tensors, saved = _one_name_each(hf)
    # every rank plans every file from the shapes alone: the same plan, no message
    entries = [Entry(saved[name], holders.get(tid, (0,))[0],
                     math.prod(shapes.get(tid, tuple(tensors[tid].shape)))
                     * tensors[tid].element_size()) for tid, name in names.items()]
    files = plan_files(entries, parse_size(max_shard_size))
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    by_file: dict[str, list[int]] = {}
    for tid, name in names.items():
        by_file.setdefault(files[saved[name]], []).append(tid)
    writer = {e.name: e.writer for e in entries}
    for file in sorted(by_file):
        tids = by_file[file]
        if writer[saved[names[tids[0]]]] != layout.rank:
            continue
        # every TP rank of the writer gathers its DTensors (in one order); TP rank 0 writes
        shard = {saved[names[tid]]: full(tensors[tid].detach()) for tid in tids}
        if layout.tp_rank == 0:
            _write_shard(path / file, shard)
        del shard
    strategy.barrier("omni_hf_shards")
    if strategy.global_rank == 0:
        params = {id(p) for p in hf.parameters()}
        count = sum(math.prod(shapes.get(tid, tuple(tensors[tid].shape)))
                    for tid in names if tid in params)
        dtype = next((t.dtype for t in hf.parameters() if t.dtype.is_floating_point), None)
        _finish(hf, path, files, sum(e.nbytes for e in entries), count, dtype)
    strategy.barrier("omni_hf_index")
    return files


def export_checkpoint(checkpoint: str | os.PathLike, directory: str | os.PathLike,
                      model: nn.Module, prefix: str = "model.",
                      max_shard_size: int | str = DEFAULT_SHARD_BYTES,
                      weights_only: bool = True) -> dict[str, str]:
    """A sharded OmniStrategy checkpoint (a directory of ``stage{s}.pt``) as a
    ``save_pretrained`` directory, in one process holding one stage's shard at a time: each
    stage's tensors go to its own safetensors files (a tensor held by several stages, such as
    the encoders or a tied embedding, from the first). ``model``: the ``PreTrainedModel``
    (built on the meta device is enough: names, ties and config come from it); ``prefix``:
    its attribute path in the LightningModule (``"model."`` for ``self.model``).
    ``weights_only=False`` reads shards that hold other objects (a module's hyperparameters),
    for a checkpoint you trust (``runtime.checkpoint.read_shard``). Returns the index's
    ``weight_map``."""
    from ..runtime.checkpoint import num_stages, read_shard

    names, tensors, saved = _one_name_each(model)
    want = {prefix + name: tid for tid, name in names.items()}
    limit = parse_size(max_shard_size)
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    written: dict[str, str] = {}  # saved name -> temporary file name
    temps: list[str] = []
    total = count = 0
    dtype = None
    params = {id(p) for p in model.parameters()}
    for stage in range(num_stages(checkpoint)):
        state = read_shard(checkpoint, stage, weights_only=weights_only)["state_dict"]
        mine = [(key, tid) for key, tid in want.items() if key in state
                and saved[names[tid]] not in written
                and state[key].numel() == tensors[tid].numel()]
        entries = [Entry(saved[names[tid]], stage, state[key].numel()
                         * state[key].element_size()) for key, tid in mine]
        plan = plan_files(entries, limit)
        for file in sorted(set(plan.values())):
            temp = f".stage{stage}-{file}"
            shard = {saved[names[tid]]: state[key] for key, tid in mine
                     if plan[saved[names[tid]]] == file}
            _write_shard(path / temp, shard)
            temps.append(temp)
            written.update(dict.fromkeys(shard, temp))
        for key, tid in mine:
            t = state[key]
            total += t.numel() * t.element_size()
            count += t.numel() if tid in params else 0
            if dtype is None and tid in params and t.dtype.is_floating_point:
                dtype = t.dtype
        del state
    absent = sorted(saved[names[tid]] for tid in names if saved[names[tid]] not in written)
    if absent:
        raise PretrainedError(f"checkpoint {checkpoint}: expected every tensor of "
                              f"{type(model).__name__} under the prefix {prefix!r}, got none "
                              f"for {absent}")
    final = {temp: f"model-{i + 1:05d}-of-{len(temps):05d}.safetensors"
             for i, temp in enumerate(temps)}
    for temp, name in final.items():
        durable.rename(path / temp, path / name)  # with its digest
    files = {name: final[temp] for name, temp in written.items()}
    _finish(model, path, files, total, count, dtype)
    return files


def _write_shard(target: Path, shard: dict[str, Tensor]) -> None:
    from safetensors.torch import save_file

    cpu = {k: v.detach().to("cpu").contiguous() for k, v in shard.items()}
    with durable.staged(target, what="weights file") as temp:
        save_file(cpu, temp, metadata={"format": "pt"})


def _finish(hf: nn.Module, path: Path, files: dict[str, str], total: int, count: int,
            dtype: torch.dtype | None) -> None:
    """The config, stale shards removed, and the index last (a directory with an index is
    complete)."""
    _write_config(hf, path, dtype)
    keep = set(files.values())
    for p in path.glob("model*.safetensors"):
        if p.name not in keep:
            durable.remove(p)  # and its digest
    index = {"metadata": {"total_parameters": count, "total_size": total},
             "weight_map": dict(sorted(files.items()))}
    durable.write_bytes(path / INDEX, json.dumps(index, indent=2) + "\n")


def _write_config(hf: nn.Module, path: Path, dtype: torch.dtype | None) -> None:
    """``config.json`` (and the generation config) as ``save_pretrained`` writes them: the
    weights' dtype and the model's class recorded."""
    import copy

    config = copy.deepcopy(hf.config)
    if dtype is not None:
        config.dtype = str(dtype).split(".")[1]
    config.architectures = [type(hf).__name__]
    config.save_pretrained(path)
    generation = getattr(hf, "generation_config", None)
    if generation is not None and hf.can_generate():
        generation.save_pretrained(path)
