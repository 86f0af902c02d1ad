"""UniLab on a machine with many cores and one CUDA GPU: a short check (under 10 minutes).

1. ``rl_scaling.py`` over all the machine's cores (1, 2, 4, ... up to all): the collector alone
   and full APPO training of the G1 recipe, env steps/s;
2. ``rl_cycle.py`` at the seed's shape (G1, 4096 envs, T=24, MLP 512-256-128) with the learner
   on the GPU and the collector on every other core: collect, update, sync and async cycles,
   ring and host-to-device copies, beside the seed's 39.25 / 102.37 / 94.61 ms;
3. five minutes of the g1-walk-flat recipe as shipped with ``--trainer.accelerator gpu``: the
   curve of rollout return and env steps/s against time (JSON and a PNG).

    python benchmarks/device_check_unilab.py --out-dir build/device_check_unilab

Each part is a subprocess writing its JSON under ``--out-dir``; a failed part is reported and
the next one still runs. Without CUDA it says so and exits with status 2; ``--device cpu``
runs the same parts on the CPU with short budgets, as a smoke test of the script.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


def _run(name: str, cmd: list[str], log: Path, timeout: float) -> dict:
    t0 = time.time()
    with log.open("w") as f:
        try:
            rc = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT,
                                timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    status = {"part": name, "returncode": rc, "seconds": round(time.time() - t0, 1),
              "log": str(log)}
    print(json.dumps(status), flush=True)
    return status


def g1_curve(log_root: Path) -> dict:
    """Return and env steps/s against wall time from the run's TensorBoard events."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = sorted(log_root.rglob("events.out.tfevents.*"))[-1:]
    ea = EventAccumulator(str(events.parent))
    ea.Reload()
    out = {}
    for tag in ("rollout/episode_return", "rollout/env_steps_per_s", "rollout/env_steps"):
        if tag in ea.Tags()["scalars"]:
            rows = ea.Scalars(tag)
            out[tag] = [[round(r.wall_time - rows[0].wall_time, 2), r.value] for r in rows]
    return out


def plot_curve(curve: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for ax, tag in zip(axes, ("rollout/episode_return", "rollout/env_steps_per_s"),
                       strict=True):
        points = curve.get(tag, [])
        ax.plot([p[0] for p in points], [p[1] for p in points])
        ax.set_xlabel("seconds")
        ax.set_title(tag)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--out-dir", type=Path, default=REPO / "build/device_check_unilab")
    p.add_argument("--train-seconds", type=int, default=300, help="part 3's G1 training")
    p.add_argument("--scaling-seconds", type=int, default=20, help="part 1, per core count")
    args = p.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("device_check_unilab: no CUDA device here; nothing was checked (--device cpu "
              "runs the script on the CPU)", file=sys.stderr)
        return 2
    gpu = args.device == "cuda"
    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    cpus = len(os.sched_getaffinity(0))
    accelerator = "gpu" if gpu else "cpu"
    train_s = args.train_seconds if gpu else min(args.train_seconds, 60)
    parts = [
        ("scaling", [PY, "benchmarks/rl_scaling.py", "--seconds", str(args.scaling_seconds),
                     "--out", str(out / "rl_scaling.json")], 300),
        ("cycle", [PY, "benchmarks/rl_cycle.py", "--accelerator", accelerator,
                   "--collector-threads", str(max(1, cpus - 1)), "--steps", "4",
                   *([] if gpu else ["--num-envs", "256"]),
                   "--out", str(out / "rl_cycle.json")], 240),
        ("g1_train", [PY, "-m", "lightning_unilab.train", "--config",
                      "recipes/unilab/g1_walk_flat.yaml", "--trainer.accelerator", accelerator,
                      "--trainer.max_time", time.strftime("00:%H:%M:%S", time.gmtime(train_s)),
                      "--trainer.default_root_dir", str(out / "g1_run"),
                      "--trainer.callbacks", "[]", "--trainer.enable_checkpointing", "false"],
         train_s + 120),
    ]
    summary = {"device": torch.cuda.get_device_name() if gpu else "cpu", "cpus": cpus,
               "parts": []}
    for name, cmd, timeout in parts:
        summary["parts"].append(_run(name, cmd, out / f"{name}.log", timeout))
    try:
        curve = g1_curve(out / "g1_run")
        (out / "g1_curve.json").write_text(json.dumps(curve))
        plot_curve(curve, out / "g1_curve.png")
    except Exception as err:  # report, the other parts' results stand
        summary["g1_curve_error"] = f"{type(err).__name__}: {err}"
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return 0 if all(s["returncode"] == 0 for s in summary["parts"]) else 1


if __name__ == "__main__":
    sys.exit(main())
