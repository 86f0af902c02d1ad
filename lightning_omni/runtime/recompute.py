"""Activation recomputation of LLM blocks and encoder layers, with torch's own checkpoint.

Each checkpointed call keeps only its inputs for backward and runs its forward again when
backward needs the rest (``torch.utils.checkpoint.checkpoint``, non-reentrant, RNG state
preserved, so dropout draws the same masks again). The user's modules stay as they are: while
a forward action runs, ``checkpointed`` gives each chosen module an instance ``forward`` that
routes its original one through ``checkpoint`` and takes it away on exit, so the call sites
(the executor's block loop, an encoder's own layer loop) and the module's class, parameters,
hooks and state dict are untouched. A module's hooks run once, around the first forward; the
recomputation replays the original ``forward`` only.

Which encoder calls are checkpointed (``encoder_layers``): the encoder's own layer list when it
exposes one (``encoder.blocks``, e.g. ``TokenEncoder``; ``encoder.layers``; else the first
nested ``*.encoder.layers`` / ``*.encoder.layer``, e.g. a Hugging Face CLIP/SigLIP/ViT tower
inside a projector wrapper), one checkpoint per layer; otherwise the whole encoder call.

What the saved-tensor meter (``runtime/memory.py``) counts under recomputation: checkpoint
saves each call's inputs with a saved-tensor op entered before its own hooks, so the meter sees
them (one count per storage); the tensors of the checkpointed region itself go through
checkpoint's hooks, not the meter's, and are not kept. ``peak_saved_bytes`` is then what stays
alive from forward to backward, as without recomputation; the one call rebuilt at a time
during backward is a transient the meter does not count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import partial
from typing import Any

from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["checkpointed", "encoder_layers"]

_OWN_LISTS = ("blocks", "layers")
_NESTED_LISTS = (".encoder.layers", ".encoder.layer")


def encoder_layers(encoder: nn.Module) -> list[nn.Module] | None:
    """The layers of ``encoder`` to checkpoint one at a time, or None: the whole call (see
    the module docstring for the rule)."""
    for name in _OWN_LISTS:
        found = getattr(encoder, name, None)
        if isinstance(found, nn.ModuleList) and len(found):
            return list(found)
    for name, mod in encoder.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) and (
                f".{name}".endswith(_NESTED_LISTS)):
            return list(mod)
    return None


def _run(forward: Callable, recompute_context: Callable[[], AbstractContextManager],
         *args: Any, **kwargs: Any) -> Any:
    return checkpoint(forward, *args, use_reentrant=False, preserve_rng_state=True,
                      context_fn=lambda: (nullcontext(), recompute_context()), **kwargs)


@contextmanager
def checkpointed(modules: Sequence[nn.Module],
                 recompute_context: Callable[[], AbstractContextManager] = nullcontext
                 ) -> Iterator[None]:
    """Inside: every call of one of ``modules`` is checkpointed. ``recompute_context``: entered
    around each recomputation (the forward's precision context: a default dtype or autocast,
    which backward runs outside of)."""
    replaced: list[tuple[nn.Module, object]] = []
    try:
        for mod in modules:
            if any(mod is m for m, _ in replaced):
                continue  # the same module twice in a list
            own = mod.__dict__.get("forward")  # an instance forward a user set, if any
            replaced.append((mod, own))
            mod.forward = partial(_run, mod.forward, recompute_context)
        yield
    finally:
        for mod, own in reversed(replaced):
            if own is None:
                del mod.forward
            else:
                mod.forward = own
