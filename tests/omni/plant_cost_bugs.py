"""Mutation check of the planner's cost model: plant each known bug in a temporary copy of the
package, run the planner tests there, and report which tests caught it. Nothing in the working
tree is modified.

    python tests/omni/plant_cost_bugs.py            # all plants
    python tests/omni/plant_cost_bugs.py "free all-reduce"

Every plant must make at least one test fail (exit status 1 if one does not).
"""
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLANTS = [
 ("free all-reduce", "lightning_omni/plan/costs.py",
  "        return 2 * (group - 1) * alpha + 2 * (group - 1) / group * nbytes / bw",
  "        return 0.0 * nbytes"),
 ("free all-to-all", "lightning_omni/plan/costs.py",
  "        return (group - 1) * alpha + (group - 1) / group * nbytes_per_rank / bw",
  "        return 0.0"),
 ("free all-to-all (exchange)", "lightning_omni/plan/costs.py",
  "        return float((group - 1) * alpha + nbytes / bw)",
  "        return 0.0"),
 ("free inter-node p2p", "lightning_omni/plan/costs.py",
  "        return hw.ib_latency_s + nbytes / hw.ib_bytes_per_s",
  "        return 0.0"),
 ("no causal attention term", "lightning_omni/plan/costs.py",
  "        return (2.0 if self.causal else 4.0) * self.hidden",
  "        return 4.0 * self.hidden"),
 ("backward equal to forward", "lightning_omni/plan/costs.py",
  "    backward_factor: float = 2.0\n    attention_backward_factor: float = 2.5",
  "    backward_factor: float = 1.0\n    attention_backward_factor: float = 1.0"),
 ("lightest replica simulated", "lightning_omni/plan/pricing.py",
  "    slowest_r, slowest_pr, slowest = max(\n",
  "    slowest_r, slowest_pr, slowest = min(\n"),
 ("lightest replica simulated (bounded path)", "lightning_omni/plan/pricing.py",
  "    chosen = order if simulate_replicas is None else order[:max(1, simulate_replicas)]",
  "    chosen = order[-1:]"),
 ("no DP gradient sync", "lightning_omni/plan/pricing.py",
  "        return float(sum(self.cost.allreduce_seconds(b, g, inside) for b, g, inside in parts))",
  "        return 0.0"),
 ("free Ulysses all-to-all", "lightning_omni/plan/pricing.py",
  "        return enc.layers * 4 * lens * enc.hidden * BYTES_BF16 / tp / \\\n"
  "            self.scenario.hardware.nvlink_bytes_per_s",
  "        return 0.0 * lens"),
 ("free Ulysses all-to-all (sp_seconds)", "lightning_omni/plan/lssp.py",
  "        return self.seconds / degree + self.alltoall_seconds * (degree - 1) / degree**2",
  "        return self.seconds / degree"),
 ("interleaved warm-up one chunk per stage short", "lightning_omni/plan/interleaved.py",
  "    return min(2 * (num_stages - stage - 1) + (num_chunks - 1) * num_stages, total)",
  "    return min((num_stages - stage - 1) + (num_chunks - 1) * num_stages, total)"),
 ("free interleaved chunk messages", "lightning_omni/plan/pricing.py",
  "            if a.payload in (Payload.ACTIVATION, Payload.GRADIENT):\n",
  "            if a.payload in (Payload.ACTIVATION, Payload.GRADIENT) and a.chunk:\n"
  "                return 0.0\n"
  "            if a.payload in (Payload.ACTIVATION, Payload.GRADIENT):\n"),
 ("chunk activations by physical stage", "lightning_omni/plan/priced.py",
  "acts[stages, mbs]", "acts[stages % pr.schedule.num_stages, mbs]"),
 ("free feature transfers", "lightning_omni/plan/pricing.py",
  "        return self.cost.p2p_seconds(nbytes, inside)",
  "        return 0.0"),
 ("H100 NVLink counted in both directions", "lightning_omni/plan/costs.py",
  "H100_80G = Hardware(\"H100-SXM-80G\", peak_flops=989e12, hbm_bytes=80e9,\n"
  "                    nvlink_bytes_per_s=450e9",
  "H100_80G = Hardware(\"H100-SXM-80G\", peak_flops=989e12, hbm_bytes=80e9,\n"
  "                    nvlink_bytes_per_s=900e9"),
 ("A100 peak with 2:4 sparsity", "lightning_omni/plan/costs.py",
  "peak_flops=312e12", "peak_flops=624e12"),
 ("H800 InfiniBand in bits", "lightning_omni/plan/costs.py",
  "                    nvlink_bytes_per_s=200e9, ib_bytes_per_s=50e9)",
  "                    nvlink_bytes_per_s=200e9, ib_bytes_per_s=400e9)"),
 ("encoder attention from the mean length (per call)", "lightning_omni/plan/costs.py",
  "        attention = model.attention_flops_per_token_sq * lens * lens\n",
  "        attention = model.attention_flops_per_token_sq * lens * lens.mean()\n"),
 ("encoder attention from the mean length (batch)", "lightning_omni/plan/costs.py",
  "np.array([(lens * lens).sum()])", "np.array([lens.sum() ** 2 / max(lens.size, 1)])"),
 ("balancing cost from the mean encoder length", "lightning_omni/plan/step_data.py",
  "        self.enc_unit = (cost.stack_seconds_each(enc, self.enc_tokens, enc.layers,",
  "        self.enc_unit = (cost.stack_seconds_each(enc, np.full_like(self.enc_tokens, "
  "self.enc_tokens.mean()), enc.layers,"),
]
TESTS = ["tests/omni/test_costs.py", "tests/omni/test_pricing.py", "tests/omni/test_systems.py",
         "tests/omni/test_run_prediction.py", "tests/omni/test_lssp.py",
         "tests/omni/test_interleaved.py"]
