"""A LLaVA-style captioner built from ``transformers``: a SigLIP or CLIP vision tower, LLaVA's
MLP projector and Llama or Qwen2 decoder layers, written for one device.

The model is Hugging Face's ``LlavaForConditionalGeneration``, built in ``configure_model`` so
that OmniStrategy can build it on the meta device and each rank materializes only what it
hosts. ``training_step`` runs the model's own ``forward``; ``configure_omni`` is the adapter
(``lightning_omni.integrations.hf_llava``) and the only Omni addition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from lightning_omnilab.validate import one_of

from ..integrations.hf_llava import (
    PATCHES,
    PATCHES_LEN,
    causal_lm_loss,
    image_features_per_image,
    llava_spec,
    pixels_from_patches,
)
from .multimodal_data import IMG, PAD, VOCAB
from .multimodal_model import METRICS, CaptionSteps


@dataclass(frozen=True)
class LlavaShape:
    """The sizes that matter of a LLaVA model; ``llava_config`` builds its ``LlavaConfig``."""

    vision: Literal["siglip", "clip"] = "siglip"
    text: Literal["llama", "qwen2"] = "llama"
    image_size: int = 32
    patch_size: int = 8
    vision_hidden: int = 32
    vision_layers: int = 2
    vision_heads: int = 2
    vision_intermediate: int = 64
    hidden: int = 64
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    vocab: int = 64
    feature_layer: int | list[int] = -1
    feature_strategy: Literal["default", "full"] = "full"
    tie_embeddings: bool = False
    attention: str = "sdpa"


def llava_config(shape: LlavaShape) -> object:
    """A ``LlavaConfig`` of ``shape``; the image token is ``IMG``."""
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        Qwen2Config,
        SiglipVisionConfig,
    )

    if shape.vocab < VOCAB:
        raise ValueError(f"vocab: expected at least {VOCAB} (the data's vocabulary), got "
                         f"{shape.vocab}")
    towers = {"siglip": SiglipVisionConfig, "clip": CLIPVisionConfig}
    decoders = {"llama": LlamaConfig, "qwen2": Qwen2Config}
    for name, allowed in (("vision", towers), ("text", decoders)):
        one_of(name, getattr(shape, name), sorted(allowed))
    tower = dict(image_size=shape.image_size, patch_size=shape.patch_size,
                 hidden_size=shape.vision_hidden, num_hidden_layers=shape.vision_layers,
                 num_attention_heads=shape.vision_heads,
                 intermediate_size=shape.vision_intermediate)
    if shape.vision == "siglip":
        tower["vision_use_head"] = False  # LLaVA reads hidden states, never the pooled head
    decoder = decoders[shape.text](
        vocab_size=shape.vocab, hidden_size=shape.hidden, num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        intermediate_size=shape.intermediate, max_position_embeddings=4096, pad_token_id=PAD,
        tie_word_embeddings=shape.tie_embeddings)
    config = LlavaConfig(vision_config=towers[shape.vision](**tower), text_config=decoder,
                         image_token_id=IMG, vision_feature_layer=shape.feature_layer,
                         vision_feature_select_strategy=shape.feature_strategy,
                         tie_word_embeddings=shape.tie_embeddings)
    config.image_seq_length = image_features_per_image(config)
    for c in (config, config.text_config, config.vision_config):
        c._attn_implementation = shape.attention
    return config


def _shifted(terms):
    """A metric of labels at their own position, applied to HF-convention (unshifted) labels."""
    def shifted(logits: Tensor, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        labels = torch.nn.functional.pad(batch["labels"], (0, 1), value=-100)[:, 1:]
        return terms(logits, {**batch, "labels": labels})
    return shifted


# METRICS read labels at their own position; HF's labels are one position later
HF_METRICS = {name: _shifted(terms) for name, terms in METRICS.items()}


class LlavaCaptioner(CaptionSteps):
    """Captions generated shapes and continues counts with a Hugging Face LLaVA model."""

    step_terms = (("loss", causal_lm_loss), *HF_METRICS.items())

    def __init__(self, shape: LlavaShape = LlavaShape(), lr: float = 1e-3,
                 weight_decay: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.shape, self.lr, self.weight_decay = shape, lr, weight_decay
        self.config = llava_config(shape)
        self.model = None

    @property
    def image_tokens(self) -> int:
        return self.config.image_seq_length

    def configure_model(self) -> None:
        """Builds the model where Lightning asks for it: under OmniStrategy on the meta device,
        each rank then materializing only its part. ``transformers`` skips its weight init on
        the meta device (it expects a checkpoint to follow), so the init runs explicitly after
        the build, on any device: the same draws in the same order everywhere."""
        if self.model is None:
            from transformers import LlavaForConditionalGeneration
            from transformers.initialization import no_init_weights

            with no_init_weights():
                model = LlavaForConditionalGeneration(self.config)
            model.initialize_weights()
            model.tie_weights()
            self.model = model

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        """The logits of the model's own ``forward`` (images of the samples that have one)."""
        has = batch[PATCHES_LEN] > 0
        pixels = None
        if bool(has.any()):
            dtype = next(self.model.model.vision_tower.parameters()).dtype
            pixels = pixels_from_patches(batch[PATCHES][has], self.config.vision_config, dtype)
        return self.model(input_ids=batch["tokens"], pixel_values=pixels).logits

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)

    def configure_omni(self):
        return llava_spec(self.model, metrics=HF_METRICS)

