"""Run-level prediction: phases of a changing mix, one layout per system for the whole run."""

from dataclasses import replace

import numpy as np
import pytest

from lightning_omni.plan.costs import H100_80G, CostModel, TransformerConfig
from lightning_omni.plan.run import (
    Phase,
    Run,
    design_steps,
    predict_run,
    sampled_steps,
    search_run,
)
from lightning_omni.plan.schedule import Kind
from lightning_omni.plan.systems import ParallelConfig, predict

ENC = TransformerConfig("enc", layers=4, hidden=256, heads=4, ffn_hidden=1024, causal=False)
LLM = TransformerConfig("llm", layers=8, hidden=512, heads=8, ffn_hidden=2048, vocab=1000)


def _run(phases, hw=H100_80G, **kw) -> Run:
    return Run("tiny", ENC, LLM, hw, 8, 8, 1024, tuple(phases), **kw)


def test_phases_validate_their_arguments():
    with pytest.raises(ValueError, match=r"share: expected a float in \[0, 1\], got 1.5"):
        Phase(1.5)
    with pytest.raises(ValueError, match="steps: expected >= 1, got 0"):
        Phase(0.5, steps=0)
    with pytest.raises(ValueError, match="share_end"):
        Phase(0.5, share_end=-0.1)
    with pytest.raises(ValueError, match="phases: expected at least one Phase"):
        _run([])
    with pytest.raises(ValueError, match="omni_off"):
        _run([Phase(0.5)], omni_off=("magic",))


def test_sampled_shares_follow_phases_weights_and_curriculum():
    run = _run([Phase(0.9, steps=1), Phase(0.2, steps=3, share_end=0.0)])
    shares = run.sample_shares(40, seed=3)
    phases = [p for p, _ in shares]
    # in proportion to the phases' steps (one reserved per phase, the rest by largest remainder)
    assert abs(phases.count(0) - 10) <= 1 and phases.count(0) + phases.count(1) == 40
    assert all(s == pytest.approx(0.9) for p, s in shares if p == 0)  # no spread
    ramp = [s for p, s in shares if p == 1]
    assert ramp == sorted(ramp, reverse=True) and 0.0 <= min(ramp) and max(ramp) <= 0.2
    noisy = _run([Phase(0.5, steps=1, share_sd=0.1)]).sample_shares(400, seed=1)
    values = np.array([s for _, s in noisy])
    assert values.std() == pytest.approx(0.1, rel=0.15) and values.mean() == pytest.approx(
        0.5, abs=0.02)
    assert run.sample_shares(40, seed=3) == shares
    # the design: the worst step (highest mean + 2 sd) first, then each phase's middle
    design = _run([Phase(0.7, share_sd=0.1), Phase(0.2)]).design_shares()
    assert design[0] == (pytest.approx(0.9), 0.0)
    assert [s for s, _ in design[1:]] == pytest.approx([0.7, 0.2])


@pytest.fixture(scope="module")
def tiny():
    run = _run([Phase(0.8, steps=1, share_sd=0.05), Phase(0.2, steps=2, share_sd=0.05)])
    cost = CostModel(run.hardware)
    return run, cost, design_steps(run, cost), sampled_steps(run, cost, 6, seed=11)


def test_run_prediction_prices_every_step_with_one_layout(tiny):
    run, cost, _, steps = tiny
    cfg = ParallelConfig(2, 2, 2, encoder_tp=2)
    pred = predict_run("megatron", cfg, steps, cost)
    each = [predict("megatron", d.scenario, cfg, cost, d) for d in steps]
    assert pred.step_seconds == tuple(p.step_seconds for p in each)
    tokens = run.global_batch * run.seq_len
    assert pred.tokens_per_s_mean == pytest.approx(
        len(steps) * tokens / sum(p.step_seconds for p in each))
    assert pred.tokens_per_s_percentile(5) <= pred.tokens_per_s_mean <= \
        pred.tokens_per_s_percentile(95)
    assert len(set(pred.step_seconds)) > 1  # the mix moves from step to step


def test_omni_plans_adapt_per_step_while_the_layout_stays(tiny):
    _, cost, _, steps = tiny
    cfg = ParallelConfig(2, 2, 2, encoder_tp=1)
    shares = []
    for d in steps[:3]:
        p = predict("omni", d.scenario, cfg, cost, d)
        shares.append(tuple(a.share for prog in p.schedule.actions for a in prog
                            if a.kind == Kind.ENC_FWD))
        assert p.config == cfg
    assert len(set(shares)) > 1


def test_searched_layout_fits_every_design_step(tiny):
    run, cost, design, steps = tiny
    for system in ("megatron", "omni"):
        found = search_run(system, run, cost, design, top_k=2, max_checked=6)
        assert found.fits
        assert len(found.design) == len(design.steps)
        assert not any(p.oom for p in found.design)
        assert all(p.config == found.config for p in found.design)


def test_a_layout_that_fits_text_heavy_steps_ooms_the_run_at_high_image_share(tiny):
    _, cost, _, _ = tiny
    cfg = ParallelConfig(1, 2, 4, encoder_tp=1)
    low = _run([Phase(0.1)])
    high = _run([Phase(0.95)])
    lo = predict("megatron", low.scenario(0.1, 0), cfg, cost)
    hi = predict("megatron", high.scenario(0.95, 0), cfg, cost)
    assert hi.stage0_memory_gb > lo.stage0_memory_gb
    # a GPU whose memory sits between the two
    usable = (lo.stage0_memory_gb + hi.stage0_memory_gb) / 2 * 1e9
    hw = replace(H100_80G, hbm_bytes=usable / H100_80G.usable_memory_fraction)
    run = _run([Phase(0.1, steps=1), Phase(0.95, steps=1)], hw=hw)
    small = CostModel(hw)
    steps = sampled_steps(run, small, 4, seed=0)
    pred = predict_run("megatron", cfg, steps, small)
    assert 0 < pred.oom_steps < len(steps) and pred.oom
    # the search sizes its layout for the worst step instead
    found = search_run("megatron", run, small, top_k=1, max_checked=6)
    if found.fits:
        assert not any(p.oom for p in found.design)
    else:
        assert found.smallest_peak_gb > hw.memory_cap_bytes / 1e9
