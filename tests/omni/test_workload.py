import numpy as np
import pytest

from lightning_omni.plan.costs import AUDIO, IMAGE
from lightning_omni.plan.workload import (
    IMAGE_DOCS,
    IMAGE_WEB,
    TEXT_SFT,
    audio_mixture,
    draw_samples,
    image_text_mixture,
    pack_sequences,
    training_stages,
)


def test_same_seed_same_samples_different_seed_differs():
    mix = image_text_mixture(0.5)
    a = draw_samples(mix, 200_000, seed=3)
    b = draw_samples(mix, 200_000, seed=3)
    c = draw_samples(mix, 200_000, seed=4)
    assert a == b
    assert a != c


@pytest.mark.parametrize("ratio", [0.1, 0.5, 0.9])
def test_image_share_follows_ratio(ratio):
    samples = draw_samples(image_text_mixture(ratio), 3_000_000, seed=0)
    share = np.mean([s.encoder_tokens(IMAGE) > 0 for s in samples])
    assert share == pytest.approx(ratio, abs=0.03)


def test_image_datasets_differ_by_about_2_71x():
    assert IMAGE_DOCS.mean() / IMAGE_WEB.mean() == pytest.approx(2.71, rel=0.05)


def test_audio_averages_17_6x_text_length():
    samples = draw_samples(audio_mixture(0.5), 20_000_000, seed=1)
    audio = [s.llm_tokens for s in samples if s.encoder_tokens(AUDIO) > 0]
    assert np.mean(audio) / TEXT_SFT.mean() == pytest.approx(17.6, rel=0.1)


def test_long_tail_reaches_but_never_exceeds_the_cap():
    samples = draw_samples(image_text_mixture(0.5, long_max=16384, long_share=0.2), 3_000_000,
                           seed=2, max_llm_tokens=16384)
    lengths = np.array([s.llm_tokens for s in samples])
    assert lengths.max() <= 16384
    assert lengths.max() > 8192
    assert max(s.encoder_tokens() for s in samples) > 8192


def test_pack_sequences_keeps_order_and_capacity():
    samples = draw_samples(image_text_mixture(0.5), 300_000, seed=5, max_llm_tokens=4096)
    packed = pack_sequences(samples, 4096)
    assert [s for seq in packed for s in seq] == samples
    assert all(sum(s.llm_tokens for s in seq) <= 4096 for seq in packed)


def test_stages_are_named_mixtures():
    stages = training_stages()
    assert stages["alignment"].share(IMAGE) > stages["text-heavy"].share(IMAGE)
    assert stages["speech"].share(AUDIO) > 0


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"image_ratio: expected a float in \[0, 1\], got 1.5"):
        image_text_mixture(1.5)
    with pytest.raises(ValueError, match="total_llm_tokens"):
        draw_samples(image_text_mixture(0.5), 0, seed=0)
    too_long = draw_samples(image_text_mixture(0.0), 100_000, seed=0)
    with pytest.raises(ValueError, match="seq_len"):
        pack_sequences(too_long, 16)
