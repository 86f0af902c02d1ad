"""Captioning and counting for a LLaVA-style model, in the batch layout of ``hf_llava``.

Image samples: a coloured shape (``multimodal_data.draw_shape``) at the vision tower's
resolution, captioned "<colour> <shape> <size>"; text samples count upwards. Token ids are
the small vocabulary of ``multimodal_data`` (any model vocabulary at least that large fits);
the image's placeholder id is ``IMG``.
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from ..integrations.hf_llava import PATCHES, PATCHES_LEN, patchify
from .multimodal_data import BOS, EOS, IMG, PAD, WORD_ID, draw_shape, make_text

MAX_WORDS = 8  # make_text's longest sample


class LlavaCaptionDataset(Dataset):
    """``length`` deterministic samples; ``image_fraction`` of them with an image."""

    def __init__(self, length: int, image_size: int, patch_size: int, image_tokens: int,
                 image_fraction: float = 0.7, seed: int = 0) -> None:
        if not 0.0 <= image_fraction <= 1.0:
            raise ValueError(f"image_fraction: expected a fraction in [0, 1], got "
                             f"{image_fraction}")
        patches = (image_size // patch_size) ** 2
        if patches < 1 or image_tokens < 1 or image_tokens > patches + 1:
            raise ValueError(f"image_size, patch_size, image_tokens: expected at least one "
                             f"patch and 1 to {patches + 1} tokens per image, got "
                             f"{image_size}, {patch_size}, {image_tokens}")
        self.length, self.seed, self.fraction = length, seed, image_fraction
        # the tower's patch convolution ignores pixels past the last whole patch (SigLIP at
        # 384 px, patch 14: 27 x 27 patches of the first 378 rows and columns)
        self.size = image_size // patch_size * patch_size
        self.patch, self.image_tokens = patch_size, image_tokens
        self.rows = max(patches, image_tokens)
        self.seq_len = image_tokens + 1 + MAX_WORDS + 1

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        rows = torch.zeros(self.rows, 3 * self.patch * self.patch)
        has_image = float(torch.rand(1, generator=g)) < self.fraction
        if has_image:
            image, words = draw_shape(g, self.size)
            patches = patchify(image[None], self.patch)[0]
            rows[: patches.shape[0]] = patches
            head = [IMG] * self.image_tokens + [BOS]
        else:
            words = make_text(g)
            head = [BOS]
        ids = head + [WORD_ID[w] for w in words] + [EOS]
        tokens = torch.full((self.seq_len,), PAD, dtype=torch.long)
        tokens[: len(ids)] = torch.tensor(ids)
        # transformers' convention: labels at the positions of the tokens to predict (the loss
        # shifts them): a caption's words and EOS; a count's numbers after the first, and EOS
        start = len(head) + (not has_image)
        labels = torch.full((self.seq_len,), -100, dtype=torch.long)
        labels[start:len(ids)] = tokens[start:len(ids)]
        return {"tokens": tokens, "labels": labels, PATCHES: rows,
                PATCHES_LEN: torch.tensor(self.image_tokens if has_image else 0),
                "is_caption": torch.tensor(has_image)}


class LlavaCaptionData(pl.LightningDataModule):
    """Training and validation sets of ``LlavaCaptionDataset``; ``batch_size`` per replica."""

    def __init__(self, image_size: int = 32, patch_size: int = 8, image_tokens: int = 16,
                 batch_size: int = 8, samples_per_epoch: int = 256, val_samples: int = 64,
                 image_fraction: float = 0.7, seed: int = 0) -> None:
        super().__init__()
        self.batch_size = batch_size
        shape = (image_size, patch_size, image_tokens, image_fraction)
        self.train_set = LlavaCaptionDataset(samples_per_epoch, *shape, seed=seed)
        self.val_set = LlavaCaptionDataset(val_samples, *shape, seed=seed + 1)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=False)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size)

