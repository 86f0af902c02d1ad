"""A small pre-norm transformer encoder over token rows whose attention can be swapped.

Every layer but attention works per token, so the same weights run a padded batch of short
samples (data parallel, key-padding mask) or one rank's chunk of a long sample (sequence
parallel, Ulysses attention) without resharding anything. Positions are part of the input rows
(the data pipeline appends them), which keeps a chunk independent of where it sits: so the
encoder declares ``splittable_rows = True`` (the LSSP contract, ``runtime.splittable``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .ulysses import local_attention

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class EncoderBlock(nn.Module):
    """Pre-norm attention and MLP. The fused ``qkv`` output is laid out head by head
    (``[heads, 3, head_dim]``) and the heads are counted from the tensor, so a tensor-parallel
    shard of its rows holds whole heads (``tensor_parallel.token_encoder_tp_plan``); the
    attention then sees this rank's heads, which Ulysses may shard further."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int = 2) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim: expected a multiple of heads ({heads}), got {dim}")
        self.heads, self.head_dim = heads, dim // heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(),
                                 nn.Linear(mlp_ratio * dim, dim))

    def forward(self, x: torch.Tensor, attention: Attention) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, s, -1, 3, self.head_dim).unbind(3)
        x = x + self.proj(attention(q, k, v).reshape(b, s, -1))
        return x + self.mlp(self.norm2(x))


class TokenEncoder(nn.Module):
    """``[batch, seq, in_dim]`` rows -> ``[batch, seq, out_dim]`` features, one per token.

    Rows interact only in attention and carry their own positions, so LSSP may split one
    sample's rows over ranks (``splittable_rows``, see ``runtime.splittable``)."""

    splittable_rows = True

    def __init__(self, in_dim: int, dim: int = 32, heads: int = 4, layers: int = 2,
                 out_dim: int | None = None, causal: bool = False) -> None:
        super().__init__()
        self.heads, self.causal, self.dim = heads, causal, dim
        self.inp = nn.Linear(in_dim, dim)
        self.blocks = nn.ModuleList(EncoderBlock(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, out_dim or dim)
        self.in_dim, self.out_dim = in_dim, out_dim or dim

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None,
                attention: Attention | None = None) -> torch.Tensor:
        if attention is None:
            def attention(q, k, v):
                return local_attention(q, k, v, lengths, self.causal)
        h = self.inp(x)
        for block in self.blocks:
            h = block(h, attention)
        return self.out(self.norm(h))
