"""A LLaVA-style captioner built from ``transformers``: a SigLIP or CLIP vision tower, LLaVA's
MLP projector and Llama or Qwen2 decoder layers, written for one device.

The model is Hugging Face's ``LlavaForConditionalGeneration``, built in ``configure_model`` so
that OmniStrategy can build it on the meta device and each rank materializes only what it
hosts. ``training_step`` runs the model's own ``forward``; ``configure_omni`` is the adapter
(``lightning_omni.integrations.hf_llava``) and the only Omni addition.
"""

from __future__ import annotations

import inspect
from typing import Literal

import torch
from lightning.pytorch import LightningModule
from torch import Tensor

from ..integrations.hf_llava import (
    PATCHES,
    PATCHES_LEN,
    causal_lm_loss,
    image_features_per_image,
    llava_spec,
    pixels_from_patches,
)
from .multimodal_data import IMG, PAD, VOCAB
from .multimodal_model import METRICS


def llava_config(vision: Literal["siglip", "clip"] = "siglip",
                 text: Literal["llama", "qwen2"] = "llama", image_size: int = 32,
                 patch_size: int = 8, vision_hidden: int = 32, vision_layers: int = 2,
                 vision_heads: int = 2, vision_intermediate: int = 64, hidden: int = 64,
                 layers: int = 4, heads: int = 4, kv_heads: int = 2, intermediate: int = 128,
                 vocab: int = 64, feature_layer: int = -1,
                 feature_strategy: Literal["default", "full"] = "full",
                 tie_embeddings: bool = False, attention: str = "sdpa") -> object:
    """A ``LlavaConfig`` from the sizes that matter; the image token is ``IMG``."""
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        Qwen2Config,
        SiglipVisionConfig,
    )

    if vocab < VOCAB:
        raise ValueError(f"vocab: expected at least {VOCAB} (the data's vocabulary), got {vocab}")
    towers = {"siglip": SiglipVisionConfig, "clip": CLIPVisionConfig}
    decoders = {"llama": LlamaConfig, "qwen2": Qwen2Config}
    for name, value, allowed in (("vision", vision, towers), ("text", text, decoders)):
        if value not in allowed:
            raise ValueError(f"{name}: expected one of {sorted(allowed)}, got {value!r}")
    tower = dict(image_size=image_size, patch_size=patch_size, hidden_size=vision_hidden,
                 num_hidden_layers=vision_layers, num_attention_heads=vision_heads,
                 intermediate_size=vision_intermediate)
    if vision == "siglip":
        tower["vision_use_head"] = False  # LLaVA reads hidden states, never the pooled head
    decoder = decoders[text](
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads,
        intermediate_size=intermediate, max_position_embeddings=4096, pad_token_id=PAD,
        tie_word_embeddings=tie_embeddings)
    config = LlavaConfig(vision_config=towers[vision](**tower), text_config=decoder,
                         image_token_id=IMG, vision_feature_layer=feature_layer,
                         vision_feature_select_strategy=feature_strategy,
                         tie_word_embeddings=tie_embeddings)
    config.image_seq_length = image_features_per_image(config)
    config._attn_implementation = attention
    config.text_config._attn_implementation = attention
    config.vision_config._attn_implementation = attention
    return config


def _shifted(terms):
    """A metric of labels at their own position, applied to HF-convention (unshifted) labels."""
    def shifted(logits: Tensor, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        labels = torch.nn.functional.pad(batch["labels"], (0, 1), value=-100)[:, 1:]
        return terms(logits, {**batch, "labels": labels})
    return shifted


_CONFIG_FIELDS = tuple(inspect.signature(llava_config).parameters)
# METRICS read labels at their own position; HF's labels are one position later
HF_METRICS = {name: _shifted(terms) for name, terms in METRICS.items()}


class LlavaCaptioner(LightningModule):
    """Captions generated shapes and continues counts with a Hugging Face LLaVA model."""

    def __init__(self, vision: Literal["siglip", "clip"] = "siglip",
                 text: Literal["llama", "qwen2"] = "llama", image_size: int = 32,
                 patch_size: int = 8, vision_hidden: int = 32, vision_layers: int = 2,
                 vision_heads: int = 2, vision_intermediate: int = 64, hidden: int = 64,
                 layers: int = 4, heads: int = 4, kv_heads: int = 2, intermediate: int = 128,
                 vocab: int = 64, feature_layer: int = -1,
                 feature_strategy: Literal["default", "full"] = "full",
                 tie_embeddings: bool = False, attention: str = "sdpa", lr: float = 1e-3,
                 weight_decay: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.lr, self.weight_decay = lr, weight_decay
        self.config = llava_config(**{k: self.hparams[k] for k in _CONFIG_FIELDS})
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

    def _step(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        logits = self(batch)
        out = {}
        for name, terms in (("loss", causal_lm_loss), *HF_METRICS.items()):
            total, count = terms(logits, batch)
            out[name] = total / count  # NaN for a metric without tokens in the batch
        return out

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        return self._step(batch)

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        return self._step(batch)

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self._log("train", outputs, batch)

    def on_validation_batch_end(self, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._log("val", outputs, batch)

    def _log(self, prefix: str, outputs: dict[str, Tensor], batch: dict[str, Tensor]) -> None:
        bs = batch["tokens"].shape[0]
        self.log(f"{prefix}/loss", outputs["loss"], prog_bar=True, batch_size=bs)
        for name in METRICS:
            if name in outputs and not torch.isnan(outputs[name]):
                self.log(f"{prefix}/{name}", outputs[name], batch_size=bs)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)

    def configure_omni(self):
        return llava_spec(self.model, metrics=HF_METRICS)

