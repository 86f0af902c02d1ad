"""OmniSpec for Hugging Face LLaVA-style models (``LlavaForConditionalGeneration``).

``transformers`` runs a LLaVA model as one ``forward``: the vision tower, the projector, the
embedding with image features scattered at the image tokens, the decoder layers (each given
the rotary position embeddings and causal mask the language model computes once), the final
norm and ``lm_head``. OmniStrategy needs those parts apart, each mapping a tensor to a tensor.
``llava_spec`` wraps the model's own submodules (no copies: the parameters are the model's)
so that the parts compute exactly what the model's ``forward`` computes.

Batch conventions (see ``lightning_omni.spec``):

- ``batch["tokens"]`` ``[B, T]`` input ids with ``config.image_token_id`` placeholders, one per
  image feature (``patches`` per image, the CLS token dropped under the "default" strategy);
- ``batch["pixel_patches"]`` ``[B, R, C * p * p]``: each sample's image cut into its ``P``
  patches (``patchify``), zero rows after them up to ``R >= P``;
  ``batch["pixel_patches_len"]`` ``[B]``: the image's placeholder tokens
  (``image_features_per_image``), 0 for a sample without an image. Patches, not
  ``[B, C, H, W]`` pixels, so that a sample's encoder input has rows like every other
  modality's (``R`` at least the feature count, which CLIP's CLS token can make ``P + 1``);
- ``batch["labels"]`` ``[B, T]``: Hugging Face's convention (the token at each position, -100
  where no loss), shifted by the loss as ``transformers`` shifts it.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..spec import Modality, OmniSpec, OmniSpecError

PATCHES = "pixel_patches"
PATCHES_LEN = "pixel_patches_len"


def patchify(pixels: Tensor, patch: int) -> Tensor:
    """``[N, C, H, W]`` images to ``[N, (H/p) * (W/p), C * p * p]`` patches, row-major."""
    n, c, h, w = pixels.shape
    if h % patch or w % patch:
        raise OmniSpecError(f"pixels: expected a height and width divisible by the patch size "
                            f"{patch}, got {h}x{w}")
    gh, gw = h // patch, w // patch
    x = pixels.reshape(n, c, gh, patch, gw, patch).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(n, gh * gw, c * patch * patch)


def unpatchify(patches: Tensor, channels: int, patch: int) -> Tensor:
    """The inverse of ``patchify`` for square images."""
    n, rows, _ = patches.shape
    side = math.isqrt(rows)
    if side * side != rows or patches.shape[2] != channels * patch * patch:
        raise OmniSpecError(
            f"{PATCHES}: expected [N, side*side, {channels}*{patch}*{patch}] patches of a square "
            f"image, got {tuple(patches.shape)}")
    x = patches.reshape(n, side, side, channels, patch, patch).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(n, channels, side * patch, side * patch)


def pixels_from_patches(patches: Tensor, vision_config: Any, dtype: torch.dtype) -> Tensor:
    """A batch's ``[N, R, C*p*p]`` patch rows back to the ``[N, C, size, size]`` pixels the
    tower takes: its first ``(size // p) ** 2`` rows, and zeros right and below where ``size``
    is not a multiple of ``p`` (pixels the patch convolution never reads)."""
    v = vision_config
    side = v.image_size // v.patch_size
    pixels = unpatchify(patches[:, : side * side].to(dtype), v.num_channels, v.patch_size)
    extra = v.image_size - side * v.patch_size
    return F.pad(pixels, (0, extra, 0, extra)) if extra else pixels


class LlavaImageEncoder(nn.Module):
    """The vision tower and projector: image patches to LLM-width features, as
    ``LlavaModel.get_image_features`` computes them (feature layer, CLS dropped or not)."""

    def __init__(self, vision_tower: nn.Module, projector: nn.Module, feature_layer: int | list,
                 select_strategy: str, vision_config: Any) -> None:
        super().__init__()
        if select_strategy not in ("default", "full"):
            raise OmniSpecError(f"vision_feature_select_strategy: expected 'default' or 'full', "
                                f"got {select_strategy!r}")
        self.vision_tower, self.projector = vision_tower, projector
        self.feature_layer, self.select_strategy = feature_layer, select_strategy
        self.vision_config = vision_config

    def features(self, pixels: Tensor) -> Tensor:
        """``[N, C, H, W]`` pixels to ``[N, features, hidden]``."""
        states = self.vision_tower(pixels, output_hidden_states=True, return_dict=True
                                   ).hidden_states
        layers = [self.feature_layer] if isinstance(self.feature_layer, int) \
            else list(self.feature_layer)
        chosen = [states[i][:, 1:] if self.select_strategy == "default" else states[i]
                  for i in layers]
        return self.projector(torch.cat(chosen, dim=-1))

    def forward(self, patches: Tensor, lengths: Tensor) -> Tensor:
        dtype = next(self.vision_tower.parameters()).dtype
        return self.features(pixels_from_patches(patches, self.vision_config, dtype))


class LlavaDecoderLayer(nn.Module):
    """One decoder layer with what the language model's ``forward`` hands every layer: the
    positions, their rotary embeddings and the causal mask of the layer's attention type."""

    def __init__(self, layer: nn.Module, rotary: nn.Module, config: Any) -> None:
        super().__init__()
        self.layer, self.config = layer, config
        # shared by every layer and without parameters; kept out of the module tree so that
        # each stage computes the embeddings without owning (or freeing) the buffers
        self._rotary = (rotary,)
        index = getattr(getattr(layer, "self_attn", None), "layer_idx", None)
        types = getattr(config, "layer_types", None)
        self.attention_type = types[index] if types and index is not None else "full_attention"
        from transformers import masking_utils

        self._make_mask = (masking_utils.create_sliding_window_causal_mask
                           if self.attention_type == "sliding_attention"
                           else masking_utils.create_causal_mask)

    def forward(self, h: Tensor) -> Tensor:
        positions = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
        # (a meta run, which sizes the pipeline's messages, cannot look for packed sequences)
        mask = self._make_mask(config=self.config, inputs_embeds=h, attention_mask=None,
                               cache=None, position_ids=None if h.is_meta else positions)
        rotary = self._rotary[0]
        return self.layer(h, attention_mask=mask, position_ids=positions,
                          position_embeddings=rotary(h, positions))


class LlavaHead(nn.Module):
    """The language model's final norm and ``lm_head``."""

    def __init__(self, norm: nn.Module, lm_head: nn.Module) -> None:
        super().__init__()
        self.norm, self.lm_head = norm, lm_head

    def forward(self, h: Tensor) -> Tensor:
        return self.lm_head(self.norm(h))


def causal_lm_loss(logits: Tensor, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """(summed next-token cross-entropy, labelled positions): ``transformers``' causal-LM loss
    (labels shifted by one, logits in float32 or wider) as a sum and a count."""
    labels = F.pad(batch["labels"], (0, 1), value=-100)[:, 1:].to(logits.device)
    wide = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    total = F.cross_entropy(wide.reshape(-1, wide.shape[-1]), labels.reshape(-1),
                            ignore_index=-100, reduction="sum")
    return total, (labels != -100).sum()


def llava_spec(model: nn.Module, **spec_kwargs: Any) -> OmniSpec:
    """The OmniSpec of a ``LlavaForConditionalGeneration`` (built, or on the meta device).

    One image per sample, at the tower's ``image_size``. A tied ``lm_head`` (one Parameter
    with the embedding) is a parameter shared by the first and last stage, which OmniStrategy
    keeps in step. ``spec_kwargs`` go to ``OmniSpec`` (e.g. ``metrics``)."""
    try:
        inner, lm_head = model.model, model.lm_head
        vision, projector = inner.vision_tower, inner.multi_modal_projector
        language = inner.language_model
    except AttributeError as err:
        raise OmniSpecError(f"model: expected a transformers LlavaForConditionalGeneration "
                            f"(.model.vision_tower, .model.multi_modal_projector, "
                            f".model.language_model, .lm_head), got {type(model).__name__} "
                            f"({err})") from err
    config = model.config
    encoder = LlavaImageEncoder(vision, projector, config.vision_feature_layer,
                                config.vision_feature_select_strategy, config.vision_config)
    text = language.config
    blocks = [LlavaDecoderLayer(layer, language.rotary_emb, text)
              for layer in language.layers[: text.num_hidden_layers]]
    if "tp_plan" not in spec_kwargs:
        try:
            spec_kwargs["tp_plan"] = llava_tp_plan(config, vision)
        except OmniSpecError as err:  # fine without TP; OmniStrategy refuses TP with the reason
            spec_kwargs["tp_plan"] = None
            spec_kwargs["extra"] = {**spec_kwargs.get("extra", {}), "tp_plan_error": str(err)}
    return OmniSpec(
        modalities=[Modality("image", encoder, PATCHES, PATCHES_LEN, config.image_token_id)],
        embedding=language.embed_tokens, blocks=blocks,
        head=LlavaHead(language.norm, lm_head), loss=causal_lm_loss, **spec_kwargs)


# transformers' TP style names -> torch styles (the ones its decoder plans use for dense layers)
_HF_STYLES = ("colwise", "rowwise")
_DECODER_PREFIX = "layers.*."
TOWERS = ("siglip_vision_model", "clip_vision_model")


def llava_tp_plan(config: Any, vision_tower: nn.Module) -> dict[str, dict[str, Any]]:
    """``OmniSpec.tp_plan`` of ``llava_spec``'s parts.

    Decoder layers: the text config's own ``base_model_tp_plan`` (its ``layers.*.`` entries,
    ``"colwise"`` / ``"rowwise"`` as torch's column- and row-parallel styles; transformers'
    Llama and Qwen2 attention count heads from the tensor, so a shard of whole heads runs
    unchanged). Vision tower (SigLIP, CLIP): q/k/v and fc1 column-, out_proj and fc2
    row-parallel; the projector likewise; patch and position embeddings, norms replicated.
    Token embedding vocabulary-parallel, ``lm_head`` with vocabulary-sharded logits.
    Raises ``OmniSpecError`` for a plan entry it does not translate."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    text = config.text_config
    hf_plan = dict(getattr(text, "base_model_tp_plan", None) or {})
    if not hf_plan:
        raise OmniSpecError(f"text_config: expected a base_model_tp_plan (transformers' TP "
                            f"plan of {type(text).__name__}), got none")
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    block: dict[str, Any] = {}
    for key, name in hf_plan.items():
        if not key.startswith(_DECODER_PREFIX) or name not in _HF_STYLES:
            raise OmniSpecError(
                f"{type(text).__name__}.base_model_tp_plan[{key!r}]: expected a decoder-layer "
                f"entry ({_DECODER_PREFIX!r}...) with a style among {list(_HF_STYLES)}, got "
                f"{name!r}")
        block["layer." + key[len(_DECODER_PREFIX):]] = styles[name]()
    tower = config.vision_config.model_type
    if tower not in TOWERS:
        raise OmniSpecError(f"vision_config.model_type: expected one of {list(TOWERS)} for a "
                            f"TP plan, got {tower!r}")
    inner = "vision_model." if hasattr(vision_tower, "vision_model") else ""
    layers = f"vision_tower.{inner}encoder.layers.*."
    encoder = {**{f"{layers}self_attn.{p}_proj": ColwiseParallel() for p in "qkv"},
               f"{layers}self_attn.out_proj": RowwiseParallel(),
               f"{layers}mlp.fc1": ColwiseParallel(), f"{layers}mlp.fc2": RowwiseParallel(),
               "projector.linear_1": ColwiseParallel(), "projector.linear_2": RowwiseParallel()}
    return {"embedding": {"": RowwiseParallel(input_layouts=Replicate())},
            "blocks": block,
            "head": {"lm_head": ColwiseParallel(output_layouts=Shard(-1),
                                                use_local_output=False)},
            "image": encoder}


def image_tokens(image_size: int, patch_size: int, has_cls: bool, select_strategy: str) -> int:
    """Placeholder tokens per image: the tower's outputs (its patches, plus a CLS token if it
    has one), less the first under the "default" strategy (as ``transformers`` drops it)."""
    return (image_size // patch_size) ** 2 + has_cls - (select_strategy == "default")


def image_features_per_image(config: Any) -> int:
    """``image_tokens`` of a ``LlavaConfig`` (CLIP's tower has a CLS token, SigLIP's none)."""
    v = config.vision_config
    return image_tokens(v.image_size, v.patch_size, v.model_type == "clip_vision_model",
                        config.vision_feature_select_strategy)
