import json
from pathlib import Path

import numpy as np
import pytest

from lightning_omni.plan.costs import (
    GPT_175B,
    H100_80G,
    HARDWARE,
    LLAMA_70B,
    MODELS,
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


PLANNING_DOC = Path(__file__).resolve().parents[2] / "docs" / "omni" / "planning.md"


def _doc_table(header_word: str) -> dict[str, list[str]]:
    """Rows of the first table in planning.md whose header has ``header_word``, by preset."""
    lines = PLANNING_DOC.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines)
                 if ln.startswith("| preset |") and header_word in ln)
    rows = {}
    for ln in lines[start + 2:]:
        if not ln.startswith("|"):
            break
        cells = [c.strip() for c in ln.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_hardware_presets_match_their_documented_sources():
    table = _doc_table("peak bf16")
    assert set(table) == set(HARDWARE)
    for name, (peak, hbm, nvlink, ib, _source) in table.items():
        hw = hardware_preset(name)
        assert (hw.peak_flops, hw.hbm_bytes) == (float(peak) * 1e12, float(hbm) * 1e9), name
        assert (hw.nvlink_bytes_per_s, hw.ib_bytes_per_s) == (float(nvlink) * 1e9,
                                                               float(ib) * 1e9), name
        # the shared assumptions stated above the table
        assert (hw.gpus_per_node, hw.max_efficiency, hw.half_efficiency_tokens) == (8, 0.6, 384)
        assert (hw.nvlink_latency_s, hw.ib_latency_s, hw.usable_memory_fraction) == (
            2e-6, 10e-6, 0.92), name


def test_model_presets_match_their_documented_sources():
    table = _doc_table("layers")
    assert set(table) == set(MODELS)
    for name, (layers, hidden, heads, kv, ffn, vocab, gated, causal, _source) in table.items():
        m = model_preset(name)
        assert (m.layers, m.hidden, m.heads, m.num_kv_heads, m.ffn_hidden, m.vocab) == (
            int(layers), int(hidden), int(heads), int(kv or heads), int(ffn), int(vocab)), name
        assert (m.gated_mlp, m.causal) == (gated == "yes", causal == "yes"), name
    # the sizes the names claim
    assert model_preset("ViT-2.4B").total_params == pytest.approx(2.4e9, rel=0.05)
    assert model_preset("Audio-0.6B").total_params == pytest.approx(0.63e9, rel=0.05)


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
    # full recompute keeps each layer's bf16 input only: 2*h bytes per token per layer
    assert rec == pytest.approx(8192 * 10 * 2 * LLAMA_70B.hidden / 8)
    assert cost.recompute_working_bytes(LLAMA_70B, 8192, 8) == pytest.approx(full / 10)
    assert cost.param_bytes(70e9, 8, 64) < cost.param_bytes(70e9, 8, 1)


def test_activation_bytes_per_token_follow_the_layer_shape():
    # Korthikanti et al.: 34*h for a GPT layer (ffn 4h, no GQA, plain MLP)
    gpt = TransformerConfig("gpt", layers=1, hidden=1024, heads=16, ffn_hidden=4096)
    assert gpt.activation_bytes_per_token_layer == 34 * 1024
    # GQA shrinks K and V (2 bytes each per kv element); a gated MLP stores 2*ffn more
    gqa = TransformerConfig("gqa", layers=1, hidden=1024, heads=16, ffn_hidden=4096,
                            kv_heads=4)
    assert gpt.activation_bytes_per_token_layer - gqa.activation_bytes_per_token_layer == \
        4 * (1024 - 256)
    gated = TransformerConfig("g", layers=1, hidden=1024, heads=16, ffn_hidden=4096,
                              gated_mlp=True)
    assert gated.activation_bytes_per_token_layer - gpt.activation_bytes_per_token_layer == \
        2 * 4096


# ---- closed forms on tiny numbers (each fails if its term is dropped) ---------------------
TINY = TransformerConfig("tiny", layers=2, hidden=64, heads=4, ffn_hidden=256)
TINY_BIDIR = TransformerConfig("tiny-bidir", layers=2, hidden=64, heads=4, ffn_hidden=256,
                               causal=False)


def _rate(cost: CostModel, tokens: float, tp: int = 1) -> float:
    hw = cost.hardware
    return tp * hw.peak_flops * hw.max_efficiency * (tokens / np.sqrt(tp)) / (
        tokens / np.sqrt(tp) + hw.half_efficiency_tokens)


def test_layer_flops_closed_form_causal_and_backward():
    cost = CostModel(H100_80G)
    l, h, p = 1000.0, 64, TINY.params_per_layer  # noqa: E741
    assert p == 4 * h * h + 2 * h * 256
    fwd = (2 * p * l + 2 * h * l * l) / _rate(cost, l)           # causal: half of 4*h*l^2
    bwd = (2 * 2 * p * l + 2.5 * 2 * h * l * l) / _rate(cost, l)  # GEMMs 2x, attention 2.5x
    assert cost.layer_seconds(TINY, [l]) == pytest.approx(fwd, rel=1e-12)
    assert cost.layer_seconds(TINY, [l], phase="bwd") == pytest.approx(bwd, rel=1e-12)
    bidir = (2 * p * l + 4 * h * l * l) / _rate(cost, l)
    assert cost.layer_seconds(TINY_BIDIR, [l]) == pytest.approx(bidir, rel=1e-12)


def test_unequal_lengths_cost_each_call_its_own_square():
    """Attention is per call: calls of 100 and 900 tokens cost l1^2 + l2^2 (820,000), not
    twice the mean's square (500,000); equal lengths cannot tell the two apart."""
    cost = CostModel(H100_80G)
    p, h = TINY_BIDIR.params_per_layer, TINY_BIDIR.hidden
    lens, layers = np.array([100.0, 900.0]), 3
    rate = _rate(cost, lens.sum())
    f, b = cost.stack_fwd_bwd_each(TINY_BIDIR, lens, layers, 1, False, lens.sum())
    for i, l in enumerate(lens):  # noqa: E741
        assert f[i] == pytest.approx(layers * (2 * p * l + 4 * h * l * l) / rate, rel=1e-12)
        assert b[i] == pytest.approx(layers * (2 * 2 * p * l + 2.5 * 4 * h * l * l) / rate,
                                     rel=1e-12)
    whole = layers * (2 * p * 1000 + 4 * h * (100**2 + 900**2)) / rate
    assert cost.stack_seconds(TINY_BIDIR, lens, layers) == pytest.approx(whole, rel=1e-12)
    assert cost.stack_seconds(TINY_BIDIR, lens, layers) == pytest.approx(f.sum(), rel=1e-12)
    each = cost.stack_seconds_each(TINY_BIDIR, lens, layers, batch_tokens=lens.sum())
    assert each == pytest.approx(f, rel=1e-12)


def test_tp_allreduces_closed_form_with_recompute():
    cost = CostModel(H100_80G)
    hw, l, tp = H100_80G, 1000.0, 4  # noqa: E741
    one = 2 * (tp - 1) / tp * l * 64 * 2 / hw.nvlink_bytes_per_s + 2 * (tp - 1) * \
        hw.nvlink_latency_s
    compute_f = cost.layer_seconds_each(TINY, [l], tp)[0]
    compute_b = cost.layer_seconds_each(TINY, [l], tp, "bwd")[0]
    assert cost.stack_seconds(TINY, [l], 3, tp) == pytest.approx(3 * (compute_f + 2 * one))
    assert cost.stack_seconds(TINY, [l], 3, tp, "bwd") == pytest.approx(
        3 * (compute_b + 2 * one))
    # a recomputed forward repeats its two all-reduces
    assert cost.stack_seconds(TINY, [l], 3, tp, "bwd", recompute=True) == pytest.approx(
        3 * (compute_b + compute_f + 4 * one))
    # per call (the encoder's path) the same terms, latency included
    f, b = cost.stack_fwd_bwd_each(TINY, np.array([l]), 3, tp, True, l)
    assert f[0] == pytest.approx(3 * (compute_f + 2 * one))
    assert b[0] == pytest.approx(3 * (compute_b + compute_f + 4 * one))
    assert cost.stack_seconds_each(TINY, [l], 3, tp, "fwd", batch_tokens=l)[0] == \
        pytest.approx(f[0])


def test_collectives_closed_form():
    cost = CostModel(H100_80G)
    hw, nbytes = H100_80G, 3e8
    for g in (2, 4, 8):
        assert cost.allreduce_seconds(nbytes, g, True) == pytest.approx(
            2 * (g - 1) / g * nbytes / hw.nvlink_bytes_per_s + 2 * (g - 1) * hw.nvlink_latency_s)
        assert cost.allreduce_seconds(nbytes, g, False) == pytest.approx(
            2 * (g - 1) / g * nbytes / hw.ib_bytes_per_s + 2 * (g - 1) * hw.ib_latency_s)
        assert cost.alltoall_seconds(nbytes, g, False) == pytest.approx(
            (g - 1) / g * nbytes / hw.ib_bytes_per_s + (g - 1) * hw.ib_latency_s)
        assert cost.exchange_seconds(nbytes, g, False) == pytest.approx(
            nbytes / hw.ib_bytes_per_s + (g - 1) * hw.ib_latency_s)
    assert cost.allreduce_seconds(nbytes, 1, False) == 0.0
    assert cost.p2p_seconds(nbytes, inside_node=False) == pytest.approx(
        hw.ib_latency_s + nbytes / hw.ib_bytes_per_s)
    assert cost.p2p_seconds(nbytes, inside_node=True) == pytest.approx(
        hw.nvlink_latency_s + nbytes / hw.nvlink_bytes_per_s)


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
    standard library, numpy, the package itself and the standard-library-only shared
    validators). test_imports.py checks the same at run time."""
    import ast
    from pathlib import Path

    import lightning_omni.plan as plan

    allowed = {"numpy", "__future__", "lightning_omnilab"}
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


def test_activation_bytes_in_the_run_s_own_dtype():
    """A float32 run without dropout (the CPU toys): every stored value 4 bytes, no masks;
    the bf16 defaults are the 34*h of Korthikanti et al. for a plain GPT layer."""
    gpt = TransformerConfig("gpt", layers=4, hidden=64, heads=4, ffn_hidden=256)
    assert gpt.activation_bytes_per_token_layer == 34 * 64
    f32 = CostModel(H100_80G, activation_value_bytes=4.0, dropout_mask_bytes=0.0)
    assert f32.activation_bytes(gpt, 10, 3, 1, recompute=False) == 10 * 3 * 4 * 16 * 64
    assert f32.activation_bytes(gpt, 10, 3, 1, recompute=True) == 10 * 3 * 4 * 64
    assert f32.recompute_working_bytes(gpt, 10, 1) == 10 * 4 * 16 * 64


def test_activation_bytes_without_sequence_parallelism_keep_the_norms_whole():
    """Plain TP (OmniStrategy's): the norms' inputs, the QKV and first MLP GEMMs' inputs and
    the dropout masks are whole on every TP rank (Korthikanti et al.'s 10*h of 34*h), the
    rest split; with sequence parallelism all of it is split."""
    gpt = TransformerConfig("gpt", layers=4, hidden=8, heads=2, ffn_hidden=32)
    assert gpt.activation_bytes_per_token_layer == 34 * 8
    assert gpt.replicated_bytes_per_token_layer(2.0, 1.0) == 10 * 8
    sp = CostModel(H100_80G)
    plain = CostModel(H100_80G, sequence_parallel=False)
    # 10 tokens, 3 layers, TP 4
    assert sp.activation_bytes(gpt, 10, 3, 4, recompute=False) == 10 * 3 * 34 * 8 / 4
    assert plain.activation_bytes(gpt, 10, 3, 4, recompute=False) == \
        10 * 3 * (10 * 8 + 24 * 8 / 4)
    # full recompute keeps each layer's bf16 input, whole without sequence parallelism
    assert sp.activation_bytes(gpt, 10, 3, 4, recompute=True) == 10 * 3 * 2 * 8 / 4
    assert plain.activation_bytes(gpt, 10, 3, 4, recompute=True) == 10 * 3 * 2 * 8
    assert plain.recompute_working_bytes(gpt, 10, 4) == 10 * (10 * 8 + 24 * 8 / 4)
    # TP 1: the same either way
    assert plain.activation_bytes(gpt, 10, 3, 1, recompute=False) == \
        sp.activation_bytes(gpt, 10, 3, 1, recompute=False)
