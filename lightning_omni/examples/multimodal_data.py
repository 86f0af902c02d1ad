"""A generated captioning task with images, audio and text whose mix changes between stages.

* image samples: a coloured shape on a noisy background at a random resolution (8 to 32 pixels a
  side, so 4 to 64 patches of 4x4); caption "<colour> <shape> <size>";
* audio samples: a tone of one of three pitches, steady, pulsed or rising, lasting 4 to 96
  frames of 16 samples (a heavy tail of long ones); caption "<pitch> <pattern>";
* text samples: count upwards from a random number, "7 8 9 10 ...".

Encoder rows carry their own positions (normalised row and column of a patch, time of a frame),
so an encoder chunk needs nothing but its rows. The stage schedule sets the image:text:audio
ratio per epoch (``ModalityCurriculum`` moves it), which moves the load between encoders and LLM
the way the training stages of a real multimodal model do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import lightning.pytorch as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from lightning_omnilab.validate import positive_int

PAD, IMG, AUD, BOS, SEP, EOS = range(6)
COLOURS = ["red", "green", "blue", "yellow"]
SHAPES = ["square", "disc", "cross", "ring"]
SIZES = ["small", "large"]
PITCHES = ["low", "mid", "high"]
PATTERNS = ["steady", "pulsed", "rising"]
NUMBERS = [str(i) for i in range(24)]
WORDS = COLOURS + SHAPES + SIZES + PITCHES + PATTERNS + NUMBERS
VOCAB = 6 + len(WORDS)
WORD_ID = {w: 6 + i for i, w in enumerate(WORDS)}
PATCH, FRAME = 4, 16
IMAGE_DIM = PATCH * PATCH * 3 + 2     # pixels + (row, col)
AUDIO_DIM = FRAME + FRAME // 2 + 1 + 1  # samples + spectrum magnitudes + time
RESOLUTIONS = (8, 12, 16, 20, 24, 32)
MAX_FRAMES = 96
SEQ_LEN = MAX_FRAMES + 8
RGB = torch.tensor([[0.9, 0.1, 0.1], [0.1, 0.8, 0.2], [0.15, 0.25, 0.95], [0.95, 0.9, 0.1]])
MODALITIES = ("image", "text", "audio")


def draw_shape(g: torch.Generator, res: int) -> tuple[Tensor, list[str]]:
    """A ``[3, res, res]`` image of a coloured shape on a noisy background, and its caption."""
    colour, shape, size = (int(torch.randint(n, (1,), generator=g))
                           for n in (len(COLOURS), len(SHAPES), len(SIZES)))
    ax = (torch.arange(res) + 0.5) / res * 2 - 1
    y, x = torch.meshgrid(ax, ax, indexing="ij")
    cy, cx = (torch.rand(2, generator=g) - 0.5) * 0.4
    y, x = y - cy, x - cx
    r = 0.35 if size == 0 else 0.7
    mask = [
        (x.abs() < r) & (y.abs() < r),
        x**2 + y**2 < r**2,
        ((x.abs() < r / 3) | (y.abs() < r / 3)) & (x.abs() < r) & (y.abs() < r),
        (x**2 + y**2 < r**2) & (x**2 + y**2 > (0.6 * r) ** 2),
    ][shape]
    img = 0.1 * torch.rand(3, res, res, generator=g)
    img = torch.where(mask, RGB[colour][:, None, None].expand(3, res, res), img)
    return img, [COLOURS[colour], SHAPES[shape], SIZES[size]]


def make_image(g: torch.Generator) -> tuple[Tensor, list[str]]:
    """Patch rows ``[patches, IMAGE_DIM]`` of a generated image, and its caption."""
    res = RESOLUTIONS[int(torch.randint(len(RESOLUTIONS), (1,), generator=g))]
    img, words = draw_shape(g, res)
    n = res // PATCH
    patches = img.reshape(3, n, PATCH, n, PATCH).permute(1, 3, 0, 2, 4).reshape(n * n, -1)
    rows = torch.arange(n).repeat_interleave(n).float() / n
    cols = torch.arange(n).repeat(n).float() / n
    feats = torch.cat([patches, rows[:, None], cols[:, None]], dim=1)
    return feats, words


def make_audio(g: torch.Generator) -> tuple[Tensor, list[str]]:
    """Frame rows ``[frames, AUDIO_DIM]`` of a generated tone, and its caption."""
    u = float(torch.rand(1, generator=g))
    frames = int(4 + (MAX_FRAMES - 4) * u**3)  # heavy tail: most short, a few very long
    pitch, pattern = (int(torch.randint(n, (1,), generator=g))
                      for n in (len(PITCHES), len(PATTERNS)))
    t = torch.arange(frames * FRAME, dtype=torch.float32)
    freq = (0.04, 0.12, 0.3)[pitch]
    if pattern == 2:
        freq = freq * (1 + t / t.numel())
    wave = torch.sin(2 * math.pi * freq * t + float(torch.rand(1, generator=g)) * 6.28)
    if pattern == 1:
        wave = wave * ((t // (FRAME * 2)) % 2)
    wave = wave + 0.05 * torch.randn(wave.shape, generator=g)
    rows = wave.reshape(frames, FRAME)
    spec = torch.fft.rfft(rows, dim=1).abs() / FRAME
    time = torch.arange(frames).float()[:, None] / MAX_FRAMES
    return torch.cat([rows, spec, time], dim=1), [PITCHES[pitch], PATTERNS[pattern]]


def make_text(g: torch.Generator) -> list[str]:
    n = int(torch.randint(4, 9, (1,), generator=g))
    start = int(torch.randint(0, len(NUMBERS) - n, (1,), generator=g))
    return NUMBERS[start:start + n]


def encode_sample(kind: str, g: torch.Generator) -> dict[str, Tensor]:
    """One sample: tokens = [placeholders..., BOS, words..., EOS]; labels predict the words and
    EOS (text samples: everything after the first number)."""
    image = torch.zeros(0, IMAGE_DIM)
    audio = torch.zeros(0, AUDIO_DIM)
    if kind == "image":
        image, words = make_image(g)
        head = [IMG] * image.shape[0] + [BOS]
    elif kind == "audio":
        audio, words = make_audio(g)
        head = [AUD] * audio.shape[0] + [BOS]
    else:
        words = make_text(g)
        head = [BOS]
    ids = head + [WORD_ID[w] for w in words] + [EOS]
    if len(ids) > SEQ_LEN:
        raise ValueError(f"sample: {len(ids)} tokens exceed SEQ_LEN={SEQ_LEN}")
    tokens = torch.full((SEQ_LEN,), PAD, dtype=torch.long)
    tokens[:len(ids)] = torch.tensor(ids)
    labels = torch.full((SEQ_LEN,), -100, dtype=torch.long)
    first = len(head) - 1 if kind != "text" else len(head)  # BOS predicts the first word
    labels[first:len(ids) - 1] = tokens[first + 1:len(ids)]
    return {"tokens": tokens, "labels": labels, "image": image, "audio": audio,
            "is_caption": torch.tensor(kind != "text")}


class CaptionDataset(Dataset):
    """``length`` deterministic samples per epoch; the mix decides each sample's modality."""

    def __init__(self, length: int, seed: int = 0, mix: Sequence[float] = (1, 1, 1)) -> None:
        self.length, self.seed = length, seed
        self.epoch = 0
        self.set_mix(mix)

    def set_mix(self, mix: Sequence[float]) -> None:
        if len(mix) != 3 or any(m < 0 for m in mix) or sum(mix) <= 0:
            raise ValueError(f"mix: expected 3 non-negative image:text:audio weights with a "
                             f"positive sum, got {list(mix)}")
        self.mix = torch.tensor([float(m) for m in mix])

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch * 100_003 + i)
        kind = MODALITIES[int(torch.multinomial(self.mix, 1, generator=g))]
        return encode_sample(kind, g)


