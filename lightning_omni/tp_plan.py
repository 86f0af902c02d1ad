"""``OmniSpec.tp_plan``: how a model says which of its modules tensor parallelism shards.

One plan per part, the way torchtitan and Hugging Face's ``base_model_tp_plan`` write them:
module path (relative to the part, ``"*"`` matching any one name, ``""`` the part itself) ->
``ParallelStyle``. Plan keys: ``"embedding"``, ``"blocks"`` (every block), ``"head"`` and each
modality's name (its encoder). This module holds what the spec itself needs, with no process
group: the plan's checks (``OmniSpec.validate``) and the loss context of a head whose logits the
plan shards on the vocabulary. Applying a plan is the runtime's
(``runtime/tensor_parallel.parallelize_parts``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from fnmatch import fnmatch
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from .spec import OmniSpecError
from .spec import _expect as _expect

if TYPE_CHECKING:
    from .spec import OmniSpec

LLM_PARTS = ("embedding", "blocks", "head")


# -- checks (OmniSpec.validate) -----------------------------------------------------------------
def plan_keys(spec: OmniSpec) -> tuple[str, ...]:
    return (*LLM_PARTS, *(m.name for m in spec.modalities))


def _part_modules(spec: OmniSpec, key: str) -> list[tuple[str, nn.Module]]:
    if key == "embedding":
        return [("embedding", spec.embedding)]
    if key == "head":
        return [("head", spec.head)]
    if key == "blocks":
        return [(f"blocks[{i}]", b) for i, b in enumerate(spec.blocks)]
    return [(f"modalities[{m.name}].encoder", m.encoder) for m in spec.modalities
            if m.name == key]


def resolve(module: nn.Module, path: str) -> list[tuple[str, nn.Module]]:
    """The submodules ``path`` names, as ``parallelize_module`` resolves it: dotted names,
    each matched with ``fnmatch`` (``"*"``), ``""`` the module itself."""
    found = [("", module)]
    for token in path.split(".") if path else []:
        found = [(f"{fqn}.{name}" if fqn else name, child) for fqn, mod in found
                 for name, child in mod.named_children() if fnmatch(name, token)]
    return found


def _unresolved(module: nn.Module, path: str) -> str:
    """Where ``path`` stops matching, and what is there instead."""
    tokens = path.split(".")
    for i in range(len(tokens)):
        at = ".".join(tokens[:i])
        here = resolve(module, at)
        if not resolve(module, ".".join(tokens[: i + 1])):
            names = sorted({n for _, m in here for n, _ in m.named_children()})
            return (f"but nothing matches {tokens[i]!r} under {at or 'the part'!r} "
                    f"(children there: {names})")
    return "but it names no module"


def check_tp_plan(spec: OmniSpec) -> None:
    """``OmniSpec.tp_plan``: known part names, ``ParallelStyle`` values, paths that name
    modules in every part they apply to, column/row styles on ``nn.Linear`` / ``nn.Embedding``
    only, each module under one style, tied parameters sharded alike."""
    from torch.distributed.tensor.parallel import ParallelStyle, SequenceParallel

    plan = spec.tp_plan
    if plan is None:
        return
    _expect(isinstance(plan, Mapping), "tp_plan", "a mapping part -> {module path: "
            "ParallelStyle} (or None)", type(plan).__name__)
    keys = plan_keys(spec)
    placements: dict[int, tuple[str, Any]] = {}
    for key, entries in plan.items():
        _expect(key in keys, "tp_plan", f"keys among {list(keys)} (parts and modality names)",
                key)
        _expect(isinstance(entries, Mapping), f"tp_plan[{key!r}]",
                "a mapping module path -> ParallelStyle", type(entries).__name__)
        for label, part in _part_modules(spec, key):
            claimed: dict[int, str] = {}
            for path, style in entries.items():
                where = f"tp_plan[{key!r}][{path!r}]"
                _expect(isinstance(path, str), f"tp_plan[{key!r}]", "module paths (str)", path)
                _expect(isinstance(style, ParallelStyle), where,
                        "a torch.distributed.tensor.parallel ParallelStyle",
                        type(style).__name__)
                _expect(not isinstance(style, SequenceParallel), where,
                        "a style whose module returns full tensors (SequenceParallel shards the "
                        "activations between parts, which the pipeline does not carry)",
                        "SequenceParallel")
                found = resolve(part, path)
                if not found:
                    raise OmniSpecError(f"{where}: expected a module path of {label} "
                                        f"({type(part).__name__}), {_unresolved(part, path)}")
                for fqn, mod in found:
                    _expect(id(mod) not in claimed, where, f"modules under one style only "
                            f"({label}.{fqn} is also under {claimed.get(id(mod))!r})", path)
                    claimed[id(mod)] = path
                    for name, param, placement in _style_placements(where, style, mod):
                        _check_tie(placements, param, f"{label}.{fqn}.{name}".replace("..", "."),
                                   placement)
    _check_unplanned_ties(spec, placements)


def _style_placements(where: str, style: Any, mod: nn.Module) -> list[tuple[str, Tensor, Any]]:
    """(name, parameter, its placement) of the parameters a column/row style shards."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if not isinstance(style, ColwiseParallel | RowwiseParallel):
        return []
    kind = type(style).__name__
    _expect(isinstance(mod, nn.Linear | nn.Embedding), where,
            f"an nn.Linear or nn.Embedding for {kind}", type(mod).__name__)
    if isinstance(mod, nn.Embedding) and isinstance(style, RowwiseParallel):
        _expect(style.input_layouts == (Replicate(),), where,
                "RowwiseParallel(input_layouts=Replicate()) on an nn.Embedding (its token ids "
                "are whole on every rank)", f"input_layouts={style.input_layouts}")
    colwise = isinstance(style, ColwiseParallel)
    if isinstance(mod, nn.Embedding):
        return [("weight", mod.weight, Shard(1) if colwise else Shard(0))]
    out = [("weight", mod.weight, Shard(0) if colwise else Shard(1))]
    if mod.bias is not None:
        out.append(("bias", mod.bias, Shard(0) if colwise else Replicate()))
    return out


