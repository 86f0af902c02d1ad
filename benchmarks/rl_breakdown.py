"""Where one update cycle's time goes: our recipe (sync and async) and rsl_rl's PPO on our pool.

The recipe runs as ``python -m lightning_unilab.train`` runs it (LightningCLI, its logger and
callbacks), for ``--updates`` training steps after ``--warmup``; timers wrap the pieces of each
step in the learner process, and the collector process reports its own collect time per
rollout. The collector's split (physics against policy inference and the copies into the
ring) is measured by running the same ``collect`` in this process for ``--updates`` rollouts.
rsl_rl's ``OnPolicyRunner`` (rsl-rl-lib 5.x, ``RslRlVecEnv`` over the same pool, the recipe's
sizes and PPO settings as ``benchmarks/learning_curves.py`` maps them) is timed the same way.

Rows (ms per update cycle, median over the measured cycles):

- ``cycle``: wall time from one training step's start to the next one's;
- ``collect`` (collector process: physics, policy inference, copies), split in
  ``collect.physics``, ``collect.inference`` and ``collect.copies`` from the in-process run;
- ``handoff_wait``: the learner waiting for a ready ring slot (sync: the whole collection);
- ``host_copy``: turning the slot into tensors;
- ``prepare``: observation moments, value targets and advantages (V-trace / GAE);
- ``forward``, ``backward``, ``optimizer``: the minibatch steps' loss, ``manual_backward`` and
  ``LightningOptimizer.step``; ``lightning.backward`` and ``lightning.optimizer`` are what
  Lightning adds around torch's ``backward`` and ``Optimizer.step``;
- ``kl``: the whole-slot KL after the update; ``publish``: the weights to the collector;
- ``logging``: ``self.log``/``log_dict`` calls and the rollout metrics;
- ``lightning.step``: the rest of the cycle outside ``training_step`` and the hand-off
  (the loop, callbacks, logger writes, progress bar).

    flock /tmp/omnilab-bench.lock python benchmarks/rl_breakdown.py --out build/rl_breakdown.json
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
import yaml
from lightning.pytorch.callbacks import Callback

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "unilab" / "half_cheetah.yaml"


class Clock:
    """Seconds per named piece, summed within the current cycle."""

    def __init__(self) -> None:
        self.now: dict[str, float] = defaultdict(float)
        self.cycles: list[dict[str, float]] = []
        self._open: dict[str, int] = defaultdict(int)  # calls of a piece under way

    def wrap(self, obj: Any, name: str, key: str) -> None:
        """Time ``obj.name`` as ``key``; a call inside another call of the same piece (a
        ``log`` inside ``_log_rollout``) is counted once, by the outer one."""
        fn = getattr(obj, name)

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._open[key] += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._open[key] -= 1
                if not self._open[key]:
                    self.now[key] += time.perf_counter() - t0

        setattr(obj, name, timed)

    def close_cycle(self, **extra: float) -> None:
        self.cycles.append({**self.now, **extra})
        self.now = defaultdict(float)


def medians(cycles: list[dict[str, float]]) -> dict[str, float]:
    keys = sorted({k for c in cycles for k in c})
    return {k: 1e3 * statistics.median(c.get(k, 0.0) for c in cycles) for k in keys}


class _Cycles(Callback):
    """Closes a cycle at every training step's start: the wall time since the last start,
    the collector's own collect time of the slot the step trains on."""

    def __init__(self, clock: Clock, warmup: int, updates: int) -> None:
        self.clock, self.warmup, self.updates = clock, warmup, updates
        self.last: float | None = None
        self.step_s = 0.0
        self.collect_s = math.nan
        self.lag = 0.0
        self._t0 = 0.0

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        now = time.perf_counter()
        if self.last is not None:
            self.clock.close_cycle(cycle=now - self.last, training_step=self.step_s,
                                   collect=self.collect_s, lag=self.lag)
        self.last = now
        stats = batch.get("stats", {}) if isinstance(batch, dict) else {}
        n, rate = stats.get("env_steps_per_s"), None
        if n:
            rate = float(n)
        steps = batch["rewards"].numel() if "rewards" in batch else 0
        self.collect_s = steps / rate if rate else math.nan
        version = stats.get("policy_version")
        self.lag = float(module.policy_version - int(version)) if version is not None else 0.0
        self._t0 = now

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.step_s = time.perf_counter() - self._t0
        if len(self.clock.cycles) >= self.warmup + self.updates:
            trainer.should_stop = True


