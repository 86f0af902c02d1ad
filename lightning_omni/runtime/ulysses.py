"""Ulysses sequence-parallel attention for one long sample split over an SP group.

Each of the k ranks of the group holds one equal chunk of the sample's tokens. Around the
attention an all-to-all turns sequence sharding into head sharding (each rank then attends over
the whole sequence with H/k heads) and a second one turns it back. Everything outside attention
is per token and runs on the local chunk unchanged.

Two backends, same maths:

* ``"deepspeed"``: ``deepspeed.sequence.layer.DistributedAttention`` (DeepSpeed-Ulysses). It
  runs on gloo once ``deepspeed.init_distributed`` has wrapped torch's process group; it needs
  equal chunks on every rank (an uneven split aborts inside gloo, so ``pad_length`` pads) and,
  for head counts not divisible by k, a global ``mpu`` object that cannot describe several SP
  groups at once, so we require k to divide the head count (the LSSP planner only picks such k).
* ``"torch"``: the same two all-to-alls written on ``all_to_all_rows``. Used where DeepSpeed is
  not installed (it is an optional extra) and as a cross-check of the DeepSpeed path in tests.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from lightning_omnilab.validate import one_of

from .alltoall import all_to_all_rows, group_ranks, group_timeout
from .failures import communicating

BACKENDS = ("auto", "deepspeed", "torch")


def check_sp_heads(heads: int, degree: int, where: str = "attention") -> None:
    """Ulysses shards heads over the group: at least one whole head per rank, equal counts."""
    if degree < 1:
        raise ValueError(f"{where}: SP degree must be >= 1, got {degree}")
    if heads < degree:
        raise ValueError(f"{where}: {heads} attention heads are fewer than the SP degree "
                         f"{degree}; Ulysses needs at least one head per rank")
    if heads % degree:
        raise ValueError(f"{where}: {heads} attention heads are not divisible by the SP degree "
                         f"{degree}; pick a degree dividing the head count")


def pad_length(length: int, degree: int) -> tuple[int, int]:
    """(chunk length per rank, padded total): every rank must hold the same number of tokens."""
    if length < 1:
        raise ValueError(f"length: expected >= 1 token, got {length}")
    chunk = math.ceil(length / degree)
    return chunk, chunk * degree


def local_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    valid_length: torch.Tensor | int | None = None,
                    causal: bool = False) -> torch.Tensor:
    """Softmax attention on ``[batch, seq, heads, dim]`` tensors.

    ``valid_length`` (an int or one per batch row) masks padded keys at the end of each row;
    padded query rows still see the valid keys, so no row is fully masked (no NaN).
    """
    b, s = q.shape[0], q.shape[1]
    mask = None
    if valid_length is not None:
        lengths = torch.as_tensor(valid_length, device=q.device).reshape(-1).expand(b)
        mask = torch.arange(s, device=q.device)[None, :] < lengths[:, None]  # [b, keys]
        mask = mask[:, None, None, :]
    if causal:
        tri = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
        mask = tri[None, None] if mask is None else mask & tri[None, None]
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=mask)
    return out.transpose(1, 2)


def deepspeed_available() -> bool:
    try:
        import deepspeed.sequence.layer  # noqa: F401
    except Exception:  # ImportError, or a broken install raising something else at import
        return False
    return True


def ensure_deepspeed_comm() -> None:
    """Let DeepSpeed reuse torch's process group (gloo on CPU). Call after torch's init.

    DeepSpeed compiles a small op on first use; in a checkout ``TORCH_EXTENSIONS_DIR`` defaults
    to ``build/torch_extensions`` so that it is compiled once per checkout (elsewhere torch's
    own default cache applies).
    """
    repo = Path(__file__).resolve().parents[2]
    if (repo / "pyproject.toml").exists():  # a checkout: cache beside the other build outputs
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(repo / "build" / "torch_extensions"))
    import deepspeed
    import deepspeed.comm as ds_comm

    if not dist.is_initialized():
        raise RuntimeError("ensure_deepspeed_comm: torch.distributed is not initialized; call "
                           "torch.distributed.init_process_group first")
    if not ds_comm.is_initialized():
        deepspeed.init_distributed(dist_backend=dist.get_backend(), verbose=False)


class _TorchUlysses:
    """Sequence->head all-to-all, local attention, head->sequence all-to-all."""

    def __init__(self, group: dist.ProcessGroup, attn: Callable[..., torch.Tensor]) -> None:
        self.group, self.attn = group, attn
        self.k = dist.get_world_size(group)

    def _seq_to_heads(self, x: torch.Tensor, what: str) -> torch.Tensor:
        b, c, h, d = x.shape
        k = self.k
        parts = x.reshape(b, c, k, h // k, d).permute(2, 0, 1, 3, 4).reshape(k, -1)
        got = all_to_all_rows(parts, [1] * k, [1] * k, self.group, what=what)
        return got.reshape(k, b, c, h // k, d).permute(1, 0, 2, 3, 4).reshape(b, k * c, h // k, d)

    def _heads_to_seq(self, x: torch.Tensor, what: str) -> torch.Tensor:
        b, s, hk, d = x.shape
        k = self.k
        c = s // k
        parts = x.reshape(b, k, c, hk, d).permute(1, 0, 2, 3, 4).reshape(k, -1)
        got = all_to_all_rows(parts, [1] * k, [1] * k, self.group, what=what)
        return got.reshape(k, b, c, hk, d).permute(1, 2, 0, 3, 4).reshape(b, c, k * hk, d)

    def __call__(self, q, k, v, what: str = "Ulysses attention", **kwargs):
        out = self.attn(self._seq_to_heads(q, f"{what}, q sequence->heads"),
                        self._seq_to_heads(k, f"{what}, k sequence->heads"),
                        self._seq_to_heads(v, f"{what}, v sequence->heads"), **kwargs)
        return self._heads_to_seq(out, f"{what}, output heads->sequence")


class UlyssesAttention:
    """Attention of one sample whose tokens are split in equal chunks over ``group``.

    Call with this rank's chunk of q, k, v (``[batch, chunk, heads, dim]``) and the sample's
    true length (keys past it are padding); returns this rank's chunk of the output.
    """

    def __init__(self, group: dist.ProcessGroup, causal: bool = False,
                 backend: str = "auto") -> None:
        one_of("backend", backend, BACKENDS)
        if backend == "auto":
            backend = "deepspeed" if deepspeed_available() else "torch"
        self.group, self.causal, self.backend = group, causal, backend
        self.degree = dist.get_world_size(group)
        attn = _CausalOr(causal)
        if backend == "deepspeed":
            ensure_deepspeed_comm()
            from deepspeed.sequence.layer import DistributedAttention

            # batch-first layout: scatter heads (dim 2), gather the sequence (dim 1)
            self._impl = DistributedAttention(attn, group, scatter_idx=2, gather_idx=1)
        else:
            self._impl = _TorchUlysses(group, attn)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 valid_length: int, what: str = "Ulysses attention") -> torch.Tensor:
        """``what`` names the attention (e.g. its sample) in the error a failed all-to-all
        raises (``OmniRuntimeError``, with the group's ranks)."""
        if q.dim() != 4:
            raise ValueError(f"q: expected [batch, chunk, heads, dim], got shape {tuple(q.shape)}")
        check_sp_heads(q.shape[2], self.degree, "UlyssesAttention")
        if not 1 <= valid_length <= q.shape[1] * self.degree:
            raise ValueError(f"valid_length: expected in [1, {q.shape[1] * self.degree}] (chunk "
                             f"{q.shape[1]} x degree {self.degree}), got {valid_length}")
        if self.backend == "deepspeed":
            what = (f"{what}: DeepSpeed-Ulysses all-to-alls (q, k, v, output) over ranks "
                    f"{group_ranks(self.group)}, waiting for every member's chunk")
            timeout = group_timeout(self.group)
            if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
                return _DeepSpeedCall.apply(self._impl, what, timeout, valid_length, q, k, v)
            return _deepspeed_forward(self._impl, what, timeout, valid_length, q, k, v)
        try:  # the all-to-alls name themselves (all_to_all_rows)
            return self._impl(q, k, v, valid_length=valid_length, what=what)
        except _LocalAttentionError as err:
            raise err.args[0] from None


class _LocalAttentionError(Exception):
    """Carries an error of the local attention through ``communicating`` unchanged (not a
    RuntimeError, so it is not mistaken for a failed collective)."""


def _deepspeed_forward(impl, what: str, timeout, valid_length: int, q, k, v) -> torch.Tensor:
    try:
        with communicating(what, timeout):
            return impl(q, k, v, 0, None, valid_length=valid_length)
    except _LocalAttentionError as err:
        raise err.args[0] from None


class _DeepSpeedCall(torch.autograd.Function):
    """DeepSpeed's attention with its backward all-to-alls inside ``communicating`` too.

    DeepSpeed launches its backward all-to-alls from its own autograd function, out of our
    reach, so the forward builds DeepSpeed's graph on detached inputs and the backward runs
    it with ``torch.autograd.grad`` (as reentrant activation checkpointing does): same
    values, same saved tensors, and a failed all-to-all names the attention. The local
    attention's backward runs inside the same ``communicating`` block."""

    @staticmethod
    def forward(ctx, impl, what, timeout, valid_length, q, k, v):
        leaves = tuple(t.detach().requires_grad_(t.requires_grad) for t in (q, k, v))
        with torch.enable_grad():
            out = _deepspeed_forward(impl, what, timeout, valid_length, *leaves)
        ctx.what, ctx.timeout, ctx.leaves, ctx.out = what, timeout, leaves, out
        return out.detach()

    @staticmethod
    def backward(ctx, grad):
        wants = [t for t in ctx.leaves if t.requires_grad]
        with communicating(f"{ctx.what} (backward)", ctx.timeout):
            got = iter(torch.autograd.grad(ctx.out, wants, grad))
        grads = tuple(next(got) if t.requires_grad else None for t in ctx.leaves)
        del ctx.leaves, ctx.out
        return (None, None, None, None, *grads)


class _CausalOr(torch.nn.Module):
    """The local attention DeepSpeed wraps (it expects a Module taking q, k, v)."""

    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.causal = causal

    def forward(self, q, k, v, valid_length=None):
        try:
            return local_attention(q, k, v, valid_length, self.causal)
        except RuntimeError as err:  # compute, not communication: see _deepspeed_forward
            raise _LocalAttentionError(err) from err


_ATTN_CACHE: dict[tuple[int, bool, str], UlyssesAttention] = {}


def ulysses_for(group: dist.ProcessGroup, causal: bool = False,
                backend: str = "auto") -> UlyssesAttention:
    """One UlyssesAttention per (group, causal, backend), built once."""
    key = (id(group), causal, backend)
    att = _ATTN_CACHE.get(key)
    if att is None:
        att = _ATTN_CACHE[key] = UlyssesAttention(group, causal, backend)
    return att


def clear_attention_cache() -> None:
    _ATTN_CACHE.clear()
