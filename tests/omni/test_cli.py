import json
from pathlib import Path

import pytest
import yaml

from lightning_omni.cli import main
from lightning_omni.workload_yaml import WorkloadError, load_workload, parse_workload

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "omni_plan"

TINY_VIT = {"name": "tiny-vit", "layers": 4, "hidden": 512, "heads": 8, "ffn_hidden": 2048,
            "causal": False}
TINY_LLM = {"name": "tiny-llm", "layers": 8, "hidden": 1024, "heads": 16, "ffn_hidden": 4096,
            "vocab": 32000}
TINY = {
    "name": "tiny",
    "models": {"encoder": TINY_VIT, "llm": TINY_LLM},
    "cluster": {"gpus": 8, "hardware": "H100-SXM-80G"},
    "batch": {"global_batch": 4, "seq_len": 2048},
    "mixture": {"kind": "image_text", "ratios": [0.2, 0.8]},
}


def _write(tmp_path: Path, data) -> Path:
    path = tmp_path / "w.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def test_shipped_recipes_parse():
    files = sorted(RECIPES.glob("*.yaml"))
    assert len(files) >= 3
    for f in files:
        req = load_workload(f)
        assert req.scenarios and req.systems
    assert any(load_workload(f).run is not None for f in files)


def test_omni_plan_prints_run_level_and_writes_plots(tmp_path, capsys):
    data = dict(TINY, run={"phases": [{"share": 0.8, "share_sd": 0.05, "steps": 1},
                                      {"share": 0.3, "share_end": 0.1, "steps": 2}],
                           "sampled_steps": 3})
    out = tmp_path / "out"
    assert main([str(_write(tmp_path, data)), "--out-dir", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Omni" in text and "Megatron-like" in text and "best baseline" in text
    assert "one layout per system" in text and "OOM steps" in text
    summary = json.loads((out / "summary.json").read_text())
    assert {r["system"] for r in summary["run"]} == {"megatron", "disaggregated", "omni"}
    for row in summary["run"]:
        assert row["tokens_per_s_p5"] <= row["tokens_per_s_mean"] * 1.0001
        assert row["tokens_per_s_mean"] <= row["tokens_per_s_p95"] * 1.0001
    assert (out / "throughput.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "timeline.png").stat().st_size > 1000


def test_custom_model_hardware_and_yaml_float_strings():
    # YAML 1.1 reads 8.0e9 (no sign in the exponent) as a string: accept it as a number
    text = yaml.safe_dump(dict(TINY, cluster={"gpus": 8, "hardware": {
        "preset": "A100-SXM-80G"}})).replace("preset: A100-SXM-80G",
                                             "preset: A100-SXM-80G\n    hbm_bytes: 8.0e9")
    data = yaml.safe_load(text)
    assert data["cluster"]["hardware"]["hbm_bytes"] == "8.0e9"
    req = parse_workload(data)
    sc = req.scenarios[0][1]
    assert sc.encoder.name == "tiny-vit" and sc.hardware.hbm_bytes == 8.0e9
    assert sc.hardware.name == "A100-SXM-80G"


BAD = [
    # (patch, text that must appear in the message)
    ({"models": {"encoder": "ViT-99B", "llm": "LLaMA-12B"}},
     "models.encoder.preset: expected one of"),
    ({"cluster": {"gpus": 8, "hardware": "H100-SXM-8G"}},
     "did you mean 'H100-SXM-80G'"),
    ({"cluster": {"gpus": "many"}}, "cluster.gpus: expected a valid integer"),
    ({"cluster": {"gpus": 1}}, "cluster.gpus: expected >= 2"),
    ({"cluster": {"gpus": 8, "hardware": {"hbm_bytes": "lots"}}},
     "cluster.hardware.hbm_bytes: expected a valid number"),
    ({"mixture": {"ratios": [1.5]}}, "mixture.ratios"),
    ({"mixture": {"kind": "video"}}, "mixture.kind: expected 'image_text' or 'audio'"),
    ({"mixture": {"long_share": 5}}, "mixture.long_share: expected less than or equal to 1"),
    ({"systems": ["omni", "zero"]}, "systems[1]"),
    ({"batch": {"seq_len": 4096}}, "batch.global_batch: expected a value, got nothing"),
    ({"batch": {"global_batch": 4, "seqlen": 4096}},
     "batch.seqlen: unknown key; expected one of ['global_batch', 'seq_len']"),
    ({"sytems": ["omni"]}, "did you mean 'systems'"),
    ({"disaggregated_encoder_gpus": [64]}, "disaggregated_encoder_gpus: expected sizes in"),
    ({"disaggregated_encoder_gpus": [1], "systems": ["disaggregated"]},
     "disaggregated_encoder_gpus: expected a GPU count that some layout"),
    ({"seed": -1}, "seed: expected greater than or equal to 0, got -1"),
    ({"run": {"phases": [{"share": 0.5, "stepz": 3}]}}, "run.phases[0].stepz: unknown key"),
    ({"profile": "bad.json"}, "profile: expected valid JSON"),
    ({"grid": {"vp": [2]}}, "grid.vp: unknown key; expected one of ['pp', 'tp', 'vpp'], "
                            "got 'vp'; did you mean 'vpp'?"),
    ({"grid": {"vpp": [0, 2]}}, "grid.vpp: expected ints >= 1, got [0, 2]"),
    ({"grid": {"tp": [3]}}, "cluster.gpus: expected a GPU count that some layout"),
]


@pytest.mark.parametrize("patch, message", BAD, ids=[m[:40] for _, m in BAD])
def test_bad_yaml_exits_2_naming_key_expected_and_got(patch, message, tmp_path, capsys):
    (tmp_path / "bad.json").write_text("{not json")
    data = dict(TINY, **patch)
    with pytest.raises(WorkloadError, match=None) as info:
        parse_workload(data, tmp_path)
    assert message in str(info.value)
    assert main([str(_write(tmp_path, data)), "--no-plots", "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_yaml_syntax_error_exits_2(tmp_path, capsys):
    path = _write(tmp_path, "name: x\nmodels: {encoder: ViT-1B\n  llm: [\n")
    assert main([str(path), "--no-plots", "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "expected valid YAML, got a syntax error at line" in err


def test_nothing_fits_says_why(tmp_path, capsys):
    data = dict(TINY, models={"encoder": TINY_VIT, "llm": "GPT-175B"}, systems=["megatron"],
                mixture={"ratios": [0.5]})
    assert main([str(_write(tmp_path, data)), "--no-plots", "--out-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "no layout of Megatron-like fits: the smallest peak memory found is" in out
    assert "against a cap of 73.6 GB" in out


def test_pinned_encoder_pool_is_used(tmp_path, capsys):
    path = _write(tmp_path, dict(TINY, systems=["disaggregated"],
                                 disaggregated_encoder_gpus=[2]))
    assert main([str(path), "--no-plots", "--out-dir", str(tmp_path)]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "Disaggregated" in ln]
    assert lines and all("enc2gpu" in ln for ln in lines)


def test_grid_from_yaml_offers_interleaved_layouts(tmp_path, capsys):
    """``grid.vpp`` reaches the search: a layout with model chunks is printed as VPP."""
    req = parse_workload(dict(TINY, grid={"vpp": [2, 1], "pp": [2]}))
    assert req.grid.vpp == (1, 2) and req.grid.pp == (2,)
    assert parse_workload(TINY).grid.vpp == (1, 2)  # the default grid
    data = dict(TINY, systems=["megatron"], grid={"vpp": [2], "pp": [2]},
                batch={"global_batch": 8, "seq_len": 2048})
    assert main([str(_write(tmp_path, data)), "--no-plots", "--out-dir", str(tmp_path)]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "Megatron" in ln]
    assert lines and all("PP2 VPP2" in ln for ln in lines)


def test_missing_file():
    with pytest.raises(WorkloadError, match="existing YAML"):
        load_workload("/nonexistent.yaml")