def _instrument_learner(clock: Clock, module, dm) -> None:
    import lightning_unilab.runtime.data as data_mod

    # (method of the module, row): the pieces of a training step
    for name, key in (("_log_rollout", "logging"), ("log", "logging"), ("log_dict", "logging"),
                      ("_emit", "logging"), ("prepare", "prepare"), ("_moments", "prepare"),
                      ("loss_terms", "forward"), ("manual_backward", "backward"),
                      ("_update_kl", "kl"), ("_publish", "publish")):
        clock.wrap(module, name, key)
    clock.wrap(dm, "_next", "handoff")
    clock.wrap(data_mod, "as_tensors", "host_copy")


class _InnerTimers(Callback):
    """Timers that need the fit's objects: torch's own backward and ``Optimizer.step``
    (under Lightning's), Lightning's optimizer wrapper, the collector's acquire."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def on_train_start(self, trainer, module) -> None:
        clock = self.clock
        clock.wrap(trainer.optimizers[0], "step", "torch.optimizer")
        lightning_opt = module.optimizers()
        clock.wrap(lightning_opt, "step", "optimizer")
        clock.wrap(trainer.datamodule.collector, "acquire", "handoff_wait")


@contextlib.contextmanager
def _timed_tensor_backward(clock: Clock):
    original = torch.Tensor.backward

    def backward(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            clock.now["torch.backward"] += time.perf_counter() - t0

    torch.Tensor.backward = backward
    try:
        yield
    finally:
        torch.Tensor.backward = original


class _Everything(frozenset):
    """A set holding every key: each metric through ``self.log`` (the ablation)."""

    def __contains__(self, key: object) -> bool:
        return True


def run_ours(mode: str, recipe: Path, updates: int, warmup: int,
             all_through_self_log: bool = False) -> dict[str, Any]:
    """One fit of the recipe in ``mode``; ``all_through_self_log``: every metric through
    ``self.log`` (as before the untracked ones went to the loggers directly)."""
    import lightning_unilab.learner.appo as appo

    tracked = appo.TRACKED_METRICS
    if all_through_self_log:
        appo.TRACKED_METRICS = _Everything()
    try:
        return _run_ours(mode, recipe, updates, warmup)
    finally:
        appo.TRACKED_METRICS = tracked


def _run_ours(mode: str, recipe: Path, updates: int, warmup: int) -> dict[str, Any]:
    from lightning_unilab.train import UniLabCLI, set_learner_threads

    clock = Clock()
    args = ["--config", str(recipe), f"--data.mode={mode}", "--trainer.max_time=null",
            "--trainer.max_steps=-1", "--trainer.enable_progress_bar=true",
            f"--trainer.default_root_dir={ROOT / 'build' / 'rl_breakdown'}"]
    from lightning_unilab.learner.appo import APPOModule
    from lightning_unilab.runtime.data import RolloutDataModule

    cli = UniLabCLI(APPOModule, RolloutDataModule, run=False, seed_everything_default=0,
                    save_config_kwargs={"overwrite": True}, args=args)
    threads = set_learner_threads(cli)
    trainer, module, dm = cli.trainer, cli.model, cli.datamodule
    trainer.callbacks += [_Cycles(clock, warmup, updates), _InnerTimers(clock)]
    _instrument_learner(clock, module, dm)
    t0 = time.perf_counter()
    with _timed_tensor_backward(clock):
        trainer.fit(module, datamodule=dm)
    wall = time.perf_counter() - t0
    cycles = clock.cycles[warmup:warmup + updates]
    row = medians(cycles)
    row.pop("lag", None)  # a count, not a time (mean_policy_lag below)
    row["handoff_wait"] = row.pop("handoff_wait", 0.0)
    row["host_copy"] = row.get("host_copy", 0.0)
    row["lightning.backward"] = row.get("backward", 0.0) - row.get("torch.backward", 0.0)
    row["lightning.optimizer"] = row.get("optimizer", 0.0) - row.get("torch.optimizer", 0.0)
    inside = sum(row.get(k, 0.0) for k in ("logging", "prepare", "forward", "backward",
                                           "optimizer", "kl", "publish"))
    row["update_other"] = row.get("training_step", 0.0) - inside
    row["lightning.step"] = row["cycle"] - row.get("training_step", 0.0) - row.get("handoff",
                                                                                    0.0)
    spec = dm.rollout_spec
    n, t = spec.num_envs, spec.horizon
    return {"mode": mode, "learner_threads": threads, "cycles_ms": row,
            "env_steps_per_cycle": n * t,
            "env_steps_per_s": n * t / (row["cycle"] / 1e3), "fit_wall_s": wall,
            "mean_policy_lag": statistics.mean(c.get("lag", 0.0) for c in cycles),
            "measured_cycles": len(cycles)}


def split_collect(recipe: dict[str, Any], rollouts: int) -> dict[str, float]:
    """The collector's work in this process: physics, policy inference, the rest (copies)."""
    from lightning_unilab.envs.vector_env import TaskVectorEnv
    from lightning_unilab.learner.policy import ActorCritic
    from lightning_unilab.runtime.rollout import RolloutSpec, RolloutState, collect

    d, m = recipe["data"], recipe["model"]
    torch.set_num_threads(1)
    env = TaskVectorEnv(d["task"], int(d["num_envs"]), 1, seed=0)
    spec = RolloutSpec.from_env(env, int(d["horizon"]))
    policy = ActorCritic(spec.obs_size, spec.critic_size, spec.action_size,
                         tuple(m["actor_hidden"]), tuple(m["critic_hidden"]),
                         activation=m.get("activation", "elu"))
    state = RolloutState.start(env, seed=0)
    arrays = spec.allocate()
    collect(env, policy, arrays, state)
    clock = Clock()
    clock.wrap(env, "step", "collect.physics")
    clock.wrap(policy, "act", "collect.inference")
    for _ in range(rollouts):
        t0 = time.perf_counter()
        collect(env, policy, arrays, state)
        clock.close_cycle(collect_alone=time.perf_counter() - t0)
    env.close()
    row = medians(clock.cycles)
    row["collect.copies"] = (row["collect_alone"] - row["collect.physics"]
                             - row["collect.inference"])
    return row


