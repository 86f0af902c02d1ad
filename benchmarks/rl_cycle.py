"""RL training cycle: collection and update in turn (sync PPO) against overlapped (APPO).

G1 walk (flat) with the MLP 512-256-128 actor-critic; the collector process and the learner use
one CPU thread each (2 cores). Measured, in this order:

- ``collect_ms``: one N x T rollout alone (in this process, no learner running);
- ``update_ms``: one APPO update on one slot alone (epochs x minibatches, no collector running);
- ``sync_cycle_ms`` / ``async_cycle_ms``: wall time per training step in steady state of a
  Trainer.fit on RolloutDataModule(mode="sync" / "async"), median over the measured steps;
- ``env_steps_per_s_*``: N*T / cycle; ``mean_policy_lag``: updates between the weights that
  collected a slot and the weights it updates (async);
- ``ring_copy_ms``: time the learner spends turning a ready slot into tensors (zero-copy views);
- ``*_sync_run`` / ``*_async_run``: collect and update times inside the two fits (the collector
  reports its own time per rollout): in turn, and side by side. Where they grow in the async
  run, the two processes did not get a core each (a machine shared with other work).

Unless ``--epochs`` is given, the update's epochs are chosen from the measured collect and
update times so that the two are as close as the whole numbers allow (the overlap can gain at
most 2x when they are equal); the JSON records the ratio.

- ``h2d_copy_ms``: with the learner on a GPU (``--accelerator gpu``), one slot's tensors copied
  to the device from the ring (pinned, non-blocking) and from ordinary memory, for comparison.

The seed's figures for its training-cycle end (G1, 4096 envs, T=24, the same MLP: UniLab
39.25 ms with CPU simulation and a GPU learner; UniLab + MJWarp 102.37 ms and Holosoma + MJWarp
94.61 ms with both on one GPU) are printed beside the measured cycles. ``--num-envs`` defaults to
4096 where memory allows (1024 otherwise), as the seed's shape; on a 2-core machine a 4096-env
rollout takes about a minute, so pass ``--num-envs 1024 --steps 4`` there.

    flock /tmp/omnilab-bench.lock python benchmarks/rl_cycle.py [--quick] --out FILE.json
    python benchmarks/rl_cycle.py --accelerator gpu --out FILE.json      # the learner on a GPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, IterableDataset

from lightning_unilab.envs.vector_env import TaskVectorEnv
from lightning_unilab.learner.appo import APPOModule
from lightning_unilab.learner.policy import ActorCritic
from lightning_unilab.runtime.data import EnvSpec, RolloutDataModule
from lightning_unilab.runtime.rollout import RolloutSpec, RolloutState, as_tensors, collect

TASK = "g1-walk-flat"
HIDDEN = (512, 256, 128)
MINIBATCHES = 4
TARGETS = {"async_vs_max": 1.15, "sync_vs_async": 1.5, "copy_vs_update": 0.05, "balance": 0.3}
# the seed's training-cycle end, ms (G1, 4096 envs, T=24, MLP 512-256-128)
SEED_CYCLE_MS = {"UniLab (CPU sim, GPU learner)": 39.25, "UniLab + MJWarp (one GPU)": 102.37,
                 "Holosoma + MJWarp (one GPU)": 94.61}


class CycleTimer(Callback):
    """Per training step: start time, update time, policy lag, reader wait."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.updates: list[float] = []
        self.lags: list[int] = []
        self.collect_s: list[float] = []  # the collector's own time per rollout (stats)
        self._t0 = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._t0 = time.perf_counter()
        self.starts.append(self._t0)
        stats = batch.get("stats", {})
        if "policy_version" in stats:
            self.lags.append(pl_module.policy_version - int(stats["policy_version"]))
        if stats.get("env_steps_per_s", 0) > 0:
            self.collect_s.append(batch["rewards"].numel() / stats["env_steps_per_s"])

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.updates.append(time.perf_counter() - self._t0)


class _Repeat(IterableDataset):
    def __init__(self, batch: dict[str, Any]) -> None:
        self.batch = batch

    def __iter__(self):
        while True:
            yield self.batch


class FixedSlot(pl.LightningDataModule):
    """One collected slot, served again and again: the update alone."""

    def __init__(self, batch: dict[str, Any], spec: RolloutSpec) -> None:
        super().__init__()
        self.batch = batch
        self.env_spec = EnvSpec(spec.obs_size, spec.critic_size, spec.action_size)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_Repeat(self.batch), batch_size=None, collate_fn=lambda b: b)


ACCELERATOR = "cpu"  # --accelerator: where the learner runs


def _trainer(steps: int, epochs: int, timer: CycleTimer) -> pl.Trainer:
    return pl.Trainer(accelerator=ACCELERATOR, devices=1, max_steps=steps * epochs * MINIBATCHES,
                      max_epochs=-1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[timer])


