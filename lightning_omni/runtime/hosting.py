"""Which ranks hold each parameter, derived from the layout alone (the same on every rank).

A parameter is held by every rank whose stage hosts a module containing it: a block's by its
stage's data-parallel group, the encoders' by every rank that runs encoder work, a tied
embedding/head weight by the first and the last stage's groups together. Every rank computes
the same table, so each parameter has one canonical holder (the lowest rank holding it, for
norms that count it once) and one set of holders (for summing gradients and syncing values),
with no message exchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from torch import Tensor, nn

from ..spec import OmniSpec
from .layout import Layout


def encoder_stages(schedule: str, pp: int) -> tuple[int, ...]:
    """Stages whose ranks run encoder work: all under uniform insertion, else stage 0."""
    return tuple(range(pp)) if schedule == "uniform_insertion" else (0,)


def stage_modules(spec: OmniSpec, layout: Layout, stage: int, encoders: bool) -> list[nn.Module]:
    """The LLM parts of ``stage`` (embedding first, then every model chunk's blocks, head
    last) and, if ``encoders``, every modality's encoder."""
    blocks = list(spec.blocks)
    mods: list[nn.Module] = [b for lo, hi in layout.chunk_bounds(stage) for b in blocks[lo:hi]]
    if stage == 0:
        mods.insert(0, spec.embedding)
    if stage == layout.pp - 1:
        mods.append(spec.head)
    if encoders:
        mods += [m.encoder for m in spec.modalities]
    return mods


def all_parameters(spec: OmniSpec) -> list[Tensor]:
    """Every parameter of the spec's parts once, in an order every rank agrees on."""
    return _once(p for mod in all_modules(spec) for p in mod.parameters())


def all_buffers(spec: OmniSpec) -> list[Tensor]:
    """Every buffer of the spec's parts once, in the same kind of order."""
    return _once(b for mod in all_modules(spec) for b in mod.buffers())


def _once(tensors: Iterator[Tensor]) -> list[Tensor]:
    seen: set[int] = set()
    out: list[Tensor] = []
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def all_modules(spec: OmniSpec) -> Iterator[nn.Module]:
    yield spec.embedding
    yield from spec.blocks
    yield spec.head
    for m in spec.modalities:
        yield m.encoder


@dataclass(frozen=True)
class Hosting:
    """``params[i]`` is held by the global ranks ``holders[i]`` (ascending)."""

    params: tuple[Tensor, ...]
    holders: tuple[tuple[int, ...], ...]
    rank: int

    def held(self) -> list[Tensor]:
        """This rank's parameters."""
        return [p for p, h in zip(self.params, self.holders, strict=True) if self.rank in h]

    def counted_here(self) -> list[Tensor]:
        """Parameters this rank counts in a global norm (it is their lowest holder)."""
        return [p for p, h in zip(self.params, self.holders, strict=True) if h[0] == self.rank]

    def groups(self) -> list[tuple[int, ...]]:
        """Every distinct holder set with more than one rank, in one order on every rank."""
        return sorted({h for h in self.holders if len(h) > 1})

    def by_holders(self) -> dict[tuple[int, ...], list[Tensor]]:
        """This rank's parameters grouped by their holder sets (of more than one rank)."""
        out: dict[tuple[int, ...], list[Tensor]] = {}
        for p, h in zip(self.params, self.holders, strict=True):
            if self.rank in h and len(h) > 1:
                out.setdefault(h, []).append(p)
        return out

    def shared_between_stages(self, pp: int) -> list[tuple[int, ...]]:
        """Holder sets that span more than one stage (tied weights, shared modules)."""
        return [h for h in self.groups() if len({r % pp for r in h}) > 1]


def param_hosting(spec: OmniSpec, layout: Layout, schedule: str) -> Hosting:
    enc = set(encoder_stages(schedule, layout.pp))
    stages_of: dict[int, set[int]] = {}
    for s in range(layout.pp):
        for mod in stage_modules(spec, layout, s, s in enc):
            for p in mod.parameters():
                stages_of.setdefault(id(p), set()).add(s)
    params = all_parameters(spec)
    holders = tuple(tuple(sorted(d * layout.pp + s for d in range(layout.dp)
                                 for s in stages_of[id(p)])) for p in params)
    return Hosting(tuple(params), holders, layout.rank)