def run_rsl_rl(recipe: dict[str, Any], updates: int, warmup: int,
               threads: int = 1) -> dict[str, Any]:
    """rsl_rl's OnPolicyRunner on the same pool and sizes: its iteration split into
    env steps (physics + the adapter), policy inference, storage, returns, the update
    (torch backward and optimizer step inside it) and the rest."""
    from rsl_rl.runners import OnPolicyRunner

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from learning_curves import rsl_rl_config

    from lightning_unilab.integrations.rsl_rl import RslRlVecEnv

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    d = recipe["data"]
    env = RslRlVecEnv(d["task"], int(d["num_envs"]), 2, seed=0)
    runner = OnPolicyRunner(env, rsl_rl_config(recipe, env), log_dir=None, device="cpu")
    clock = Clock()
    alg = runner.alg
    clock.wrap(env, "step", "collect.physics")
    clock.wrap(alg, "act", "collect.inference")
    clock.wrap(alg, "process_env_step", "collect.storage")
    clock.wrap(alg, "compute_returns", "prepare")
    clock.wrap(alg, "update", "update")
    clock.wrap(alg.optimizer, "step", "torch.optimizer")
    starts: list[float] = []
    original_update = alg.update

    def update(*args: Any, **kwargs: Any) -> Any:
        out = original_update(*args, **kwargs)
        starts.append(time.perf_counter())
        if len(starts) > 1:
            clock.close_cycle(cycle=starts[-1] - starts[-2])
        return out

    alg.update = update
    with _timed_tensor_backward(clock):
        runner.learn(warmup + updates + 1)
    env.close()
    row = medians(clock.cycles[warmup:warmup + updates])
    row["forward"] = row["update"] - row.get("torch.backward", 0.0) - row.get(
        "torch.optimizer", 0.0)
    row["collect"] = sum(row.get(k, 0.0) for k in ("collect.physics", "collect.inference",
                                                   "collect.storage"))
    row["other"] = row["cycle"] - row["collect"] - row["update"] - row.get("prepare", 0.0)
    n, t = int(d["num_envs"]), int(d["horizon"])
    return {"torch_threads": threads, "cycles_ms": row, "env_steps_per_cycle": n * t,
            "env_steps_per_s": n * t / (row["cycle"] / 1e3), "measured_cycles": updates}