# An editable install would import the working tree's package: drop its finder, put the copy first.
RUNNER = ("import sys\n"
          "sys.meta_path = [f for f in sys.meta_path if 'editable' not in repr(f).lower() and "
          "'editable' not in getattr(type(f), '__module__', '').lower()]\n"
          "sys.path.insert(0, '.')\n"
          "import pytest\nsys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', *sys.argv[1:]]))\n")
only = sys.argv[1:]
ROOT = Path(tempfile.mkdtemp(prefix="omni-plant-"))
shutil.copytree(REPO / "lightning_omni", ROOT / "lightning_omni")
shutil.copytree(REPO / "tests" / "omni", ROOT / "tests" / "omni")
shutil.copytree(REPO / "docs" / "omni", ROOT / "docs" / "omni")  # the presets' sources
shutil.copy(REPO / "pyproject.toml", ROOT / "pyproject.toml")
missed = []
for name, rel, old, new in PLANTS:
    if only and name not in only:
        continue
    path = ROOT / rel
    orig = path.read_text()
    assert orig.count(old) == 1, (name, orig.count(old))
    path.write_text(orig.replace(old, new))
    try:
        r = subprocess.run([sys.executable, "-c", RUNNER, *TESTS], cwd=ROOT,
                           capture_output=True, text=True)
    finally:
        path.write_text(orig)
    failed = [ln.split(" - ")[0].replace("FAILED ", "") for ln in r.stdout.splitlines()
              if ln.startswith("FAILED")]
    summary = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-300:]
    print(f"{name:38} rc={r.returncode} {summary}")
    for f in failed:
        print(f"    {f}")
    if r.returncode != 1 or not failed:
        missed.append(name)
    sys.stdout.flush()
shutil.rmtree(ROOT, ignore_errors=True)
if missed:
    print(f"NOT caught: {missed}")
sys.exit(1 if missed else 0)
