"""MegaScale-Omni for Lightning: plans for encoder-LLM multiplexing, and their runtime."""

from .spec import Modality, OmniSpec, OmniSpecError
from .strategy import OmniStrategy


def _register() -> None:
    """Make ``Trainer(strategy="omni")`` work once the package is imported."""
    from lightning.pytorch.strategies import StrategyRegistry

    if "omni" not in StrategyRegistry:
        OmniStrategy.register_strategies(StrategyRegistry)


_register()

__all__ = ["Modality", "OmniSpec", "OmniSpecError", "OmniStrategy", "plan"]
