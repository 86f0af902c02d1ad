"""benchmarks/omni_overhead.py --quick: both models under both strategies on 2 gloo processes;
the JSON has the steps/s of each and a positive finite ratio (no speed asserted: a shared
machine's timings say little), and the first-step losses agree (the same work)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_quick_run_writes_steps_per_s_and_ratio_per_model(tmp_path: Path) -> None:
    bench = _load("omni_overhead")
    out = tmp_path / "overhead.json"
    assert bench.main(["--quick", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert set(res["models"]) == set(bench.MODELS)
    for r in res["models"].values():
        for key in ("omni_steps_per_s", "ddp_steps_per_s", "ratio"):
            assert math.isfinite(r[key]) and r[key] > 0, (key, r[key])
        assert len(r["rounds"]["omni_steps_per_s"]) == len(r["rounds"]["ddp_steps_per_s"]) == 1
        assert r["first_loss_rel_diff"] < 1e-4
        omni = r["breakdown_ms"]["omni"]
        assert {"grad_allreduce", "llm_fwd", "optimizer", "lightning_loop"} <= set(omni)
        assert all(v >= 0 for k, v in omni.items() if k != "lightning_loop")
