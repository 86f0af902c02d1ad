"""OmniSpec: how a LightningModule's encoders, LLM embedding, blocks, head and loss connect.

A module opts in with ``configure_omni(self) -> OmniSpec``. The runtime needs the parts
separately so it can run encoders on any rank and cut the LLM into pipeline stages; the
module's own ``training_step`` stays the single-device reference and must compute the same
thing, by the conventions below.

Batch conventions (a dict of tensors, all with the batch dimension first):

- ``batch[spec.tokens]`` ``[B, T]`` token ids, padded to a fixed T; each modality marks where its
  features go with ``token_id`` placeholders, ``lengths[i]`` of them in sample i;
- ``batch[modality.inputs]`` ``[B, L, ...]`` padded encoder inputs, ``batch[modality.lengths]``
  ``[B]`` valid rows per sample (0: the sample has no such input);
- the encoder maps ``(inputs[S], lengths[S]) -> [|S|, L, hidden]``, each sample independent of
  the others and of its padding (so any subset of samples may be encoded anywhere, padded to
  its own longest: the first batch checks this);
- ``scatter_features`` puts the valid rows, sample by sample, at the placeholders;
- ``loss(logits, batch) -> (sum, count)``: the loss summed over a (micro)batch and the number of
  terms; the step's loss is the global sum over the global count;
- ``metrics[name](logits, batch) -> (sum, count)``: more per-step values, reduced the same way
  (e.g. token accuracy); the strategy hands them, with the loss, to Lightning's batch-end hooks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from lightning_omnilab.lost_peer import is_lost_peer

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle


class OmniSpecError(ValueError):
    """An OmniSpec whose parts are missing or do not connect."""


@dataclass(frozen=True)
class Modality:
    """One encoder (projector included) and where its features enter the LLM input.

    Attributes:
        name: the modality's name (unique in the spec; a ``tp_plan`` key for its encoder).
        encoder: ``(inputs[S], lengths[S]) -> [|S|, L, hidden]``, each sample independent of
            the others and of its padding.
        inputs: the batch key of the padded encoder inputs ``[B, L, ...]``.
        lengths: the batch key of the valid rows per sample ``[B]`` (0: no such input).
        token_id: the placeholder token id where this modality's features go.
    """

    name: str
    encoder: nn.Module
    inputs: str
    lengths: str
    token_id: int


@dataclass(frozen=True)
class OmniSpec:
    """The parts of a multimodal LLM, in the order the data flows through them.

    Attributes:
        modalities: the encoders and where their features go.
        embedding: token ids ``[B, T]`` -> ``[B, T, hidden]``.
        blocks: the LLM blocks, each ``[B, T, hidden]`` -> the same shape; the pipeline cuts
            this list into stages.
        head: ``[B, T, hidden]`` -> logits.
        loss: ``loss(logits, batch) -> (sum, count)`` over a (micro)batch.
        tokens: the batch key of the token ids.
        block_costs: relative cost of each block for balancing the stages (default: its
            parameter count).
        metrics: more ``(sum, count)`` values per step by name, reduced as the loss is.
        extra: free-form data the runtime does not read.
        tp_plan: tensor-parallel plans by part (``"embedding"``, ``"blocks"``: each block,
            ``"head"``, a modality's name: its encoder): module path -> torch
            ``ParallelStyle`` (see ``lightning_omni.tp_plan``).
    """

    modalities: Sequence[Modality]
    embedding: nn.Module
    blocks: Sequence[nn.Module]
    head: nn.Module
    loss: Callable[[Tensor, dict[str, Tensor]], tuple[Tensor, Tensor]]
    tokens: str = "tokens"
    # relative cost of one block (default: its parameter count), for balancing the stages
    block_costs: Sequence[float] | None = None
    metrics: Mapping[str, Callable[[Tensor, dict[str, Tensor]], tuple[Tensor, Tensor]]] = \
        field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    # tensor-parallel plans by part ("embedding", "blocks": each block, "head", a modality's
    # name: its encoder): module path -> torch ParallelStyle (see tp_plan)
    tp_plan: Mapping[str, Mapping[str, ParallelStyle]] | None = None

    def validate(self, pipeline_parallel: int) -> None:
        """Static checks, before any data is seen."""
        _expect(isinstance(self.embedding, nn.Module), "embedding", "an nn.Module",
                type(self.embedding).__name__)
        _expect(isinstance(self.head, nn.Module), "head", "an nn.Module",
                type(self.head).__name__)
        _expect(callable(self.loss), "loss", "a callable (logits, batch) -> (sum, count)",
                type(self.loss).__name__)
        blocks = list(self.blocks)
        _expect(len(blocks) >= pipeline_parallel, "blocks",
                f"at least pipeline_parallel={pipeline_parallel} blocks", len(blocks))
        for i, b in enumerate(blocks):
            _expect(isinstance(b, nn.Module), f"blocks[{i}]", "an nn.Module", type(b).__name__)
        names = [m.name for m in self.modalities]
        _expect(len(set(names)) == len(names), "modalities", "unique names", names)
        ids = [m.token_id for m in self.modalities]
        _expect(len(set(ids)) == len(ids), "modalities", "distinct placeholder token ids", ids)
        for m in self.modalities:
            _expect(isinstance(m.encoder, nn.Module), f"modalities[{m.name}].encoder",
                    "an nn.Module", type(m.encoder).__name__)
        for name, fn in dict(self.metrics).items():
            _expect(isinstance(name, str) and name != "loss" and callable(fn),
                    f"metrics[{name!r}]", "a callable (logits, batch) -> (sum, count) under a "
                    "name other than 'loss'", type(fn).__name__)
        if self.block_costs is not None:
            _expect(len(self.block_costs) == len(blocks) and all(c > 0 for c in self.block_costs),
                    "block_costs", f"{len(blocks)} positive numbers", list(self.block_costs))
        if self.tp_plan is not None:
            from .tp_plan import check_tp_plan

            check_tp_plan(self)

    def costs_of_blocks(self) -> list[float]:
        if self.block_costs is not None:
            return [float(c) for c in self.block_costs]
        return [float(sum(p.numel() for p in b.parameters())) or 1.0 for b in self.blocks]

    def check_batch(self, batch: dict[str, Tensor], check_finite: bool = True) -> None:
        """Data checks on every batch (a few comparisons over the token ids): keys, sizes,
        lengths within the padded inputs, placeholder counts equal to the lengths; with
        ``check_finite``, no NaN or inf in any floating-point tensor of the batch (one
        ``isfinite`` pass each: a NaN input would otherwise become a NaN loss and NaN
        weights after the optimizer step)."""
        _expect(isinstance(batch, dict), "batch", "a dict of tensors", type(batch).__name__)
        keys = [self.tokens] + [k for m in self.modalities for k in (m.inputs, m.lengths)]
        for k in keys:
            _expect(k in batch and isinstance(batch[k], Tensor), f"batch[{k!r}]",
                    "a tensor (named by the OmniSpec)", type(batch.get(k)).__name__)
        tokens = batch[self.tokens]
        _expect(tokens.dim() == 2, f"batch[{self.tokens!r}]", "shape [B, T]", tuple(tokens.shape))
        _expect(_integer(tokens), f"batch[{self.tokens!r}]", "integer token ids", tokens.dtype)
        for m in self.modalities:
            lengths, x = batch[m.lengths], batch[m.inputs]
            # a float length may be NaN: it has no row count (and int() of it would raise)
            _expect(_integer(lengths), f"batch[{m.lengths!r}]", "integer row counts",
                    lengths.dtype)
            _expect(lengths.shape == tokens.shape[:1], f"batch[{m.lengths!r}]",
                    f"shape [{tokens.shape[0]}]", tuple(lengths.shape))
            _expect(x.shape[0] == tokens.shape[0] and x.dim() >= 2, f"batch[{m.inputs!r}]",
                    f"shape [{tokens.shape[0]}, L, ...]", tuple(x.shape))
            bad = ((lengths < 0) | (lengths > x.shape[1])).nonzero()
            if bad.numel():
                i = int(bad[0, 0])
                raise OmniSpecError(
                    f"batch: sample {i} has {m.lengths}={int(lengths[i])}; expected 0 to "
                    f"{x.shape[1]} (the padded rows of batch[{m.inputs!r}])")
            placeholders = (tokens == m.token_id).sum(dim=1)
            if not torch.equal(placeholders, lengths.to(placeholders.dtype)):
                i = int((placeholders != lengths).nonzero()[0, 0])
                raise OmniSpecError(
                    f"batch: sample {i} has {int(placeholders[i])} {m.name!r} placeholder "
                    f"tokens (id {m.token_id}) in batch[{self.tokens!r}] but "
                    f"{m.lengths}={int(lengths[i])}; they must be equal")
        if check_finite:
            check_finite_batch(batch)

    @torch.no_grad()
    def check_shapes(self, batch: dict[str, Tensor], with_loss: bool = True,
                     elsewhere: Mapping[int, tuple[int, ...]] | None = None) -> Probe:
        """Run one sample through every part (under the caller's precision context), check
        that the parts connect, and return what the runtime sizes its messages with.

        ``elsewhere``: shapes of the parameters this rank does not hold (by ``id``; a meta
        build never allocated them). Parts with such parameters run on the meta device,
        which gives shapes and dtypes; their encoders and loss are checked by the ranks
        that host them."""
        one = {k: v[:1] for k, v in batch.items() if isinstance(v, Tensor)}
        run = _PartRunner(elsewhere or {}, one[self.tokens].device)
        h = run("embedding", self.embedding, one[self.tokens])
        _expect(isinstance(h, Tensor) and h.dim() == 3 and h.shape[:2] == one[self.tokens].shape,
                "embedding", "output [B, T, hidden]", _shape(h))
        for m in self.modalities:
            n = int(one[m.lengths][0])
            if n == 0 or run.elsewhere(m.encoder):
                continue
            f = run(f"modalities[{m.name}].encoder", m.encoder, one[m.inputs], one[m.lengths])
            _expect(isinstance(f, Tensor) and f.dim() == 3 and f.shape[-1] == h.shape[-1]
                    and f.shape[1] >= n, f"modalities[{m.name}].encoder",
                    f"output [B, L>={n}, hidden={h.shape[-1]}] (the embedding's width)",
                    _shape(f))
            _check_padding_masked(m, batch, run)
        feature_dtype, dtypes = h.dtype, []
        for i, b in enumerate(self.blocks):
            out = run(f"blocks[{i}]", b, h)
            _expect(isinstance(out, Tensor) and out.shape == h.shape, f"blocks[{i}]",
                    f"output of its input's shape {tuple(h.shape)}", _shape(out))
            h = out
            dtypes.append(h.dtype)
        logits = run("head", self.head, h)
        _expect(isinstance(logits, Tensor) and logits.shape[:2] == h.shape[:2], "head",
                f"output [B, T, ...] with B, T = {tuple(h.shape[:2])}", _shape(logits))
        if with_loss and not run.elsewhere(self.head):
            with _loss_context(self):  # vocabulary-sharded logits under TP
                res = _call("loss", self.loss, logits, one)
            _expect(isinstance(res, tuple) and len(res) == 2, "loss", "a (sum, count) pair",
                    type(res).__name__)
        return Probe(int(h.shape[-1]), feature_dtype, tuple(dtypes), tuple(logits.shape[2:]),
                     logits.dtype)


@dataclass(frozen=True)
class Probe:
    """What one sample through the parts shows: the hidden width, the dtype features are
    scattered in (the embedding's output), each block's output dtype (a stage boundary's
    message dtype) and the head's output per token (predict messages)."""

    hidden: int
    feature_dtype: torch.dtype
    block_dtypes: tuple[torch.dtype, ...]
    logits_shape: tuple[int, ...]
    logits_dtype: torch.dtype


# how far a sample's valid rows may move when its padding is cut, by output dtype
_PADDING_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4}


def _check_padding_masked(m: Modality, batch: dict[str, Tensor], run: _PartRunner) -> None:
    """The runtime encodes each group of samples padded only to its own longest (and LSSP
    each sample alone), so an encoder's valid rows must not depend on the padding: checked
    on the batch's shortest sample, in eval mode (dropout would differ by itself)."""
    lengths, x = batch[m.lengths], batch[m.inputs]
    valid = lengths > 0
    if not bool(valid.any()):
        return
    i = int(torch.nonzero(valid & (lengths == lengths[valid].min()))[0, 0])
    n = int(lengths[i])
    if n == x.shape[1]:
        return
    modes = [(mod, mod.training) for mod in m.encoder.modules()]
    m.encoder.eval()
    try:
        name, one = f"modalities[{m.name}].encoder", lengths[i:i + 1]
        padded = valid_rows(run(name, m.encoder, x[i:i + 1], one), one)
        alone = valid_rows(run(name, m.encoder, x[i:i + 1, :n], one), one)
    finally:
        for mod, training in modes:
            mod.training = training
    tol = _PADDING_TOLERANCE.get(padded.dtype, 3e-2)
    gap = float((padded.double() - alone.double()).abs().max())
    scale = max(float(padded.double().abs().max()), 1.0)
    if gap > tol * scale:
        raise OmniSpecError(
            f"modalities[{m.name}].encoder: expected the valid rows of a sample not to depend "
            f"on its padding (mask the padded rows: {m.lengths} gives the valid ones), got a "
            f"difference of {gap:.3g} between sample {i}'s {n} rows encoded alone and padded "
            f"to {x.shape[1]}; the runtime encodes samples padded only to their group's longest")


def check_finite_batch(batch: Mapping[str, object]) -> None:
    """Refuse NaN or inf in a floating-point tensor of ``batch``, naming the key, the sample
    (the batch dimension comes first) and the first bad element. Integer and bool tensors
    cannot hold either and are not read."""
    for key, x in batch.items():
        if not (isinstance(x, Tensor) and x.is_floating_point()) or bool(torch.isfinite(x).all()):
            continue
        bad = torch.nonzero(~torch.isfinite(x))
        first = tuple(int(v) for v in bad[0])
        value = float(x[first])
        what = "NaN" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        samples = int(bad[:, 0].unique().numel()) if x.dim() else 1
        where = (f"sample {first[0]} holds {what} (first at index {first}; {bad.shape[0]} "
                 f"non-finite value(s) in {samples} sample(s))" if x.dim()
                 else f"holds {what}")
        raise OmniSpecError(
            f"batch[{key!r}]: {where}; expected finite values: a NaN or inf input makes the "
            "loss and then the weights NaN. Fix the data, or set "
            "OmniStrategy(check_finite=False) to let Lightning handle non-finite input")


def scatter_features(h: Tensor, tokens: Tensor, token_id: int, features: Tensor) -> Tensor:
    """Put ``features`` ``[N, hidden]`` (sample by sample, row by row) at the ``token_id``
    placeholders of ``tokens`` in the embedded sequence ``h``."""
    mask = (tokens == token_id).unsqueeze(-1)
    if features.shape[0] == 0:
        return h
    return h.masked_scatter(mask, features.to(h.dtype))


def valid_rows(out: Tensor, lengths: Tensor) -> Tensor:
    """The encoder output rows of each sample's valid positions, sample by sample."""
    keep = torch.arange(out.shape[1], device=out.device) < lengths.to(out.device).unsqueeze(1)
    return out[keep]


class _PartRunner:
    """Runs a part for real, or on the meta device where it has parameters this rank does
    not hold (their shapes given), converting the hidden state between the two."""

    def __init__(self, shapes: Mapping[int, tuple[int, ...]], device: torch.device) -> None:
        self.shapes, self.device = shapes, device

    def elsewhere(self, part: nn.Module) -> bool:
        return any(id(p) in self.shapes for p in part.parameters())

    def __call__(self, name: str, part: nn.Module, *args: Tensor) -> object:
        if not self.elsewhere(part):
            real = [torch.zeros(a.shape, dtype=a.dtype, device=self.device) if a.is_meta
                    else a for a in args]
            return _call(name, part, *real)
        state = {n: torch.empty(self.shapes.get(id(p), p.shape), dtype=p.dtype, device="meta")
                 for n, p in part.named_parameters()}
        state.update({n: b.to("meta") for n, b in part.named_buffers()})
        meta = [a.to("meta") for a in args]
        return _call(name, lambda *a: torch.func.functional_call(part, state, a), *meta)


def _loss_context(spec: OmniSpec) -> AbstractContextManager:
    if spec.tp_plan is None:
        return nullcontext()
    from .tp_plan import loss_context

    return loss_context(spec)


def _call(name: str, part: Callable, *args: Tensor) -> object:
    try:
        return part(*args)
    except Exception as err:
        if is_lost_peer(err):  # a collective inside the part (under TP): not a shape error
            raise
        shapes = [_shape(a) for a in args if isinstance(a, Tensor)]
        raise OmniSpecError(f"{name}: failed on inputs of shapes {shapes} from the previous "
                            f"part ({type(err).__name__}: {err})") from err


def _integer(t: Tensor) -> bool:
    return not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)


def _shape(x: object) -> object:
    return tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__


def _expect(ok: bool, name: str, expected: str, got: object) -> None:
    if not ok:
        raise OmniSpecError(f"{name}: expected {expected}, got {got!r}")


def get_spec(module: nn.Module) -> OmniSpec:
    """The module's OmniSpec, or a clear error when it has none."""
    hook = getattr(module, "configure_omni", None)
    if not callable(hook):
        raise OmniSpecError(
            f"{type(module).__name__}: OmniStrategy needs the LightningModule to define "
            "configure_omni(self) -> OmniSpec (see docs/omni/quickstart.md)")
    spec = hook()
    _expect(isinstance(spec, OmniSpec), f"{type(module).__name__}.configure_omni()",
            "an OmniSpec", type(spec).__name__)
    return spec
