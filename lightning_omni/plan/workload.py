"""Seeded synthetic sample metadata for training-stage modality mixtures.

The planners only ever see metadata, so a workload is a list of ``SampleMeta``. Length shapes
follow the article's observations: image encoding lengths differ up to 2.71x between datasets,
audio samples average up to 17.6x the text length, and some stages have heavy-tailed long
sequences (16K/32K).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .costs import AUDIO, IMAGE, TEXT, SampleMeta, Segment, _require


@dataclass(frozen=True, slots=True)
class LengthDist:
    """Clipped lognormal (``tail_alpha == 0``) or clipped Pareto (heavy tail) token lengths."""

    median: float
    sigma: float = 0.5
    low: int = 1
    high: int = 1 << 20
    tail_alpha: float = 0.0

    def __post_init__(self) -> None:
        _require(self.median > 0, "median", "> 0", self.median)
        _require(1 <= self.low <= self.high, "low/high", "1 <= low <= high", (self.low, self.high))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.tail_alpha > 0:
            draws = self.median * (1.0 + rng.pareto(self.tail_alpha, n))
        else:
            draws = rng.lognormal(np.log(self.median), self.sigma, n)
        return np.clip(np.rint(draws), self.low, self.high).astype(np.int64)

    def mean(self, n: int = 20000) -> float:
        """Monte-Carlo mean of the clipped distribution (fixed seed: deterministic)."""
        return float(self.sample(np.random.default_rng(0), n).mean())


@dataclass(frozen=True, slots=True)
class Source:
    """One dataset: a modality, its share of samples and its length distributions."""

    name: str
    modality: str
    weight: float
    text_len: LengthDist
    encoder_len: LengthDist | None = None
    encoder_per_llm_token: float = 4.0

    def __post_init__(self) -> None:
        _require(self.weight >= 0, "weight", ">= 0", self.weight)
        if self.modality != TEXT:
            _require(self.encoder_len is not None, "encoder_len", f"a LengthDist for "
                     f"{self.modality}", None)


@dataclass(frozen=True, slots=True)
class Mixture:
    """A training stage's data mix."""

    name: str
    sources: tuple[Source, ...]

    def __post_init__(self) -> None:
        _require(len(self.sources) > 0, "sources", "at least one Source", self.sources)
        _require(sum(s.weight for s in self.sources) > 0, "sources", "positive total weight",
                 [s.weight for s in self.sources])

    def share(self, modality: str) -> float:
        total = sum(s.weight for s in self.sources)
        return sum(s.weight for s in self.sources if s.modality == modality) / total


TEXT_SFT = LengthDist(median=420, sigma=0.9, low=16, high=8192)
CAPTION = LengthDist(median=48, sigma=0.6, low=4, high=512)
# Two image datasets whose mean encoding lengths differ by ~2.71x (low-res web vs. hi-res docs).
IMAGE_WEB = LengthDist(median=576, sigma=0.35, low=256, high=2048)
IMAGE_DOCS = LengthDist(median=1560, sigma=0.35, low=576, high=4096)


