"""Tensor parallelism (TP) of an OmniSpec's parts with PyTorch's DTensor ``parallelize_module``.

How a plan is written and checked is ``lightning_omni.tp_plan`` (``OmniSpec.tp_plan``); this
module applies it over a ``DeviceMesh`` and carries what runs on the shards.

Contract of a TP part (checked where cheap): it takes and returns plain, full tensors, as the
pipeline's messages and the encoder features are; only the head may return its logits as a
DTensor sharded on the vocabulary (``Shard(-1)``, ``use_local_output=False``), which the loss
then takes shard by shard (``parallel_loss`` / ``loss_context``) and metrics gather
(``full_logits``). Parameters a plan does not name stay plain tensors, replicated over the TP
group, with the same gradient on every TP rank (DTensor all-reduces the input gradients of a
column-parallel layer).

Encoder TP (``encoder_mesh``): the planner prices an encoder TP degree ``encoder_tp`` dividing
the LLM's ``tp`` as ``tp // encoder_tp`` encoder *lanes* per TP group (``plan.pricing``
``_omni``: ``lanes = tp // encoder_tp``, heads per lane ``heads // encoder_tp``): each lane is an
``encoder_tp``-wide TP group encoding its own samples, and encoder gradients are summed over all
``dp * pp * lanes`` replicas of the same shard. ``parallelize_parts`` takes that lane's 1-D mesh
(a sub-mesh of the TP group, ``encoder_submesh``); which samples each lane encodes and the
gradient sum over lanes are the runtime's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from ..spec import OmniSpecError
from ..spec import _expect as _expect
from ..tp_plan import _style_placements, loss_context, resolve, vocab_sharded

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from ..spec import OmniSpec

# int attributes giving a module's attention heads: a TP shard must hold whole heads
_HEAD_ATTRS = ("heads", "num_heads", "num_attention_heads", "num_key_value_heads")


# -- plans of the example's parts ---------------------------------------------------------------
def gpt_tp_plan() -> dict[str, dict[str, Any]]:
    """The plan of ``examples.multimodal_model``'s ``Embedding``, ``GptBlock`` and ``Head``:
    vocabulary-parallel token embedding, Megatron-style attention and MLP (column- then
    row-parallel), a vocabulary-sharded head output for ``parallel_loss``. A head tied to the
    embedding works unchanged: both shard the shared weight on its vocabulary rows."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {
        "embedding": {"tok": RowwiseParallel(input_layouts=Replicate())},
        "blocks": {"qkv": ColwiseParallel(), "out": RowwiseParallel(),
                   "mlp.0": ColwiseParallel(), "mlp.2": RowwiseParallel()},
        "head": {"out": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)},
    }


