"""MegaScale-Omni for Lightning: plans for encoder-LLM multiplexing, and their runtime.

The package face imports nothing heavy: ``lightning_omni.plan`` and ``omni-plan`` are pure and
must not pay for torch and Lightning. ``OmniStrategy``, ``ParallelDims``, ``OmniSpec``,
``Modality`` and ``OmniSpecError`` load on first use, and ``Trainer(strategy="omni")`` works
once the package is imported (``_registration``), whether Lightning was imported before or
after it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._registration import register_when_lightning_loads

if TYPE_CHECKING:  # what the lazy names are, for type checkers and IDEs
    from .runtime.parallel_dims import ParallelDims
    from .spec import Modality, OmniSpec, OmniSpecError
    from .strategy import OmniStrategy

# name -> submodule that defines it; imported on first attribute access (PEP 562)
_LAZY = {"Modality": "spec", "OmniSpec": "spec", "OmniSpecError": "spec",
         "OmniStrategy": "strategy", "ParallelDims": "runtime.parallel_dims"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value  # the next access is a plain attribute
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


register_when_lightning_loads()

__all__ = ["Modality", "OmniSpec", "OmniSpecError", "OmniStrategy", "ParallelDims", "plan"]