def _module(epochs: int) -> APPOModule:
    return APPOModule(actor_hidden=HIDDEN, critic_hidden=HIDDEN, epochs=epochs,
                      minibatches=MINIBATCHES)


def measure_collect(n: int, t: int, reps: int, threads: int = 1,
                    task: str = TASK) -> tuple[float, dict[str, Any], RolloutSpec]:
    """One N x T rollout in this process: ``threads`` physics threads, the actor on one."""
    env = TaskVectorEnv(task, n, threads, seed=0)
    spec = RolloutSpec.from_env(env, t)
    policy = ActorCritic(spec.obs_size, spec.critic_size, spec.action_size, HIDDEN, HIDDEN)
    state = RolloutState.start(env, seed=0)
    arrays = spec.allocate()
    collect(env, policy, arrays, state)  # warm-up: first resets, allocator
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        collect(env, policy, arrays, state)
        times.append(time.perf_counter() - t0)
    env.close()
    return 1e3 * statistics.median(times), as_tensors(arrays), spec


def measure_update(batch: dict[str, Any], spec: RolloutSpec, epochs: int, reps: int) -> float:
    timer = CycleTimer()
    _trainer(reps + 1, epochs, timer).fit(_module(epochs), datamodule=FixedSlot(batch, spec))
    return 1e3 * statistics.median(timer.updates[1:])


def measure_cycle(mode: str, n: int, t: int, epochs: int, steps: int, warmup: int,
                  threads: int = 1) -> dict:
    timer = CycleTimer()
    dm = RolloutDataModule(TASK, num_envs=n, horizon=t, mode=mode, collector_threads=threads,
                           seed=0)
    _trainer(steps + warmup, epochs, timer).fit(_module(epochs), datamodule=dm)
    gaps = [b - a for a, b in zip(timer.starts[warmup:-1], timer.starts[warmup + 1:],
                                  strict=True)]
    return {"cycle_ms": 1e3 * statistics.median(gaps),
            "lag": statistics.mean(timer.lags[warmup:]) if timer.lags else float("nan"),
            "ring_copy_ms": 1e3 * dm.ring_copy_s / max(dm.slots_read, 1),
            "update_ms_in_run": 1e3 * statistics.median(timer.updates[warmup:]),
            "collect_ms_in_run": 1e3 * statistics.median(timer.collect_s[warmup:])}


