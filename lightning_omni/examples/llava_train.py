"""LightningCLI entry point of the Hugging Face LLaVA recipe.

    python -m lightning_omni.examples.llava_train fit --config recipes/omni/llava_tiny.yaml

The data's image geometry follows the model's (``--model.shape.image_size`` and friends), so a
changed tower never meets images of the wrong size. From the command line, a bad argument ends
in one line naming its flag and exit code 2 (:mod:`lightning_omnilab.cli_errors`); called with
``args``, a constructor's exception propagates to the caller.
"""

from __future__ import annotations

from lightning.pytorch.cli import LightningCLI

from lightning_omnilab.cli_errors import OneLineErrorsCLI

from ..integrations.hf_llava import image_tokens
from .llava_data import LlavaCaptionData
from .llava_model import LlavaCaptioner


def _image_tokens(vision: str, image_size: int, patch_size: int, strategy: str) -> int:
    return image_tokens(image_size, patch_size, vision == "clip", strategy)


class LlavaCLI(OneLineErrorsCLI):
    """The recipe's CLI: the data's image geometry linked to the model's tower."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("model.shape.image_size", "data.image_size")
        parser.link_arguments("model.shape.patch_size", "data.patch_size")
        parser.link_arguments(("model.shape.vision", "model.shape.image_size",
                               "model.shape.patch_size", "model.shape.feature_strategy"),
                              "data.image_tokens", compute_fn=_image_tokens)


def main(args: list[str] | None = None, run: bool = True) -> LightningCLI:
    return LlavaCLI(LlavaCaptioner, LlavaCaptionData, args=args, run=run,
                    save_config_kwargs={"overwrite": True}, exit_on_argument_error=args is None)


if __name__ == "__main__":
    main()
