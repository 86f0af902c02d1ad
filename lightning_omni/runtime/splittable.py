"""The LSSP contract: which encoders may have one sample's rows split over ranks.

LSSP runs a long sample's encoder work sequence parallel: each rank of an SP group holds one
chunk of the sample's rows and the encoder's attention is swapped for Ulysses attention over
the group. That is only the encoder's own computation when every row is computed independently
of the others except through the attention it is handed. An encoder that adds learned
positions inside ``forward`` (each chunk would restart at position 0), convolves or pools over
rows, or normalizes over the sequence computes something else on a chunk, without any error.
So an encoder is split only when it says so:

* ``splittable_rows = True`` (a class attribute): positions are carried in the input rows,
  rows are independent except through the attention it receives;
* ``heads``: an int >= 1, its attention heads (Ulysses shards them over the SP group; a
  tensor-parallel encoder holds ``heads / encoder_tp`` of them per TP rank, which Ulysses
  shards further);
* ``forward(x, lengths, attention=None)``: runs its attention through ``attention(q, k, v)``
  (``[batch, rows, heads, dim]`` tensors) when given.

``TokenEncoder`` declares it. Any other encoder's samples run whole on one rank (data
parallel, still moved between replicas by grouped reordering), however long.
"""

from __future__ import annotations

import inspect

from torch import nn

from lightning_omnilab.validate import is_int


def splittable_heads(encoder: nn.Module, encoder_tp: int = 1) -> int:
    """The attention heads LSSP may shard ``encoder``'s samples over, or 0: never split them.

    ``encoder_tp``: the encoder's TP degree; each TP rank's attention sees
    ``heads // encoder_tp`` heads (column-parallel qkv, whole heads per shard), and Ulysses
    runs over the processes of one TP rank, so it shards those. Returns ``encoder.heads`` (per
    TP rank) when the encoder declares ``splittable_rows = True`` (see the
    module docstring), 0 when it does not declare it. Raises ``ValueError`` when it declares it
    without an int ``heads >= 1`` or without a forward that accepts ``attention=``.
    """
    name = type(encoder).__name__
    declared = getattr(encoder, "splittable_rows", False)
    if not isinstance(declared, bool):
        raise ValueError(f"{name}.splittable_rows: expected True (rows may be split over ranks) "
                         f"or False, got {declared!r}")
    if not declared:
        return 0
    heads = getattr(encoder, "heads", None)
    if not is_int(heads, minimum=1):
        raise ValueError(f"{name}: declares splittable_rows=True, so LSSP may split its samples "
                         "over ranks with Ulysses attention, which shards attention heads; "
                         f"expected an int `heads` attribute >= 1, got {heads!r}")
    if not _accepts_attention(encoder):
        raise ValueError(f"{name}: declares splittable_rows=True, so LSSP runs it with Ulysses "
                         "attention passed as forward(x, lengths, attention=...); expected a "
                         "forward accepting `attention=`, got forward"
                         f"{inspect.signature(encoder.forward)}")
    if heads % encoder_tp:
        raise ValueError(f"{name}: {heads} attention heads are not divisible by the encoder's "
                         f"tensor-parallel degree {encoder_tp}: expected whole heads on "
                         "every TP rank")
    return heads // encoder_tp


def _accepts_attention(encoder: nn.Module) -> bool:
    try:
        params = inspect.signature(encoder.forward).parameters
    except (TypeError, ValueError):  # not introspectable (a C++ or wrapped forward): trust it
        return True
    return "attention" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD
                                        for p in params.values())


__all__ = ["splittable_heads"]