def measure_h2d(batch: dict[str, Any], reps: int = 5) -> dict[str, float] | None:
    """One slot's tensors to the GPU: from page-locked memory (non-blocking, as the learner's
    ring slots) and from ordinary memory; None without CUDA."""
    if not torch.cuda.is_available():
        return None
    tensors = [v for v in batch.values() if isinstance(v, torch.Tensor)]
    out = {}
    for name, source in (("pinned", [t.pin_memory() for t in tensors]),
                         ("pageable", [t.clone() for t in tensors])):
        times = []
        for _ in range(reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for t in source:
                t.to("cuda", non_blocking=name == "pinned")
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        out[f"h2d_{name}_ms"] = 1e3 * statistics.median(times)
    out["slot_mb"] = sum(t.numel() * t.element_size() for t in tensors) / 1e6
    return out


def default_num_envs() -> int:
    """The seed's 4096 where memory allows (a G1 env and its ring rows: ~0.5 MB), else 1024."""
    import psutil

    return 4096 if psutil.virtual_memory().available > 8e9 else 1024


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer envs and steps (~1 min)")
    parser.add_argument("--num-envs", type=int, default=None)
    parser.add_argument("--horizon", type=int, default=24)
    parser.add_argument("--epochs", type=int, default=None, help="default: balance collect")
    parser.add_argument("--steps", type=int, default=None, help="measured training steps")
    parser.add_argument("--collector-threads", type=int, default=1,
                        help="physics threads of the collector (default 1: the 2-core split)")
    parser.add_argument("--accelerator", choices=("cpu", "gpu"), default="cpu",
                        help="where the learner runs (the collector always on CPU)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    global ACCELERATOR
    ACCELERATOR = args.accelerator
    n = args.num_envs or (128 if args.quick else default_num_envs())
    t = args.horizon
    steps = args.steps or (6 if args.quick else 8)
    warmup = 2
    torch.set_num_threads(1)  # the learner's one core; the collector process takes the other

    threads = args.collector_threads
    collect_ms, batch, spec = measure_collect(n, t, reps=3, threads=threads)
    probe_epochs = 2
    probe_ms = measure_update(batch, spec, probe_epochs, reps=2)
    epochs = args.epochs or max(1, min(10, round(probe_epochs * collect_ms / probe_ms)))
    update_ms = measure_update(batch, spec, epochs, reps=3)
    sync = measure_cycle("sync", n, t, epochs, steps, warmup, threads)
    async_ = measure_cycle("async", n, t, epochs, steps, warmup, threads)

    result = {
        "task": TASK, "num_envs": n, "horizon": t, "epochs": epochs, "minibatches": MINIBATCHES,
        "hidden": list(HIDDEN), "collector_threads": threads, "learner_threads": 1,
        "collect_ms": collect_ms, "update_ms": update_ms,
        "update_vs_collect": update_ms / collect_ms,
        "sync_cycle_ms": sync["cycle_ms"], "async_cycle_ms": async_["cycle_ms"],
        "env_steps_per_s_sync": n * t / (sync["cycle_ms"] / 1e3),
        "env_steps_per_s_async": n * t / (async_["cycle_ms"] / 1e3),
        "mean_policy_lag": async_["lag"], "sync_policy_lag": sync["lag"],
        "ring_copy_ms": async_["ring_copy_ms"],
        # the same two times inside the fits: alone in turn (sync) and side by side (async);
        # on a machine shared with other work they show how much the overlap was squeezed
        "collect_ms_sync_run": sync["collect_ms_in_run"],
        "update_ms_sync_run": sync["update_ms_in_run"],
        "collect_ms_async_run": async_["collect_ms_in_run"],
        "update_ms_async_run": async_["update_ms_in_run"],
    }
    bound = max(collect_ms, update_ms)
    balanced = abs(update_ms / collect_ms - 1) <= TARGETS["balance"]
    result["checks"] = {
        "balanced_within_30pct": balanced,
        "async_vs_max": result["async_cycle_ms"] / bound,
        "async_vs_max_ok": result["async_cycle_ms"] <= TARGETS["async_vs_max"] * bound,
        "sync_vs_async": result["sync_cycle_ms"] / result["async_cycle_ms"],
        "sync_vs_async_ok": (result["sync_cycle_ms"] / result["async_cycle_ms"]
                             >= TARGETS["sync_vs_async"]) if balanced else None,
        "copy_vs_update": result["ring_copy_ms"] / update_ms,
        "copy_vs_update_ok": result["ring_copy_ms"] <= TARGETS["copy_vs_update"] * update_ms,
        "async_vs_max_of_sync_run": result["async_cycle_ms"] / max(sync["collect_ms_in_run"],
                                                                   sync["update_ms_in_run"]),
    }
    result["accelerator"] = args.accelerator
    result["h2d"] = measure_h2d(batch)
    result["seed_cycle_ms"] = SEED_CYCLE_MS
    _print(result)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
    return result


def _print(r: dict[str, Any]) -> None:
    c = r["checks"]
    verdict = {True: "ok", False: "MISSED", None: "not balanced"}
    rows = [
        ("config", f"{r['task']} N={r['num_envs']} T={r['horizon']} epochs={r['epochs']}x"
                   f"{r['minibatches']} MLP {r['hidden']}, {r['collector_threads']}+1 threads, "
                   f"learner on "
                   f"{r['accelerator']}"),
        ("collect_ms (alone)", f"{r['collect_ms']:.1f}"),
        ("update_ms (alone)", f"{r['update_ms']:.1f}  "
                              f"(update/collect {r['update_vs_collect']:.2f})"),
        ("sync_cycle_ms", f"{r['sync_cycle_ms']:.1f}"),
        ("async_cycle_ms", f"{r['async_cycle_ms']:.1f}"),
        ("env_steps_per_s sync/async", f"{r['env_steps_per_s_sync']:.0f} / "
                                       f"{r['env_steps_per_s_async']:.0f}"),
        ("collect/update in sync run", f"{r['collect_ms_sync_run']:.1f} / "
                                       f"{r['update_ms_sync_run']:.1f}"),
        ("collect/update in async run", f"{r['collect_ms_async_run']:.1f} / "
                                        f"{r['update_ms_async_run']:.1f}"),
        ("mean_policy_lag (async)", f"{r['mean_policy_lag']:.2f}"),
        ("ring_copy_ms", f"{r['ring_copy_ms']:.3f}"),
        ("async / max(collect, update)", f"{c['async_vs_max']:.2f}  (target <= 1.15: "
                                         f"{'ok' if c['async_vs_max_ok'] else 'MISSED'})"),
        ("sync / async", f"{c['sync_vs_async']:.2f}  (target >= 1.5 when balanced: "
                         f"{verdict[c['sync_vs_async_ok']]})"),
        ("ring_copy / update", f"{c['copy_vs_update']:.4f}  (target <= 0.05: "
                               f"{'ok' if c['copy_vs_update_ok'] else 'MISSED'})"),
    ]
    if r.get("h2d"):
        h = r["h2d"]
        rows.append(("h2d copy pinned/pageable", f"{h['h2d_pinned_ms']:.2f} / "
                                                 f"{h['h2d_pageable_ms']:.2f} ms "
                                                 f"({h['slot_mb']:.1f} MB slot)"))
    for name, ms in r["seed_cycle_ms"].items():
        rows.append((f"seed: {name}", f"{ms:.2f} ms at 4096 envs"))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
