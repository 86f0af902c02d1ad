"""Env steps/s against cores: the collector alone, and full APPO training, on 1, 2, 4, ... cores.

For each core count c the process (and the collector processes it starts) is pinned to the first
c CPUs it may use, which is how a machine with c cores looks to the code (``available_cpus``):

- ``collect``: one N x T rollout of the recipe's task after warm-up, in this process, with c
  physics threads and the actor's inference on one torch thread (``rl_cycle.measure_collect``);
- ``train``: the recipe as shipped (its defaults choose the collector's threads from the cores),
  through ``UniLabCLI`` for ``--seconds``, without its checkpoint and evaluation callbacks.
  ``train_env_steps_per_s`` counts the env steps the learner trained on; the collected rate
  (``collected_env_steps_per_s``) also counts rollouts the learner skipped as stale
  (``read_newest``). Both over the run's second half, after start-up.

    python benchmarks/rl_scaling.py --out build/rl_scaling.json
    python benchmarks/rl_scaling.py --cores 1 2 --seconds 60   # this 2-core machine's check

JSON: ``{"cores": [...], "collect_env_steps_per_s": [...], "train_env_steps_per_s": [...], ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rl_cycle import measure_collect  # noqa: E402

from lightning_unilab.learner.appo import APPOModule  # noqa: E402
from lightning_unilab.runtime.collector import available_cpus  # noqa: E402
from lightning_unilab.runtime.data import RolloutDataModule  # noqa: E402
from lightning_unilab.train import UniLabCLI  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes/unilab/g1_walk_flat.yaml"
TARGET_2_OVER_1 = 1.7


class StepClock(Callback):
    """Per training step: time, the collector's env-step count, the slot's env steps."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, int, int]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        stats = batch.get("stats", {})
        self.rows.append((time.perf_counter(), int(stats.get("env_steps", 0)),
                          int(batch["rewards"].numel())))


def core_counts(available: int) -> list[int]:
    """1, 2, 4, ... up to ``available``, which is always included."""
    counts, c = [], 1
    while c < available:
        counts.append(c)
        c *= 2
    return counts + [available]


def measure_training(recipe: Path, seconds: float, extra: list[str] = (),
                     learner_threads: int = 1) -> dict[str, float]:
    clock = StepClock()
    cli = UniLabCLI(APPOModule, RolloutDataModule, run=False, seed_everything_default=0,
                    save_config_callback=None, args=["--config", str(recipe), "--trainer.max_time",
                          time.strftime("00:%H:%M:%S", time.gmtime(seconds)),
                          "--trainer.callbacks", "[]", "--trainer.logger", "false",
                          "--trainer.enable_checkpointing", "false",
                          "--trainer.enable_progress_bar", "false", *extra])
    cli.trainer.callbacks.append(clock)
    torch.set_num_threads(learner_threads)  # async mode's default: 1
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    rows = clock.rows[len(clock.rows) // 2:]
    if len(rows) < 2:
        raise RuntimeError(f"training: {len(clock.rows)} steps in {seconds} s; give more "
                           "--seconds")
    dt = rows[-1][0] - rows[0][0]
    return {"train_env_steps_per_s": sum(r[2] for r in rows[:-1]) / dt,
            "collected_env_steps_per_s": (rows[-1][1] - rows[0][1]) / dt,
            "collector_threads": cli.datamodule.config.threads, "steps": len(clock.rows)}


def _shown(path: Path) -> str:
    """A recipe's path relative to the repository where it lies inside it, else absolute."""
    path = path.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cores", type=int, nargs="+", default=None,
                   help="core counts (default: 1, 2, 4, ... up to this machine's)")
    p.add_argument("--seconds", type=float, default=90.0, help="training time per core count")
    p.add_argument("--recipe", type=Path, default=RECIPE)
    p.add_argument("--collector-threads", type=int, default=None,
                   help="override the recipe's default (the cores the learner leaves)")
    p.add_argument("--learner-threads", type=int, default=1,
                   help="torch threads of the learner (async mode's default: 1)")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    allowed = sorted(os.sched_getaffinity(0))
    cores = args.cores or core_counts(len(allowed))
    if max(cores) > len(allowed):
        p.error(f"--cores: at most {len(allowed)} here, got {max(cores)}")
    import yaml

    data = yaml.safe_load(args.recipe.read_text())["data"]
    n, t = int(data["num_envs"]), int(data["horizon"])
    out: dict[str, Any] = {"task": data["task"], "num_envs": n, "horizon": t,
                           "recipe": _shown(args.recipe),
                           "seconds": args.seconds, "learner_threads": args.learner_threads,
                           "cores": [],
                           "collect_env_steps_per_s": [], "train_env_steps_per_s": [],
                           "collected_env_steps_per_s": [], "collector_threads": []}
    try:
        for c in cores:
            os.sched_setaffinity(0, allowed[:c])
            assert available_cpus() == c
            torch.set_num_threads(1)
            collect_ms, _, _ = measure_collect(n, t, reps=5, threads=c, task=data["task"])
            extra = ([] if args.collector_threads is None else
                     ["--data.collector_threads", str(min(c, args.collector_threads))])
            train = measure_training(args.recipe, args.seconds, extra, args.learner_threads)
            out["cores"].append(c)
            out["collect_env_steps_per_s"].append(n * t / (collect_ms / 1e3))
            for key in ("train_env_steps_per_s", "collected_env_steps_per_s",
                        "collector_threads"):
                out[key].append(train[key])
            print(f"cores {c}: collect {out['collect_env_steps_per_s'][-1]:8.0f} env steps/s "
                  f"alone; training {train['train_env_steps_per_s']:8.0f} trained, "
                  f"{train['collected_env_steps_per_s']:8.0f} collected "
                  f"({train['collector_threads']} collector threads)", flush=True)
    finally:
        os.sched_setaffinity(0, allowed)
    if 1 in out["cores"] and 2 in out["cores"]:
        ratio = (out["collect_env_steps_per_s"][out["cores"].index(2)]
                 / out["collect_env_steps_per_s"][out["cores"].index(1)])
        out["collect_2_over_1"] = ratio
        print(f"collector, 2 cores / 1 core: {ratio:.2f} (target >= {TARGET_2_OVER_1})")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
