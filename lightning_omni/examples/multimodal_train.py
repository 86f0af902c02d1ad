"""LightningCLI entry point of the multimodal recipe.

    python -m lightning_omni.examples.multimodal_train fit \
        --config recipes/omni/multimodal_single.yaml

From the command line, a bad argument ends in one line naming its flag and exit code 2
(:mod:`lightning_omnilab.cli_errors`); called with ``args``, a constructor's exception
propagates to the caller.
"""

from __future__ import annotations

from lightning.pytorch.cli import LightningCLI

from lightning_omnilab.cli_errors import OneLineErrorsCLI

from .multimodal_data import MultimodalCaptionData
from .multimodal_model import MultimodalCaptioner


def main(args: list[str] | None = None, run: bool = True) -> LightningCLI:
    return OneLineErrorsCLI(MultimodalCaptioner, MultimodalCaptionData, args=args, run=run,
                            save_config_kwargs={"overwrite": True},
                            exit_on_argument_error=args is None)


if __name__ == "__main__":
    main()