def _check_tie(seen: dict[int, tuple[str, Any]], param: Tensor, where: str,
               placement: Any) -> None:
    first = seen.setdefault(id(param), (where, placement))
    if first[1] != placement:
        raise OmniSpecError(
            f"tp_plan: {where} is the same Parameter as {first[0]} (tied) but its style shards "
            f"it as {placement}, the other as {first[1]}; a tied parameter must be sharded "
            "alike in both places")


def _check_unplanned_ties(spec: OmniSpec, planned: dict[int, tuple[str, Any]]) -> None:
    """A parameter a plan shards must not also sit unsharded in a module no plan names."""
    plan = spec.tp_plan or {}
    for key in plan_keys(spec):
        for label, part in _part_modules(spec, key):
            sharded = {id(p) for fqn, mod in _planned_modules(part, plan.get(key, {}))
                       for p in mod.parameters(recurse=False)}
            for name, p in part.named_parameters(remove_duplicate=False):
                if id(p) in planned and id(p) not in sharded:
                    raise OmniSpecError(
                        f"tp_plan: {label}.{name} is the same Parameter as "
                        f"{planned[id(p)][0]} (tied), which the plan shards, but no style of "
                        f"tp_plan[{key!r}] shards it here; name its module in both plans")


def _planned_modules(part: nn.Module, entries: Mapping[str, Any]
                     ) -> Iterator[tuple[str, nn.Module]]:
    for path in entries:
        yield from resolve(part, path)


# -- the loss of vocabulary-sharded logits --------------------------------------------------------
def vocab_sharded(spec: OmniSpec) -> bool:
    """Whether the head (parallelized on this rank) returns logits sharded on the vocabulary."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel

    entries = (spec.tp_plan or {}).get("head") or {}
    sharded_out = any(isinstance(s, ColwiseParallel) and not s.use_local_output
                      and s.output_layouts == (Shard(-1),) for s in entries.values())
    return sharded_out and any(isinstance(p, DTensor) for p in spec.head.parameters())


def loss_context(spec: OmniSpec) -> AbstractContextManager:
    """``loss_parallel()`` when the head's logits are vocabulary-sharded, so that
    ``spec.loss``'s ``F.cross_entropy`` runs on the shards without gathering the logits; a
    null context otherwise. Enter it around the loss AND the backward that starts from it
    (torch's rule); ``parallel_loss`` does both for a backward run later."""
    if vocab_sharded(spec):
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()
    return contextlib.nullcontext()


__all__ = ["LLM_PARTS", "check_tp_plan", "loss_context", "plan_keys", "resolve", "vocab_sharded"]