def image_text_mixture(image_ratio: float, long_max: int = 0, long_share: float = 0.02,
                       name: str = "") -> Mixture:
    """Image-text vs. text-only samples at ``image_ratio`` (0.1 = 1:9, 0.9 = 9:1).

    ``long_max > 0`` adds a heavy tail of long samples (high-resolution images / interleaved
    documents and long texts) reaching ``long_max`` tokens.
    """
    _require(0.0 <= image_ratio <= 1.0, "image_ratio", "a float in [0, 1]", image_ratio)
    _require(long_max >= 0, "long_max", ">= 0", long_max)
    text_w = 1.0 - image_ratio
    sources = [
        Source("web-captions", IMAGE, image_ratio * 0.6, CAPTION, IMAGE_WEB),
        Source("docs-hires", IMAGE, image_ratio * 0.4, CAPTION, IMAGE_DOCS),
        Source("text", TEXT, text_w, TEXT_SFT),
    ]
    if long_max:
        tail = LengthDist(median=long_max / 8, low=long_max // 8, high=long_max, tail_alpha=1.2)
        sources += [
            Source("long-hires", IMAGE, image_ratio * long_share, CAPTION, tail),
            Source("long-text", TEXT, text_w * long_share,
                   LengthDist(median=long_max / 8, low=long_max // 8, high=long_max,
                              tail_alpha=1.2)),
        ]
    label = name or f"image:text {round(image_ratio * 10)}:{round((1 - image_ratio) * 10)}"
    return Mixture(label, tuple(sources))


def audio_mixture(audio_ratio: float, audio_to_text_length: float = 17.6,
                  name: str = "") -> Mixture:
    """Speech-text samples whose mean LLM length is ``audio_to_text_length`` x the text mean."""
    _require(0.0 <= audio_ratio <= 1.0, "audio_ratio", "a float in [0, 1]", audio_ratio)
    _require(audio_to_text_length > 0, "audio_to_text_length", "> 0", audio_to_text_length)
    text_mean = TEXT_SFT.mean()
    audio_llm_mean = audio_to_text_length * text_mean
    encoder_per_llm = 2.0
    audio_len = LengthDist(median=audio_llm_mean * encoder_per_llm / np.exp(0.5 * 0.4**2),
                           sigma=0.4, low=200, high=60000)
    sources = (
        Source("speech", AUDIO, audio_ratio, CAPTION, audio_len, encoder_per_llm),
        Source("text", TEXT, 1.0 - audio_ratio, TEXT_SFT),
    )
    return Mixture(name or f"audio {audio_ratio:.0%}", sources)


def training_stages() -> dict[str, Mixture]:
    """Mixtures of a typical multi-stage run, named by stage."""
    return {
        "alignment": image_text_mixture(0.9, name="alignment"),
        "pretrain": image_text_mixture(0.5, name="pretrain"),
        "text-heavy": image_text_mixture(0.1, name="text-heavy"),
        "long-context": image_text_mixture(0.5, long_max=32768, long_share=0.05,
                                           name="long-context"),
        "speech": audio_mixture(0.3, name="speech"),
    }


def draw_samples(mixture: Mixture, total_llm_tokens: int, seed: int,
                 max_llm_tokens: int = 1 << 20, first_id: int = 0) -> list[SampleMeta]:
    """Draw samples in loader order until their LLM tokens reach ``total_llm_tokens``.

    Samples longer than ``max_llm_tokens`` are truncated (text first, then the encoder span).
    Vectorized per chunk: no Python loop over tokens.
    """
    _require(total_llm_tokens > 0, "total_llm_tokens", "> 0", total_llm_tokens)
    _require(max_llm_tokens > 0, "max_llm_tokens", "> 0", max_llm_tokens)
    rng = np.random.default_rng(seed)
    weights = np.array([s.weight for s in mixture.sources], dtype=np.float64)
    weights /= weights.sum()
    samples: list[SampleMeta] = []
    total = 0
    next_id = first_id
    while total < total_llm_tokens:
        chunk = max(64, int((total_llm_tokens - total) / 200))
        which = rng.choice(len(mixture.sources), size=chunk, p=weights)
        per_source = {i: _draw_source(mixture.sources[i], rng, int((which == i).sum()))
                      for i in np.unique(which)}
        cursor = dict.fromkeys(per_source, 0)
        for i in which:
            text, enc = per_source[i]
            k = cursor[i]
            cursor[i] += 1
            meta = _make_sample(next_id, mixture.sources[i], int(text[k]), int(enc[k]),
                                max_llm_tokens)
            next_id += 1
            samples.append(meta)
            total += meta.llm_tokens
            if total >= total_llm_tokens:
                break
    return samples


def _draw_source(source: Source, rng: np.random.Generator, n: int) -> tuple[np.ndarray,
                                                                            np.ndarray]:
    text = source.text_len.sample(rng, n)
    enc = source.encoder_len.sample(rng, n) if source.encoder_len else np.zeros(n, np.int64)
    return text, enc


def _make_sample(sample_id: int, source: Source, text: int, enc: int,
                 max_llm_tokens: int) -> SampleMeta:
    if source.modality == TEXT:
        return SampleMeta(sample_id, (Segment(TEXT, 0, min(text, max_llm_tokens)),))
    enc_llm = max(1, int(np.ceil(enc / source.encoder_per_llm_token)))
    if enc_llm > max_llm_tokens:
        enc_llm = max_llm_tokens
        enc = int(enc_llm * source.encoder_per_llm_token)
    text = min(text, max_llm_tokens - enc_llm)
    segments = [Segment(source.modality, enc, enc_llm)]
    if text > 0:
        segments.append(Segment(TEXT, 0, text))
    return SampleMeta(sample_id, tuple(segments))


def pack_sequences(samples: Sequence[SampleMeta], seq_len: int) -> list[list[SampleMeta]]:
    """Greedy in-order packing into sequences of at most ``seq_len`` LLM tokens."""
    _require(seq_len > 0, "seq_len", "> 0", seq_len)
    packed: list[list[SampleMeta]] = [[]]
    used = 0
    for s in samples:
        _require(s.llm_tokens <= seq_len, "samples", f"llm_tokens <= seq_len={seq_len}",
                 s.llm_tokens)
        if used + s.llm_tokens > seq_len and packed[-1]:
            packed.append([])
            used = 0
        packed[-1].append(s)
        used += s.llm_tokens
    return packed