ROWS = ["cycle", "collect", "collect.physics", "collect.inference", "collect.copies",
        "collect.storage", "handoff", "handoff_wait", "host_copy", "prepare", "forward",
        "backward", "torch.backward", "lightning.backward", "optimizer", "torch.optimizer",
        "lightning.optimizer", "update", "kl", "publish", "logging", "update_other",
        "lightning.step", "other"]


def table(result: dict[str, Any]) -> str:
    ours = result["ours"]
    ablation = "sync_all_self_log" in ours
    cols = [("sync", ours["sync"]["cycles_ms"]), ("async", ours["async"]["cycles_ms"])]
    if ablation:
        cols.append(("sync_all", ours["sync_all_self_log"]["cycles_ms"]))
    cols.append(("rsl_rl", result["rsl_rl"]["cycles_ms"]))
    split = result["collect_split_ms"]
    head = ["ours, sync", "ours, async"] + (["ours, sync, all via self.log"] if ablation
                                            else []) + ["rsl_rl PPO"]
    lines = ["| ms per update cycle | " + " | ".join(head) + " |",
             "|---|" + "---:|" * len(head)]
    for key in ROWS:
        vals = []
        for name, row in cols:
            v = row.get(key)
            if v is None and name != "rsl_rl" and key in split:
                v = split[key]  # the collector's split, measured in this process
            vals.append("" if v is None else f"{v:.1f}")
        if any(vals):
            lines.append(f"| {key} | " + " | ".join(vals) + " |")
    rates = [ours["sync"], ours["async"]] + ([ours["sync_all_self_log"]] if ablation else [])
    rates.append(result["rsl_rl"])
    lines.append("| env steps/s | " + " | ".join(f"{r['env_steps_per_s']:.0f}" for r in rates)
                 + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", type=Path, default=RECIPE)
    parser.add_argument("--updates", type=int, default=20, help="measured update cycles")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rsl-rl-threads", type=int, default=1,
                        help="rsl_rl's torch threads (its update and the pool take turns)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    recipe = yaml.safe_load(args.recipe.read_text())
    result: dict[str, Any] = {"recipe": str(args.recipe), "updates": args.updates,
                              "warmup": args.warmup}
    result["collect_split_ms"] = split_collect(recipe, args.updates)
    result["ours"] = {mode: run_ours(mode, args.recipe, args.updates, args.warmup)
                      for mode in ("sync", "async")}
    result["ours"]["sync_all_self_log"] = run_ours("sync", args.recipe, args.updates,
                                                   args.warmup, all_through_self_log=True)
    result["rsl_rl"] = run_rsl_rl(recipe, args.updates, args.warmup, args.rsl_rl_threads)
    result["sync_vs_rsl_rl_env_steps_per_s"] = (result["ours"]["sync"]["env_steps_per_s"]
                                                / result["rsl_rl"]["env_steps_per_s"])
    print(table(result))
    print(f"sync / rsl_rl env steps/s: {result['sync_vs_rsl_rl_env_steps_per_s']:.2f}x")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
