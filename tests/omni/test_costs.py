import json

import numpy as np
import pytest

from lightning_omni.plan.costs import (
    GPT_175B,
    H100_80G,
    LLAMA_70B,
    VIT_10B,
    CostModel,
    FittedCurve,
    SampleMeta,
    Segment,
    TransformerConfig,
    fit_curve,
    hardware_preset,
    load_profile,
    model_preset,
)


def test_preset_parameter_counts_match_published_sizes():
    assert LLAMA_70B.total_params == pytest.approx(69e9, rel=0.02)
    assert GPT_175B.total_params == pytest.approx(175e9, rel=0.02)
    assert VIT_10B.total_params == pytest.approx(10e9, rel=0.05)
    assert model_preset("ViT-1B").total_params == pytest.approx(1e9, rel=0.05)
    assert model_preset("LLaMA-12B").total_params == pytest.approx(12e9, rel=0.05)


def test_fit_recovers_known_curve():
    lengths = np.array([128, 512, 1024, 4096, 8192], dtype=float)
    seconds = 1e-4 + 2e-7 * lengths + 3e-11 * lengths**2
    curve = fit_curve(lengths, seconds)
    assert curve.a == pytest.approx(2e-7, rel=1e-6)
    assert curve.b == pytest.approx(3e-11, rel=1e-6)
    assert curve.c == pytest.approx(1e-4, rel=1e-6)


def test_profile_replaces_analytic_costs(tmp_path):
    records = [{"model": "ViT-10B", "phase": phase, "tokens": n,
                "seconds": (1 if phase == "fwd" else 2) * (1e-3 + 1e-6 * n)}
               for phase in ("fwd", "bwd") for n in (256, 1024, 4096)]
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"records": records}))
    fitted = load_profile(path)
    assert set(fitted) == {("ViT-10B", "fwd"), ("ViT-10B", "bwd")}
    cost = CostModel(H100_80G, fitted=fitted)
    assert cost.layer_seconds(VIT_10B, [1024]) == pytest.approx(1e-3 + 1e-6 * 1024, rel=1e-6)
    assert cost.layer_seconds(VIT_10B, [1024], phase="bwd") == pytest.approx(
        2 * (1e-3 + 1e-6 * 1024), rel=1e-6)
    # a model without a profile keeps the analytic form
    assert cost.layer_seconds(LLAMA_70B, [1024]) == CostModel(H100_80G).layer_seconds(
        LLAMA_70B, [1024])


def test_profile_errors_name_the_field(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"records": [{"model": "x", "phase": "sideways", "tokens": 1,
                                             "seconds": 1.0}]}))
    with pytest.raises(ValueError, match=r"records\[0\]\.phase"):
        load_profile(path)


def test_costs_grow_with_length_and_shrink_with_tp():
    cost = CostModel(H100_80G)
    short, long = cost.layer_seconds(LLAMA_70B, [1024]), cost.layer_seconds(LLAMA_70B, [8192])
    # 8x the tokens: more than 6x the time (short calls run at lower GEMM efficiency)
    assert 6 * short < long < 12 * short
    one, eight = (cost.stack_seconds(LLAMA_70B, [8192], 80, tp) for tp in (1, 8))
    assert eight < one
    assert eight > one / 8  # TP is never free: communication and narrower GEMMs


def test_quadratic_term_matters_for_long_sequences():
    cost = CostModel(H100_80G)
    # same batch size (same GEMM efficiency): only attention's l^2 differs
    one_long = cost.stack_seconds(VIT_10B, [16384], 1)
    sixteen_short = cost.stack_seconds(VIT_10B, [1024] * 16, 1)
    assert one_long == pytest.approx(1.6 * sixteen_short, rel=0.05)


def test_memory_model_recompute_and_sharding():
    cost = CostModel(H100_80G)
    full = cost.activation_bytes(LLAMA_70B, 8192, 10, 8, recompute=False)
    rec = cost.activation_bytes(LLAMA_70B, 8192, 10, 8, recompute=True)
    assert rec < full / 4
    assert cost.param_bytes(70e9, 8, 64) < cost.param_bytes(70e9, 8, 1)


def test_bad_inputs_name_argument_expected_and_got():
    with pytest.raises(ValueError, match=r"hidden: expected divisible by heads=3, got 10"):
        TransformerConfig("x", layers=1, hidden=10, heads=3, ffn_hidden=4)
    with pytest.raises(ValueError, match="lengths"):
        fit_curve([1, 2], [1, 2])
    with pytest.raises(ValueError, match="model: expected one of"):
        model_preset("LLaMA-7T")
    with pytest.raises(ValueError, match="hardware"):
        hardware_preset("TPU")
    with pytest.raises(ValueError, match="encoder_tokens: expected 0 for text"):
        Segment("text", 5, 5)
    with pytest.raises(ValueError, match="phase"):
        CostModel(H100_80G).layer_seconds(VIT_10B, [1], phase="up")


def test_sample_meta_sums_segments():
    s = SampleMeta(7, (Segment("image", 1024, 256), Segment("text", 0, 40),
                       Segment("image", 512, 128)))
    assert s.llm_tokens == 424
    assert s.encoder_tokens() == 1536
    assert s.encoder_lengths("image") == (1024, 512)
    assert isinstance(FittedCurve(1, 0).seconds(np.array([2.0]))[0], float)


def test_plan_package_does_not_import_torch():
    """Planning must stay pure: no plan module imports torch (or anything outside the
    standard library, numpy and the package itself)."""
    import ast
    from pathlib import Path

    import lightning_omni.plan as plan

    allowed = {"numpy", "__future__"}
    for path in Path(plan.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            for name in names:
                top = name.split(".")[0]
                assert top != "torch", f"{path.name} imports {name}"
                import sys
                assert top in allowed or top in sys.stdlib_module_names, \
                    f"{path.name} imports {name}"