def collate(samples: Sequence[dict[str, Tensor]]) -> dict[str, Tensor]:
    """Stack tokens; pad encoder rows per modality (at least one row, so shapes stay valid)."""
    out = {k: torch.stack([s[k] for s in samples]) for k in ("tokens", "labels", "is_caption")}
    for name in ("image", "audio"):
        rows = [s[name] for s in samples]
        lengths = torch.tensor([r.shape[0] for r in rows])
        width = max(1, int(lengths.max()))
        padded = torch.zeros(len(rows), width, rows[0].shape[1])
        for i, r in enumerate(rows):
            padded[i, :r.shape[0]] = r
        out[name], out[f"{name}_len"] = padded, lengths
    return out


class MultimodalCaptionData(pl.LightningDataModule):
    """Stages of image:text:audio mixes, ``epochs_per_stage`` epochs each."""

    def __init__(self, batch_size: int = 16, samples_per_epoch: int = 512,
                 stages: Sequence[Sequence[float]] = ((6, 2, 2), (2, 2, 6), (3, 4, 3)),
                 epochs_per_stage: int = 2, val_samples: int = 128, seed: int = 0) -> None:
        super().__init__()
        positive_int("epochs_per_stage", epochs_per_stage)
        self.batch_size = batch_size
        self.stages = [list(s) for s in stages]
        self.epochs_per_stage = epochs_per_stage
        self.train_set = CaptionDataset(samples_per_epoch, seed, self.stages[0])
        self.val_set = CaptionDataset(val_samples, seed + 1, (1, 1, 1))

    def stage_of(self, epoch: int) -> int:
        return min(epoch // self.epochs_per_stage, len(self.stages) - 1)

    def set_epoch(self, epoch: int) -> None:
        self.train_set.epoch = epoch
        self.train_set.set_mix(self.stages[self.stage_of(epoch)])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=False,
                          collate_fn=collate)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size, collate_fn=collate)


class ModalityCurriculum(pl.Callback):
    """Moves the data module to the stage of the current epoch and logs the stage."""

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        dm = trainer.datamodule
        if not isinstance(dm, MultimodalCaptionData):
            raise TypeError("ModalityCurriculum: expected the trainer's datamodule to be a "
                            f"MultimodalCaptionData, got {type(dm).__name__}")
        dm.set_epoch(trainer.current_epoch)
        pl_module.log("data/stage", float(dm.stage_of(trainer.current_epoch)))
