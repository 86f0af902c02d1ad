import pytest

from lightning_omni.plan.costs import H100_80G, LLAMA_12B, LLAMA_70B, VIT_1B, CostModel
from lightning_omni.plan.schedule import Kind, encoder_first_stage, uniform_insertion
from lightning_omni.plan.systems import (
    SYSTEMS,
    ParallelConfig,
    Scenario,
    StepData,
    StepPricer,
    candidate_configs,
    predict,
    search,
)
from lightning_omni.plan.workload import image_text_mixture


@pytest.fixture(scope="module")
def small():
    sc = Scenario("small", VIT_1B, LLAMA_12B, H100_80G, 16, 8, 4096, image_text_mixture(0.9))
    cost = CostModel(sc.hardware)
    return sc, cost, StepData(sc, cost)


def test_candidates_fit_the_cluster(small):
    sc, _, _ = small
    for system in SYSTEMS:
        cands = candidate_configs(system, sc)
        assert cands
        for c in cands:
            gpus = StepPricer(small[2], system, c).llm_gpus() + c.encoder_gpus
            assert gpus <= sc.num_gpus
            assert (c.encoder_gpus > 0) == (system == "disaggregated")
            if system == "megatron" and c.encoder_tp != c.tp:
                # Megatron allows its own encoder TP only on an encoder-only first stage
                assert c.stage0_layer_fraction == 0.0 and c.tp % c.encoder_tp == 0
                assert gpus == c.dp * (c.encoder_tp + c.tp * (c.pp - 1))


def test_search_returns_the_fastest_fitting_layout_it_checked(small):
    sc, cost, data = small
    for system in SYSTEMS:
        res = search(system, sc, cost, data)
        assert not res.best.oom
        fitting = [p for p in res.evaluated if not p.oom]
        assert res.best.step_seconds == min(p.step_seconds for p in fitting)
        # the pick is priced on every replica: no replica of it is over the cap
        again = predict(system, sc, res.best.config, cost, data, simulate_replicas=None)
        assert not again.oom and again.step_seconds >= res.best.step_seconds * (1 - 1e-9)


def test_prediction_runs_the_builders_action_lists(small):
    sc, cost, data = small
    cfg = ParallelConfig(2, 4, 2, encoder_tp=2)
    mega = predict("megatron", sc, cfg, cost, data)
    assert mega.schedule == encoder_first_stage(4, mega.schedule.num_microbatches,
                                                grad_sync=True)
    omni = predict("omni", sc, cfg, cost, data)
    shares = [[0.0] * 4 for _ in range(omni.schedule.num_microbatches)]
    samples = [[()] * 4 for _ in range(omni.schedule.num_microbatches)]
    for prog in omni.schedule.actions:
        for a in prog:
            if a.kind == Kind.ENC_FWD:
                shares[a.microbatch][a.stage] = a.share
                samples[a.microbatch][a.stage] = a.samples
    rebuilt = uniform_insertion(4, omni.schedule.num_microbatches, shares, grad_sync=True,
                                sample_exchange=True, samples=samples, inline_stage0=True)
    assert rebuilt.actions == omni.schedule.actions
    assert omni.schedule.actions[0][0].kind == Kind.ALLTOALL


def test_uniform_insertion_lowers_stage0_memory_and_time_at_the_same_layout(small):
    sc, cost, data = small
    cfg = ParallelConfig(2, 4, 2, encoder_tp=2)
    mega = predict("megatron", sc, cfg, cost, data)
    omni = predict("omni", sc, cfg, cost, data)
    assert omni.stage0_memory_gb < mega.stage0_memory_gb
    assert omni.step_seconds < mega.step_seconds
    assert omni.busy_fraction[0] < 1.0 and min(omni.bubble_fraction) >= 0.0


def test_oom_is_flagged():
    sc = Scenario("big", VIT_1B, LLAMA_70B, H100_80G, 8, 8, 4096, image_text_mixture(0.5))
    pred = predict("megatron", sc, ParallelConfig(1, 1, 8))
    assert pred.oom and pred.stage0_memory_gb > 80


def test_predictions_are_deterministic(small):
    sc, _, _ = small
    cfg = ParallelConfig(2, 2, 4, encoder_tp=1)
    a, b = predict("omni", sc, cfg), predict("omni", sc, cfg)
    assert a.step_seconds == b.step_seconds and a.stage_peak_memory_gb == b.stage_peak_memory_gb


def test_bad_configs_raise(small):
    sc, cost, data = small
    with pytest.raises(ValueError, match="system: expected one of"):
        predict("deepspeed", sc, ParallelConfig(1, 1, 16), cost, data)
    with pytest.raises(ValueError, match="config: expected at most 16 GPUs"):
        predict("megatron", sc, ParallelConfig(8, 2, 2), cost, data)
    with pytest.raises(ValueError, match="encoder_tp"):
        predict("omni", sc, ParallelConfig(2, 1, 8, encoder_tp=4), cost, data)
    with pytest.raises(ValueError, match="num_gpus"):
        Scenario("x", VIT_1B, LLAMA_12B, H100_80G, 0, 8, 4096, image_text_mixture(0.5))
