from pathlib import Path

import pytest
import yaml

from lightning_omni.cli import main
from lightning_omni.workload_yaml import WorkloadError, load_workload, parse_workload

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "omni_plan"

TINY = {
    "name": "tiny",
    "models": {"encoder": "ViT-1B", "llm": "LLaMA-12B"},
    "cluster": {"gpus": 16, "hardware": "H100-SXM-80G"},
    "batch": {"global_batch": 8, "seq_len": 4096},
    "mixture": {"kind": "image_text", "ratios": [0.2, 0.8]},
}


def test_shipped_recipes_parse():
    files = sorted(RECIPES.glob("*.yaml"))
    assert len(files) >= 3
    for f in files:
        req = load_workload(f)
        assert req.scenarios and req.systems


def test_omni_plan_prints_and_writes_plots(tmp_path, capsys):
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "out"
    assert main([str(path), "--out-dir", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Omni" in text and "Megatron-like" in text and "best baseline" in text
    for name in ("throughput.png", "timeline.png", "summary.json"):
        assert (out / name).stat().st_size > 1000 or name == "summary.json"
    assert (out / "throughput.png").read_bytes()[:4] == b"\x89PNG"


def test_custom_model_and_hardware_fields():
    data = dict(TINY, models={"encoder": {"name": "tiny-vit", "layers": 4, "hidden": 256,
                                          "heads": 4, "ffn_hidden": 1024, "causal": False},
                              "llm": "LLaMA-12B"},
                cluster={"gpus": 16, "hardware": {"preset": "A100-SXM-80G", "hbm_bytes": 40e9}})
    req = parse_workload(data)
    sc = req.scenarios[0][1]
    assert sc.encoder.name == "tiny-vit" and sc.hardware.hbm_bytes == 40e9


@pytest.mark.parametrize("patch, message", [
    ({"models": {"encoder": "ViT-99B", "llm": "LLaMA-12B"}}, "models.encoder"),
    ({"cluster": {"gpus": "many"}}, "cluster.gpus: expected int"),
    ({"mixture": {"ratios": [1.5]}}, "mixture.ratios"),
    ({"mixture": {"kind": "video"}}, "mixture.kind"),
    ({"systems": ["omni", "zero"]}, "systems"),
    ({"batch": {"seq_len": 4096}}, "batch.global_batch"),
    ({"disaggregated_encoder_gpus": [64]}, "disaggregated_encoder_gpus"),
])
def test_bad_yaml_names_the_field(patch, message, tmp_path, capsys):
    with pytest.raises(WorkloadError, match=message):
        parse_workload(dict(TINY, **patch))
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(dict(TINY, **patch)))
    assert main([str(path), "--no-plots", "--out-dir", str(tmp_path)]) == 2
    assert message.split(":")[0] in capsys.readouterr().err


def test_pinned_encoder_pool_is_used(tmp_path, capsys):
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(dict(TINY, systems=["disaggregated"],
                                        disaggregated_encoder_gpus=[4])))
    assert main([str(path), "--no-plots", "--out-dir", str(tmp_path)]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "Disaggregated" in ln]
    assert lines and all("enc4gpu" in ln for ln in lines)


def test_missing_file():
    with pytest.raises(WorkloadError, match="existing YAML"):
        load_workload("/nonexistent.yaml")
