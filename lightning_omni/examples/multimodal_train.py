"""LightningCLI entry point of the multimodal recipe.

    python -m lightning_omni.examples.multimodal_train fit \
        --config recipes/omni/multimodal_single.yaml
"""

from __future__ import annotations

from lightning.pytorch.cli import LightningCLI

from .multimodal_data import MultimodalCaptionData
from .multimodal_model import MultimodalCaptioner


def main(args: list[str] | None = None, run: bool = True) -> LightningCLI:
    return LightningCLI(MultimodalCaptioner, MultimodalCaptionData, args=args, run=run,
                        save_config_kwargs={"overwrite": True})


if __name__ == "__main__":
    main()