def token_encoder_tp_plan() -> dict[str, Any]:
    """The plan of a ``runtime.token_encoder.TokenEncoder`` (every ``EncoderBlock``'s attention
    and MLP; the input projection, final norm and output projector stay replicated)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"blocks.*.qkv": ColwiseParallel(), "blocks.*.proj": RowwiseParallel(),
            "blocks.*.mlp.0": ColwiseParallel(), "blocks.*.mlp.2": RowwiseParallel()}


# -- applying the plans ------------------------------------------------------------------------
def parallelize_parts(spec: OmniSpec, parts: Sequence[str], mesh: DeviceMesh,
                      encoder_mesh: DeviceMesh | None = None, *,
                      src_data_rank: int | None = 0) -> None:
    """Apply ``spec.tp_plan`` in place to the named parts of this rank, over the 1-D TP
    ``mesh``. Collective: every rank of ``mesh`` calls it with the same parts.

    ``parts``: ``"embedding"``, ``"head"``, ``"blocks"`` (all), ``"blocks[i]"`` or
    ``"blocks[i:j]"`` (the spec's block indices, e.g. one pipeline stage's), ``"encoders"``
    (every modality's encoder). Call once per rank with every part it hosts.

    ``encoder_mesh``: the encoders' TP mesh: ``None`` (or one rank) keeps them plain,
    replicated (``encoder_tp = 1``); ``mesh`` itself (``encoder_tp = tp``); or this rank's
    lane of ``encoder_tp`` ranks of ``mesh`` (``encoder_submesh``).

    ``src_data_rank``: as ``parallelize_module``'s: 0 scatters the values of the mesh's first
    rank (every rank then holds the single-device model's shards whatever it built), ``None``
    cuts each rank's shard from its own values without communicating.

    A parameter tied across parts (embedding and head) stays one Parameter: the same DTensor
    in every module of the spec holding it, also in a part this rank does not host."""
    from torch.distributed.tensor.parallel import parallelize_module

    _check_mesh("mesh", mesh)
    if encoder_mesh is not None:
        _check_mesh("encoder_mesh", encoder_mesh)
        ranks, enc = _ranks(mesh), _ranks(encoder_mesh)
        _expect(mesh.size() % encoder_mesh.size() == 0 and set(enc) <= set(ranks),
                "encoder_mesh", f"a sub-mesh of mesh (ranks {ranks}) whose size divides "
                f"{mesh.size()}", f"ranks {enc}")
    before = _owners(spec)
    for label, key, module, m, entries in _planned(spec, parts, mesh, encoder_mesh):
        _check_divisible(label, module, entries, m.size())
        parallelize_module(module, m, dict(entries), src_data_rank=src_data_rank)
        module.register_forward_hook(_OutputCheck(label, key == "head"))
    _retie(before)


def planned_placements(spec: OmniSpec, parts: Sequence[str], mesh: DeviceMesh,
                        encoder_mesh: DeviceMesh | None = None
                        ) -> dict[int, tuple[Tensor, DeviceMesh, tuple[Any, ...]]]:
    """Where ``parallelize_parts`` with the same arguments will place each parameter it
    shards, without touching the module: ``id`` -> (parameter, mesh, placements). Only
    torch's own ``ColwiseParallel`` and ``RowwiseParallel`` (a subclass may place its
    parameters otherwise: they are left out)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    out: dict[int, tuple[Tensor, DeviceMesh, tuple[Any, ...]]] = {}
    for label, _, module, m, entries in _planned(spec, parts, mesh, encoder_mesh):
        for path, style in entries.items():
            if type(style) not in (ColwiseParallel, RowwiseParallel):
                continue
            for fqn, mod in resolve(module, path):
                for _, p, placement in _style_placements(f"{label}.{fqn}", style, mod):
                    out[id(p)] = (p, m, (placement,))
    return out


def encoder_submesh(mesh: DeviceMesh, encoder_tp: int) -> DeviceMesh:
    """This rank's encoder lane: the ``encoder_tp`` consecutive ranks of the 1-D TP ``mesh``
    holding it (``mesh`` itself when ``encoder_tp`` is its size). Collective over ``mesh``."""
    from lightning_omnilab.validate import positive_int

    from .parallel_dims import check_encoder_tp

    positive_int("encoder_tp", encoder_tp)
    _check_mesh("mesh", mesh)
    tp = mesh.size()
    check_encoder_tp(tp, encoder_tp)
    if encoder_tp == tp:
        return mesh
    name = (mesh.mesh_dim_names or ("tp",))[0]
    return mesh._unflatten(0, (tp // encoder_tp, encoder_tp),
                           (f"{name}_lane", f"{name}_enc"))[f"{name}_enc"]


def _check_mesh(name: str, mesh: Any) -> None:
    from torch.distributed.device_mesh import DeviceMesh

    _expect(isinstance(mesh, DeviceMesh) and mesh.ndim == 1, name, "a 1-D DeviceMesh",
            getattr(mesh, "shape", type(mesh).__name__))


def _ranks(mesh: DeviceMesh) -> list[int]:
    return [int(r) for r in mesh.mesh.flatten().tolist()]


def _targets(spec: OmniSpec, parts: Sequence[str], mesh: DeviceMesh,
             encoder_mesh: DeviceMesh | None) -> list[tuple[str, str, nn.Module, Any]]:
    """(label, plan key, module, mesh) of each named part, each module once."""
    blocks = list(spec.blocks)
    out: list[tuple[str, str, nn.Module, Any]] = []
    if isinstance(parts, str):
        parts = [parts]
    for part in parts:
        if part in ("embedding", "head"):
            out.append((part, part, getattr(spec, part), mesh))
        elif part == "encoders":
            out += [(f"modalities[{m.name}].encoder", m.name, m.encoder, encoder_mesh)
                    for m in spec.modalities]
        elif isinstance(part, str) and part.startswith("blocks"):
            out += [(f"blocks[{i}]", "blocks", blocks[i], mesh)
                    for i in _block_indices(part, len(blocks))]
        else:
            raise OmniSpecError(f"parts: expected 'embedding', 'head', 'blocks', 'blocks[i]', "
                                f"'blocks[i:j]' or 'encoders', got {part!r}")
    seen: set[int] = set()
    return [t for t in out if not (id(t[2]) in seen or seen.add(id(t[2])))]


def _planned(spec: OmniSpec, parts: Sequence[str], mesh: DeviceMesh,
             encoder_mesh: DeviceMesh | None) -> Iterator[tuple[str, str, nn.Module, Any, Any]]:
    """(label, plan key, module, mesh, plan entries) of each named part its plan shards."""
    plan = spec.tp_plan or {}
    for label, key, module, m in _targets(spec, parts, mesh, encoder_mesh):
        entries = plan.get(key)
        if entries and m is not None and m.size() > 1:
            yield label, key, module, m, entries


def _block_indices(part: str, n: int) -> range:
    if part == "blocks":
        return range(n)
    inner = part[len("blocks["):-1] if part.startswith("blocks[") and part.endswith("]") else ""
    try:
        if ":" in inner:
            lo, hi = (int(x) for x in inner.split(":"))
            if 0 <= lo <= hi <= n:  # (an empty slice: a stage without blocks)
                return range(lo, hi)
        elif 0 <= int(inner) < n:
            return range(int(inner), int(inner) + 1)
    except ValueError:
        pass
    raise OmniSpecError(f"parts: expected 'blocks', 'blocks[i]' (0 <= i < {n}) or "
                        f"'blocks[i:j]' (0 <= i <= j <= {n}) of the spec's {n} blocks, got "
                        f"{part!r}")


def _check_divisible(label: str, module: nn.Module, entries: Mapping[str, Any],
                     degree: int) -> None:
    """Even shards only: every sharded dimension, and the heads of every attention module of
    the part (whole heads per rank), divisible by the TP degree."""
    for path in entries:
        for fqn, mod in resolve(module, path):
            for name, p, placement in _style_placements(f"{label}.{fqn}", entries[path], mod):
                dim = getattr(placement, "dim", None)
                if dim is not None and p.shape[dim] % degree:
                    raise OmniSpecError(
                        f"{label}.{fqn}.{name}: expected its sharded dimension {dim} (size "
                        f"{p.shape[dim]}) divisible by the TP degree {degree}; pick a TP "
                        "degree dividing it")
    for fqn, mod in module.named_modules():
        for attr in _HEAD_ATTRS:
            for owner in (mod, getattr(mod, "config", None)):
                heads = getattr(owner, attr, None)
                if isinstance(heads, int) and not isinstance(heads, bool) and heads % degree:
                    raise OmniSpecError(
                        f"{label}{'.' + fqn if fqn else ''}: expected its {attr}={heads} "
                        f"divisible by the TP degree {degree} (a rank holds whole heads)")


class _OutputCheck:
    """A part under TP returns a plain tensor; the head may return vocabulary-sharded logits."""

    def __init__(self, label: str, head: bool) -> None:
        self.label, self.head = label, head

    def __call__(self, module: nn.Module, args: Any, output: Any) -> None:
        from torch.distributed.tensor import DTensor, Shard

        if not isinstance(output, DTensor):
            return
        if self.head and output.placements in ((Shard(-1),), (Shard(output.dim() - 1),)):
            return
        raise OmniSpecError(
            f"{self.label}: under its tp_plan it returned a DTensor ({output.placements}); "
            "expected a plain tensor (end the part's plan with use_local_output=True styles"
            + (", or the head's logits sharded on the vocabulary, Shard(-1))" if self.head
               else ")"))


def _owners(spec: OmniSpec) -> dict[int, list[tuple[nn.Module, str, Tensor]]]:
    """Every (module, name) holding each parameter, over all of the spec's parts."""
    from .hosting import all_modules

    owners: dict[int, list[tuple[nn.Module, str, Tensor]]] = {}
    seen: set[int] = set()
    for part in all_modules(spec):
        for mod in part.modules():
            if id(mod) in seen:
                continue
            seen.add(id(mod))
            for name, p in mod._parameters.items():
                if p is not None:
                    owners.setdefault(id(p), []).append((mod, name, p))
    return {k: v for k, v in owners.items() if len(v) > 1}


def _retie(before: dict[int, list[tuple[nn.Module, str, Tensor]]]) -> None:
    """Point every holder of a tied parameter at the DTensor one of them was given."""
    from torch.distributed.tensor import DTensor

    for holders in before.values():
        old = holders[0][2]
        new = [mod._parameters[name] for mod, name, _ in holders]
        dist = [p for p in new if p is not old and isinstance(p, DTensor)]
        if not dist:
            continue
        keep = dist[0]
        for p in dist[1:]:
            if p.placements != keep.placements or p.device_mesh != keep.device_mesh:
                raise OmniSpecError(f"tp_plan: a tied parameter was sharded as {p.placements} "
                                    f"and as {keep.placements}; shard it alike in both places")
        for mod, name, _ in holders:
            mod._parameters[name] = keep


# -- loss, metrics, gradients --------------------------------------------------------------------
def parallel_loss(spec: OmniSpec) -> Callable[[Tensor, dict[str, Tensor]], tuple[Tensor, Tensor]]:
    """``spec.loss`` for this rank's head: itself when the logits are plain; for
    vocabulary-sharded logits, the loss under ``loss_parallel`` returning a plain sum whose
    backward enters ``loss_parallel`` again (a pipeline runs it in a later action)."""
    if not vocab_sharded(spec):
        return spec.loss
    fn = spec.loss

    def loss(logits: Tensor, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        if not torch.is_grad_enabled() or not logits.requires_grad:
            with loss_context(spec):
                total, count = fn(logits, batch)
            return local(total), local(count)
        return _ParallelLoss.apply(fn, batch, logits)

    return loss


class _ParallelLoss(torch.autograd.Function):
    """The loss on vocabulary shards; its backward under ``loss_parallel`` whenever it runs."""

    @staticmethod
    def forward(ctx, fn, batch, logits):
        from torch.distributed.tensor.parallel import loss_parallel

        leaf = logits.detach().requires_grad_()
        with torch.enable_grad(), loss_parallel():
            total, count = fn(leaf, batch)
        ctx.leaf, ctx.total = leaf, total
        count = local(count).detach()
        ctx.mark_non_differentiable(count)
        return local(total).detach(), count

    @staticmethod
    def backward(ctx, grad, _count_grad):
        from torch.distributed.tensor.parallel import loss_parallel

        with loss_parallel():
            (g,) = torch.autograd.grad(ctx.total, ctx.leaf, like(grad, ctx.total))
        del ctx.leaf, ctx.total
        return None, None, g


def full_logits(t: Tensor) -> Tensor:
    """The whole logits of vocabulary-sharded ones (an all-gather over the TP group: every TP
    rank calls it), else ``t``. For metrics and predictions only, under ``no_grad``: the loss
    takes the shards (``parallel_loss``)."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def local(t: Any) -> Any:
    """A DTensor's local shard (sharing its storage: an in-place all-reduce on it updates the
    DTensor); anything else unchanged."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def like(local_tensor: Tensor, ref: Tensor) -> Tensor:
    """``local_tensor`` as a DTensor with ``ref``'s mesh, placements and global shape (``ref``
    plain: ``local_tensor`` itself)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(ref, DTensor):
        return local_tensor
    return DTensor.from_local(local_tensor, ref.device_mesh, ref.placements, run_check=False,
                              shape=ref.shape, stride=ref.stride())


__all__ = ["encoder_submesh", "full_logits", "gpt_tp_plan", "like", "local", "loss_context",
           "parallel_loss", "parallelize_parts", "planned_placements", "token_encoder_tp_plan",
           "vocab_sharded"]
