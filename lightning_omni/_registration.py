"""``Trainer(strategy="omni")`` without importing Lightning at ``import lightning_omni``.

Lightning 2.x offers no entry point for strategies (only for callbacks), so the name has to be put
into ``lightning.pytorch.strategies.StrategyRegistry`` from our side. Doing that eagerly would load
torch and Lightning for every ``import lightning_omni.plan``, which must stay pure. So: if
Lightning's strategy registry is already loaded, register now; otherwise a one-shot import hook
registers right after Lightning loads it. Either way the registered factory imports
``OmniStrategy`` only when a Trainer asks for ``"omni"``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

NAME = "omni"
DESCRIPTION = "MegaScale-Omni encoder-LLM multiplexing with a pipelined step"
_REGISTRY_MODULE = "lightning.pytorch.strategies"


def build_omni_strategy(**init_params: Any) -> Any:
    """What the registry calls for ``strategy="omni"``: an ``OmniStrategy`` with its defaults."""
    from .strategy import OmniStrategy

    return OmniStrategy(**init_params)


def register(registry: Any) -> None:
    """Register ``"omni"`` in a Lightning ``StrategyRegistry`` unless something already did."""
    if NAME not in registry:
        registry.register(NAME, build_omni_strategy, description=DESCRIPTION)


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of Lightning's strategies module so that ``register``
    runs once that module has executed (so ``StrategyRegistry`` exists and no import cycles)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != _REGISTRY_MODULE:
            return None
        _remove_hook()
        for finder in sys.meta_path:
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") \
                else None
            if spec is not None and spec.loader is not None and \
                    hasattr(spec.loader, "exec_module"):
                _run_after(spec.loader, lambda module: register(module.StrategyRegistry))
                return spec
        return None


def _run_after(loader: importlib.abc.Loader, then: Any) -> None:
    exec_module = loader.exec_module

    def exec_then(module: ModuleType) -> None:
        exec_module(module)
        then(module)

    loader.exec_module = exec_then  # type: ignore[method-assign]


def _remove_hook() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _RegisterAfterImport)]


def register_when_lightning_loads() -> None:
    """Make ``"omni"`` a Trainer strategy name now or as soon as Lightning's registry loads."""
    loaded = sys.modules.get(_REGISTRY_MODULE)
    if loaded is not None and hasattr(loaded, "StrategyRegistry"):
        register(loaded.StrategyRegistry)
    elif not any(isinstance(f, _RegisterAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())
