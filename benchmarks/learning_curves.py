"""Return against wall time and env steps: APPO, synchronous PPO, SB3 PPO and rsl_rl PPO.

    python benchmarks/learning_curves.py --task HalfCheetah-v5 --budget-s 600 --seeds 3 \
        --out build/curves_half_cheetah.json [--algos appo,sync_ppo,sb3_ppo,rsl_rl_ppo] \
        [--set model.max_policy_lag=3]

Every (algo, seed) run gets the same wall-clock budget, in its own fresh process, one at a time
(never two at once: the machine has 2 cores). The clock starts after the imports, before the
algorithm builds its envs, processes and networks, so start-up costs count.

- ``appo``: APPOModule + RolloutDataModule(mode="async") with the task's recipe
  (recipes/unilab/*.yaml: model and data sections; the trainer section is replaced), collector on
  1 thread, learner on 1 thread.
- ``sync_ppo``: the same recipe with ``mode="sync"`` (the collector waits for each update: PPO).
- ``sb3_ppo``: Stable-Baselines3 PPO on gymnasium's own env (``make_vec_env``: DummyVecEnv over
  ``gymnasium.make(task)``, the way SB3 and rl-zoo run MuJoCo tasks), with rl-zoo's HalfCheetah
  hyperparameters (``SB3_ZOO`` below, including VecNormalize) for HalfCheetah, SB3 defaults
  elsewhere; torch on 1 thread.
- ``rsl_rl_ppo``: rsl-rl-lib 5.x ``OnPolicyRunner`` PPO over our TaskVectorEnv through
  ``lightning_unilab.integrations.RslRlVecEnv`` (env pool on 2 threads, torch on 1 thread),
  with the recipe's N x T, epochs, minibatches, network, lr schedule and coefficients.

The curve's return at each point is the mean undiscounted return of the latest completed
training episodes (at least the last 10; episodes that end together count together), measured
the same way for all four from each algorithm's own training episodes (stochastic policy).
``--evaluate DIR`` then runs the recipe's evaluation episode (its ``EvaluationRollout`` settings:
length, seed, task parameters; deterministic) on each run's final policy, rsl_rl's through
``RslRlActor``, and writes ``DIR/<algo>_seed<seed>/episode.{json,png}``; the run's record gets
its return, length, fall and tracking errors (``evaluation``); ``--evaluate-episodes N`` adds N
start seeds from the recipe's (``episodes.json``; the record's ``evaluation.seeds``).
``time_to_threshold_s`` is the first wall time at which it reaches the task's threshold (null if
never within the budget). JSON: ``{"runs": [{"algo", "seed", "curve": [[wall_s, env_steps,
return], ...], "time_to_threshold_s", ...}], "config": {...}}``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ALGOS = ("appo", "sync_ppo", "sb3_ppo", "rsl_rl_ppo")
THRESHOLDS = {"HalfCheetah-v5": 1500.0, "Ant-v5": 1000.0, "Humanoid-v5": 1000.0,
              "InvertedPendulum-v5": 950.0}
RECIPES = {"InvertedPendulum-v5": "inverted_pendulum.yaml", "HalfCheetah-v5": "half_cheetah.yaml",
           "Ant-v5": "ant.yaml", "Humanoid-v5": "humanoid.yaml",
           "g1-walk-flat": "g1_walk_flat.yaml"}
WINDOW = 10  # episodes (at least) behind each curve point
# rl-baselines3-zoo's tuned PPO for HalfCheetah (hyperparams/ppo.yml), with its VecNormalize
SB3_ZOO = {"HalfCheetah-v5": {
    "normalize": True, "n_envs": 1, "batch_size": 64, "n_steps": 512, "gamma": 0.98,
    "learning_rate": 2.0633e-05, "ent_coef": 0.000401762, "clip_range": 0.1, "n_epochs": 20,
    "gae_lambda": 0.92, "max_grad_norm": 0.8, "vf_coef": 0.58096,
    "policy_kwargs": {"log_std_init": -2, "ortho_init": False, "activation_fn": "relu",
                      "net_arch": {"pi": [256, 256], "vf": [256, 256]}}}}


class Curve:
    """(wall_s, env_steps, return) points from episodes as they complete."""

    def __init__(self, threshold: float | None, window: int = WINDOW) -> None:
        self.start = time.perf_counter()
        self.threshold, self.window = threshold, window
        self.recent: deque[tuple[float, int]] = deque()  # (sum of returns, episodes)
        self.points: list[list[float]] = []
        self.time_to_threshold: float | None = None
        self.episodes = 0

    def restart(self) -> None:
        """Start the clock here: after the imports, before envs and networks are built."""
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def add(self, return_sum: float, episodes: int, env_steps: int) -> None:
        """Episodes that ended since the last call (their summed return and count)."""
        if episodes <= 0 or not math.isfinite(return_sum):
            return
        self.episodes += episodes
        self.recent.append((return_sum, episodes))
        while len(self.recent) > 1 and sum(c for _, c in list(self.recent)[1:]) >= self.window:
            self.recent.popleft()
        total = sum(s for s, _ in self.recent) / sum(c for _, c in self.recent)
        wall = self.elapsed()
        self.points.append([round(wall, 3), int(env_steps), round(total, 3)])
        if (self.time_to_threshold is None and self.threshold is not None
                and total >= self.threshold):
            self.time_to_threshold = round(wall, 3)


def load_recipe(task: str, recipe: str | None = None,
                overrides: list[str] | None = None) -> dict[str, Any]:
    """The model and data init args of the task's recipe YAML, with ``section.key=value``
    overrides (values parsed as YAML)."""
    import yaml

    path = Path(recipe) if recipe else ROOT / "recipes" / "unilab" / RECIPES[task]
    cfg = yaml.safe_load(path.read_text())

    def args(section: Any) -> dict[str, Any]:
        section = dict(section or {})
        return dict(section.get("init_args", {})) if "class_path" in section else section

    # "rsl_rl": settings of the rsl_rl baseline itself: torch_threads, num_steps_per_env (its
    # rollout length) and any key of its algorithm config (desired_kl, learning_rate, ...) to
    # sweep it apart from the recipe
    evaluation = [args(cb) for cb in (cfg.get("trainer") or {}).get("callbacks") or []
                  if isinstance(cb, dict) and str(cb.get("class_path", "")).endswith(
                      "EvaluationRollout")]
    out = {"path": str(path), "model": args(cfg.get("model")), "data": args(cfg.get("data")),
           "rsl_rl": {}, "evaluation": evaluation[0] if evaluation else {}}
    for item in overrides or []:
        key, sep, value = item.partition("=")
        section, dot, name = key.partition(".")
        if not sep or not dot or section not in ("model", "data", "rsl_rl"):
            raise ValueError(f"--set: expected model.KEY=VALUE, data.KEY=VALUE or "
                             f"rsl_rl.KEY=VALUE, got {item!r}")
        out[section][name] = yaml.safe_load(value)
    out["overrides"] = list(overrides or [])
    return out


def _recipe_task(task: str, recipe: dict[str, Any]) -> Any:
    """``--task``, or the recipe's own task entry where that names the same class (a class
    path with its ``init_args``: given as ``--task`` alone they would be dropped)."""
    own = recipe.get("data", {}).get("task")
    if isinstance(own, dict) and own.get("class_path") == task:
        return own
    return task


def _instantiate(value: Any) -> Any:
    """class_path/init_args mappings (as jsonargparse reads them) into objects."""
    if isinstance(value, dict) and "class_path" in value:
        import importlib

        module, _, name = value["class_path"].rpartition(".")
        kwargs = {k: _instantiate(v) for k, v in dict(value.get("init_args", {})).items()}
        return getattr(importlib.import_module(module), name)(**kwargs)
    if isinstance(value, dict):
        return {k: _instantiate(v) for k, v in value.items()}
    return value


# ---------------------------------------------------------------------- the four runners


def run_lightning(task: str, mode: str, seed: int, budget_s: float, curve: Curve,
                  recipe: dict[str, Any], stop_at_threshold: bool) -> dict[str, Any]:
    import lightning.pytorch as pl
    import torch

    from lightning_unilab.learner.appo import APPOModule
    from lightning_unilab.runtime.data import RolloutDataModule, learner_threads

    torch.set_num_threads(learner_threads(mode))  # as the train CLI's default
    curve.restart()
    pl.seed_everything(seed, verbose=False)
    data_args = {**_instantiate(recipe["data"]), "task": _recipe_task(task, recipe),
                 "mode": mode, "seed": seed}
    dm = RolloutDataModule(**data_args)
    module = APPOModule(**_instantiate(recipe["model"]))
    last: dict[str, Any] = {"total": 0, "lag": [], "lr": [], "kl": []}

    class Record(pl.Callback):
        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                               batch_idx: int) -> None:
            stats = batch["stats"]
            episodes = int(stats["episodes"])
            if episodes:
                curve.add(float(stats["episode_return_mean"]) * episodes, episodes,
                          int(stats["env_steps"]))
            last["env_steps"] = int(stats["env_steps"])
            last["lag"].append(pl_module.policy_version - 1 - int(stats["policy_version"]))
            logged = trainer.callback_metrics
            if "learner/kl" in logged and len(last["kl"]) < pl_module.policy_version:
                last["lr"].append(float(logged["learner/lr"]))
                last["kl"].append(float(logged["learner/kl"]))
            if curve.elapsed() >= budget_s or (stop_at_threshold and
                                               curve.time_to_threshold is not None):
                trainer.should_stop = True

    trainer = pl.Trainer(max_steps=-1, max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[Record()], accelerator="cpu", devices=1)
    error = None
    try:
        trainer.fit(module, datamodule=dm)
    except FloatingPointError as exc:  # a learner blow-up is a result to report, not a crash
        error = str(exc)
    lag, lrs, hp = last["lag"], last["lr"], module.hparams
    floor = sum(lr <= hp.lr_min * (1 + 1e-6) for lr in lrs)
    return {"env_steps": last.get("env_steps", 0), "updates": module.policy_version,
            "mean_policy_lag": sum(lag) / len(lag) if lag else None,
            "num_envs": dm.config.num_envs, "horizon": dm.config.horizon,
            "collector_threads": dm.config.threads,
            "lr_at_floor_fraction": floor / len(lrs) if lrs else None,
            "first_update_kl": last["kl"][0] if last["kl"] else None,
            "desired_kl": hp.desired_kl, "error": error, "_policy": module.policy}


def run_sb3(task: str, seed: int, budget_s: float, curve: Curve,
            stop_at_threshold: bool) -> dict[str, Any]:
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    # one thread: minibatches of 64 gain nothing from two, and two spin on a shared machine
    torch.set_num_threads(1)
    curve.restart()
    hp = json.loads(json.dumps(SB3_ZOO.get(task, {})))
    normalize = hp.pop("normalize", False)
    n_envs = hp.pop("n_envs", 1)
    policy_kwargs = hp.pop("policy_kwargs", {})
    if "activation_fn" in policy_kwargs:
        policy_kwargs["activation_fn"] = {"relu": torch.nn.ReLU, "tanh": torch.nn.Tanh}[
            policy_kwargs["activation_fn"]]
    env = make_vec_env(task, n_envs=n_envs, seed=seed)  # Monitor-wrapped gymnasium.make envs
    if normalize:
        env = VecNormalize(env, gamma=hp.get("gamma", 0.99))

    class Record(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals.get("infos", []):
                if "episode" in info:  # Monitor: the raw return, before VecNormalize
                    curve.add(float(info["episode"]["r"]), 1, self.num_timesteps)
            if stop_at_threshold and curve.time_to_threshold is not None:
                return False
            return curve.elapsed() < budget_s

    model = PPO("MlpPolicy", env, seed=seed, device="cpu", policy_kwargs=policy_kwargs, **hp)
    model.learn(total_timesteps=10**9, callback=Record())
    steps = model.num_timesteps
    env.close()
    return {"env_steps": steps, "hyperparameters": SB3_ZOO.get(task, "SB3 defaults")}


def rsl_rl_config(recipe: dict[str, Any], env: Any) -> dict[str, Any]:
    """rsl_rl's OnPolicyRunner config for a recipe: its sizes and PPO settings, rsl_rl's
    names (the mapping every rsl_rl run of the benchmarks uses)."""
    m, d = recipe["model"], recipe["data"]
    horizon = int(d.get("horizon", 32))
    critic = ["critic"] if "critic" in env.get_observations().keys() else ["policy"]
    act = str(m.get("activation", "elu"))
    return {
        "num_steps_per_env": horizon, "save_interval": 10**9,
        "obs_groups": {"actor": ["policy"], "critic": critic},
        "algorithm": {
            "class_name": "PPO", "num_learning_epochs": int(m.get("epochs", 5)),
            "num_mini_batches": int(m.get("minibatches", 4)),
            "clip_param": float(m.get("clip_ratio", 0.2)), "gamma": float(m.get("gamma", 0.99)),
            "lam": float(m.get("gae_lambda", 0.95)),
            "value_loss_coef": float(m.get("value_loss_coef", 1.0)),
            "entropy_coef": float(m.get("entropy_coef", 0.01)),
            "learning_rate": float(m.get("lr", 1e-3)),
            "max_grad_norm": float(m.get("max_grad_norm") or 1e9),
            "schedule": "adaptive" if m.get("adaptive_lr", True) else "fixed",
            "desired_kl": float(m.get("desired_kl", 0.01))},
        "actor": {"class_name": "MLPModel", "activation": act,
                  "hidden_dims": list(m.get("actor_hidden", [512, 256, 128])),
                  "obs_normalization": bool(m.get("normalize_obs", True)),
                  "distribution_cfg": {"class_name": "GaussianDistribution",
                                       "init_std": math.exp(float(m.get("init_log_std", 0.0)))}},
        "critic": {"class_name": "MLPModel", "activation": act,
                   "hidden_dims": list(m.get("critic_hidden", [512, 256, 128])),
                   "obs_normalization": bool(m.get("normalize_obs", True))},
    }


def run_rsl_rl(task: str, seed: int, budget_s: float, curve: Curve, recipe: dict[str, Any],
               stop_at_threshold: bool) -> dict[str, Any]:
    import torch
    from rsl_rl.runners import OnPolicyRunner

    from lightning_unilab.integrations.rsl_rl import RslRlActor, RslRlVecEnv

    # the pool steps on 2 threads; updates take turns with it (--set rsl_rl.torch_threads=2)
    torch.set_num_threads(int(recipe.get("rsl_rl", {}).get("torch_threads", 1)))
    curve.restart()
    torch.manual_seed(seed)
    d = recipe["data"]
    num_envs = int(d.get("num_envs", 64))
    kwargs = _instantiate(dict(d.get("task_kwargs") or {}))
    if d.get("randomization") is not None:  # as the recipe's data module trains
        kwargs["randomization"] = _instantiate(d["randomization"])

    class Stop(Exception):
        pass

    class Recording(RslRlVecEnv):
        """Counts returns of finished episodes and ends the run when the budget is spent."""

        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, **kw)
            self.running = torch.zeros(self.num_envs, dtype=torch.float64)
            self.steps = 0

        def step(self, actions: torch.Tensor) -> Any:
            obs, rewards, dones, extras = super().step(actions)
            self.steps += self.num_envs
            self.running += rewards.double()
            done = dones.bool()
            if done.any():
                curve.add(float(self.running[done].sum()), int(done.sum()), self.steps)
                self.running[done] = 0.0
            if curve.elapsed() >= budget_s or (stop_at_threshold and
                                               curve.time_to_threshold is not None):
                raise Stop
            return obs, rewards, dones, extras

    env = Recording(_recipe_task(task, recipe), num_envs, 2, seed=seed, **kwargs)
    cfg = rsl_rl_config(recipe, env)
    for key, value in recipe.get("rsl_rl", {}).items():
        if key == "torch_threads":
            continue
        if key == "num_steps_per_env":  # its own rollout length, to sweep apart from ours
            cfg[key] = int(value)
            continue
        if key not in cfg["algorithm"]:
            raise ValueError(f"--set rsl_rl.{key}: expected torch_threads, num_steps_per_env or "
                             f"a key of rsl_rl's algorithm config {sorted(cfg['algorithm'])}, "
                             f"got {key!r}")
        cfg["algorithm"][key] = value
    runner = OnPolicyRunner(env, cfg, log_dir=None, device="cpu")
    try:
        runner.learn(10**9)
    except Stop:
        pass
    policy = RslRlActor(runner.get_inference_policy(), env)
    env.close()
    return {"env_steps": env.steps, "num_envs": num_envs, "horizon": cfg["num_steps_per_env"],
            "rsl_rl_algorithm": cfg["algorithm"], "_policy": policy}


def evaluate_run(policy: Any, task: str, recipe: dict[str, Any], out_dir: Path,
                 episodes: int = 1) -> dict[str, Any]:
    """The recipe's end-of-training evaluation episode (EvaluationRollout's settings) of a
    run's final policy; with ``episodes`` > 1 also that many start seeds from the recipe's
    (``episodes.json``: falls and the spread of the tracking errors)."""
    from lightning_unilab.evaluate import evaluate_policy, evaluate_seeds, evaluation_task_kwargs

    ev, d = recipe.get("evaluation") or {}, recipe["data"]
    kwargs = _instantiate(dict(d.get("task_kwargs") or {}))
    if ev.get("randomize") and d.get("randomization") is not None:
        kwargs["randomization"] = _instantiate(d["randomization"])
    kwargs = evaluation_task_kwargs(kwargs, bool(ev.get("randomize")), ev.get("task_params"),
                                    task=_recipe_task(task, recipe))
    seed = int(ev.get("seed", 0))
    summary = evaluate_policy(policy, _recipe_task(task, recipe), out_dir, kwargs, seed=seed,
                              max_steps=ev.get("max_steps"), video=False)
    record = {k: summary.get(k) for k in ("return", "length", "terminated", "tracking", "plot")}
    if episodes > 1:
        seeds = evaluate_seeds(policy, _recipe_task(task, recipe), out_dir,
                               range(seed, seed + episodes), kwargs, ev.get("max_steps"))
        record["seeds"] = {k: v for k, v in seeds.items() if k not in ("task", "deterministic")}
    return record


def run_one(algo: str, task: str, seed: int, budget_s: float, recipe_path: str | None,
            stop_at_threshold: bool, overrides: list[str] | None = None,
            evaluate_dir: str | None = None, evaluate_episodes: int = 1) -> dict[str, Any]:
    curve = Curve(THRESHOLDS.get(task))
    recipe = load_recipe(task, recipe_path, overrides) if algo != "sb3_ppo" else None
    if algo in ("appo", "sync_ppo"):
        mode = "async" if algo == "appo" else "sync"
        extra = run_lightning(task, mode, seed, budget_s, curve, recipe, stop_at_threshold)
    elif algo == "sb3_ppo":
        extra = run_sb3(task, seed, budget_s, curve, stop_at_threshold)
    elif algo == "rsl_rl_ppo":
        extra = run_rsl_rl(task, seed, budget_s, curve, recipe, stop_at_threshold)
    else:
        raise ValueError(f"algo: expected one of {ALGOS}, got {algo!r}")
    policy = extra.pop("_policy", None)
    if evaluate_dir is not None:
        if policy is None:
            raise ValueError(f"--evaluate: {algo} runs are not evaluated (its policy is not an "
                             "ActorCritic or an rsl_rl actor)")
        extra["evaluation"] = evaluate_run(policy, task, recipe,
                                           Path(evaluate_dir) / f"{algo}_seed{seed}",
                                           evaluate_episodes)
    return {"algo": algo, "seed": seed, "task": task, "budget_s": budget_s,
            "wall_s": round(curve.elapsed(), 3), "episodes": curve.episodes,
            "curve": curve.points, "time_to_threshold_s": curve.time_to_threshold,
            "final_return": curve.points[-1][2] if curve.points else None,
            "max_return": max((p[2] for p in curve.points), default=None),
            "mean_return_last_30s": _tail_mean(curve.points, curve.elapsed() - 30.0),
            "recipe": recipe["path"] if recipe else None,
            "overrides": recipe["overrides"] if recipe else [], **extra}


# ---------------------------------------------------------------------- driver


def _tail_mean(points: list[list[float]], since_s: float) -> float | None:
    """Mean of the curve's returns from ``since_s`` on (the run's last stretch)."""
    tail = [p[2] for p in points if p[0] >= since_s]
    return sum(tail) / len(tail) if tail else None


def _median(values: list[float | None]) -> float | None:
    """Median over seeds; a run that never reached the threshold counts as +inf."""
    if not values:
        return None
    xs = sorted(math.inf if v is None else v for v in values)
    k = len(xs) // 2
    mid = xs[k] if len(xs) % 2 else 0.5 * (xs[k - 1] + xs[k])
    return None if math.isinf(mid) else mid


def _worst(values: list[float | None], pick: Any) -> float | None:
    known = [v for v in values if v is not None]
    return pick(known) if known else None


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {}
    for algo in dict.fromkeys(r["algo"] for r in runs):
        mine = [r for r in runs if r["algo"] == algo]
        finals = [r["final_return"] for r in mine if r["final_return"] is not None]
        table[algo] = {
            "seeds": len(mine),
            "reached": sum(r["time_to_threshold_s"] is not None for r in mine),
            "median_time_to_threshold_s": _median([r["time_to_threshold_s"] for r in mine]),
            "median_final_return": sorted(finals)[len(finals) // 2] if finals else None,
            "mean_env_steps_per_s": sum(r["env_steps"] / r["wall_s"] for r in mine) / len(mine),
            "min_max_return": _worst([r.get("max_return") for r in mine], min),
            "min_mean_return_last_30s": _worst([r.get("mean_return_last_30s") for r in mine], min),
            "errors": sum(bool(r.get("error")) for r in mine),
            "max_lr_at_floor_fraction": _worst([r.get("lr_at_floor_fraction") for r in mine], max),
            "max_first_update_kl": _worst([r.get("first_update_kl") for r in mine], max),
        }
    appo = table.get("appo", {}).get("median_time_to_threshold_s")
    for row in table.values():
        other = row["median_time_to_threshold_s"]
        row["appo_speedup"] = (round(other / appo, 3) if appo and other else None)
    return table


def print_table(task: str, table: dict[str, dict[str, Any]], threshold: float | None) -> None:
    print(f"\n{task}: threshold {threshold}, median over seeds")
    head = (f"{'algo':<12}{'seeds':>6}{'reached':>8}{'t_thresh_s':>12}{'final_ret':>11}"
            f"{'steps/s':>10}{'appo x':>8}{'worst_max':>10}{'worst_last30':>13}{'errors':>7}"
            f"{'lr_floor':>9}{'kl_first':>9}")
    print(head)
    print("-" * len(head))

    def fmt(v: Any, spec: str) -> str:
        return format(v, spec) if v is not None else "-"

    for algo, r in table.items():
        print(f"{algo:<12}{r['seeds']:>6}{r['reached']:>8}"
              f"{fmt(r['median_time_to_threshold_s'], '.1f'):>12}"
              f"{fmt(r['median_final_return'], '.0f'):>11}"
              f"{r['mean_env_steps_per_s']:>10.0f}{fmt(r['appo_speedup'], '.2f'):>8}"
              f"{fmt(r.get('min_max_return'), '.0f'):>10}"
              f"{fmt(r.get('min_mean_return_last_30s'), '.0f'):>13}{r.get('errors', 0):>7}"
              f"{fmt(r.get('max_lr_at_floor_fraction'), '.0%'):>9}"
              f"{fmt(r.get('max_first_update_kl'), '.3g'):>9}")


def plot(task: str, runs: list[dict[str, Any]], out_dir: Path, threshold: float | None,
         tag: str) -> list[str]:
    """Return vs wall time and vs env steps: mean over seeds, min-max band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    out_dir.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for i, algo in enumerate(dict.fromkeys(r["algo"] for r in runs)):
        curves = [np.asarray(r["curve"], float) for r in runs
                  if r["algo"] == algo and len(r["curve"]) > 1]
        if not curves:
            continue
        for ax, col in ((axes[0], 0), (axes[1], 1)):
            end = min(c[-1, col] for c in curves)
            grid = np.linspace(max(c[0, col] for c in curves), end, 200)
            if len(grid) < 2 or grid[0] >= grid[-1]:
                continue
            ys = np.stack([np.interp(grid, c[:, col], c[:, 2]) for c in curves])
            ax.plot(grid, ys.mean(0), color=f"C{i}", label=f"{algo} ({len(curves)} seeds)")
            ax.fill_between(grid, ys.min(0), ys.max(0), color=f"C{i}", alpha=0.2)
    for ax, xlabel in zip(axes, ("wall time (s)", "env steps"), strict=True):
        if threshold is not None:
            ax.axhline(threshold, color="gray", ls=":", lw=1)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("training episode return")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{task}: mean (line) and min-max (band) over seeds")
    fig.tight_layout()
    path = out_dir / f"curves_{tag}.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return [str(path)]


RUN_TAGS = ("rollout/episode_length", "rollout/return", "learner/policy_lag", "learner/lr",
            "step_info/reward_tracking_lin_vel", "step_info/reward_tracking_ang_vel")
SMOOTH = 25  # rollouts in the running mean drawn over per-rollout series (step_info/*)


def _running_mean(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def plot_run(log_dir: str, path: Path, tags: tuple[str, ...] = RUN_TAGS
             ) -> dict[str, list[list[float]]]:
    """Curves of one recipe run from its TensorBoard log (``--plot-run``) against wall time:
    episode length, return, policy lag, learning rate and, where the task logs them, the
    velocity-tracking reward per step (with a running mean); returns the series plotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(log_dir, size_guidance={"scalars": 0})
    acc.Reload()
    have = set(acc.Tags()["scalars"])
    series = {}
    for tag in tags:
        if tag in have:
            events = acc.Scalars(tag)
            start = events[0].wall_time
            series[tag] = [[round(e.wall_time - start, 2), float(e.value)] for e in events]
    if not series:
        raise ValueError(f"--plot-run: no scalars {list(tags)} in {log_dir!r} (found "
                         f"{sorted(have)[:8]})")
    cols = min(len(series), 3)
    rows = -(-len(series) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), squeeze=False)
    for ax in axes.flat[len(series):]:
        ax.set_visible(False)
    for ax, (tag, points) in zip(axes.flat, series.items(), strict=False):
        xs, ys = zip(*points, strict=True)
        if tag.startswith("step_info/"):  # one value per rollout: noisy, so add a running mean
            ax.plot(xs, ys, lw=0.5, alpha=0.4)
            ax.plot(xs, _running_mean(list(ys), SMOOTH), label=f"mean of {SMOOTH} rollouts")
            ax.legend(fontsize=7)
        else:
            ax.plot(xs, ys)
        ax.set_title(tag, fontsize=9)
        ax.set_xlabel("wall time (s)")
        if tag == "learner/lr":
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    fig.suptitle(log_dir, fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return series


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="HalfCheetah-v5")
    parser.add_argument("--budget-s", type=float, default=600.0)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--seed-offset", type=int, default=0)
    parser.add_argument("--algos", default=",".join(ALGOS))
    parser.add_argument("--recipe", default=None, help="recipe YAML (default: the task's)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override the recipe, e.g. --set model.max_policy_lag=3 (repeatable)")
    parser.add_argument("--out", help="JSON of the runs (required unless --plot-from)")
    parser.add_argument("--plot-dir", default=str(ROOT / "docs" / "unilab" / "img"))
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--plot-tag", default=None,
                        help="name of the plot: curves_<tag>.png (default: from the task)")
    parser.add_argument("--plot-from", metavar="JSON",
                        help="plot the runs of a finished --out file and stop")
    parser.add_argument("--resume", action="store_true",
                        help="keep the finished (algo, seed) runs already in --out and run the "
                             "rest (default: start afresh; old runs may be of older code)")
    parser.add_argument("--stop-at-threshold", action="store_true",
                        help="end a run when it reaches the threshold (saves time; curves stop)")
    parser.add_argument("--quick", action="store_true",
                        help="a seconds-long smoke run: budget 8 s, 1 seed, no plot")
    parser.add_argument("--plot-run", metavar="LOG_DIR",
                        help="plot a recipe run's TensorBoard curves into --out (a PNG) and stop")
    parser.add_argument("--evaluate", metavar="DIR", default=None,
                        help="after each run, the recipe's evaluation episode of its final "
                             "policy into DIR/<algo>_seed<seed> (appo, sync_ppo, rsl_rl_ppo)")
    parser.add_argument("--evaluate-episodes", type=int, default=1, metavar="N",
                        help="with --evaluate: also N start seeds from the recipe's "
                             "(episodes.json: falls, median and max tracking errors)")
    parser.add_argument("--worker", nargs=2, metavar=("ALGO", "SEED"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.out and not args.plot_from:
        parser.error("--out: required (where the runs' JSON, or --plot-run's PNG, goes)")
    if args.plot_run:
        series = plot_run(args.plot_run, Path(args.out))
        for tag, points in series.items():
            print(f"{tag}: {len(points)} points, first {points[0][1]:.4g}, last "
                  f"{points[-1][1]:.4g} at {points[-1][0]:.0f} s")
        return 0
    if args.plot_from:
        doc = json.loads(Path(args.plot_from).read_text())
        task = doc["config"]["task"]
        tag = args.plot_tag or task.lower().replace("-", "_").replace(".", "_")
        for path in plot(task, doc["runs"], Path(args.plot_dir), THRESHOLDS.get(task), tag):
            print(f"plot: {path}")
        return 0
    if args.quick:
        args.budget_s, args.seeds, args.no_plot = min(args.budget_s, 8.0), 1, True
    try:
        load_recipe(args.task, args.recipe, args.set) if args.task in RECIPES or args.recipe \
            else None
    except ValueError as exc:
        parser.error(str(exc))
    if args.budget_s <= 0:
        parser.error(f"--budget-s: expected a positive number of seconds, got {args.budget_s}")
    if args.seeds < 1:
        parser.error(f"--seeds: expected >= 1, got {args.seeds}")
    algos = [a for a in args.algos.split(",") if a]
    bad = [a for a in algos if a not in ALGOS]
    if bad:
        parser.error(f"--algos: unknown {bad}; expected a comma list of {ALGOS}")
    if args.evaluate_episodes < 1:
        parser.error(f"--evaluate-episodes: expected >= 1, got {args.evaluate_episodes}")
    if args.evaluate and "sb3_ppo" in algos and not args.worker:
        parser.error("--evaluate: sb3_ppo's policy is not evaluated; drop it from --algos")
    if args.task not in RECIPES and args.recipe is None and set(algos) - {"sb3_ppo"}:
        parser.error(f"--task: no recipe for {args.task!r}; pass --recipe or use one of "
                     f"{sorted(RECIPES)}")

    if args.worker:  # one run in this fresh process; JSON on the last line of stdout
        algo, seed = args.worker[0], int(args.worker[1])
        result = run_one(algo, args.task, seed, args.budget_s, args.recipe,
                         args.stop_at_threshold, args.set, args.evaluate,
                         args.evaluate_episodes)
        Path(args.out).write_text(json.dumps(result))
        return 0

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    if args.resume and out.exists():  # keep finished runs of the same task
        try:
            old = json.loads(out.read_text())
            runs = [r for r in old.get("runs", []) if r.get("task") == args.task]
        except (OSError, ValueError):
            runs = []
    done = {(r["algo"], r["seed"]) for r in runs}
    for seed in range(args.seed_offset, args.seed_offset + args.seeds):
        for algo in algos:  # interleaved by seed: slow drifts of the machine hit every algo
            if (algo, seed) in done:
                continue
            part = out.with_suffix(f".{algo}.{seed}.part.json")
            cmd = [sys.executable, __file__, "--task", args.task, "--budget-s",
                   str(args.budget_s), "--out", str(part), "--worker", algo, str(seed)]
            if args.recipe:
                cmd += ["--recipe", args.recipe]
            if args.stop_at_threshold:
                cmd.append("--stop-at-threshold")
            if args.evaluate:
                cmd += ["--evaluate", args.evaluate,
                        "--evaluate-episodes", str(args.evaluate_episodes)]
            for item in args.set:
                cmd += ["--set", item]
            print(f"[{time.strftime('%H:%M:%S')}] {algo} seed {seed} ({args.budget_s:.0f} s)",
                  flush=True)
            env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep +
                   os.environ.get("PYTHONPATH", "")}
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode != 0 or not part.exists():
                raise RuntimeError(f"{algo} seed {seed} failed (exit {proc.returncode}):\n"
                                   f"{proc.stderr[-3000:]}")
            run = json.loads(part.read_text())
            part.unlink()
            print(f"    reached {THRESHOLDS.get(args.task)} at {run['time_to_threshold_s']} s; "
                  f"final return {run['final_return']}; {run['env_steps']} env steps"
                  + (f"; lr at floor {run['lr_at_floor_fraction']:.0%}, first-update KL "
                     f"{run['first_update_kl']:.3g}" if run.get("first_update_kl") is not None
                     else "") + (f"; ERROR {run['error']}" if run.get("error") else ""),
                  flush=True)
            if run.get("evaluation"):
                ev = run["evaluation"]
                tracking = {k: v for k, v in (ev["tracking"] or {}).items()
                            if k != "per_command"}
                print(f"    evaluation: return {ev['return']:.1f} over {ev['length']} steps, "
                      f"{'fell' if ev['terminated'] else 'no fall'}; tracking {tracking}",
                      flush=True)
                if ev.get("seeds"):
                    sd = ev["seeds"]
                    print(f"    {sd['episodes']} start seeds: {sd['terminated']} fell; linear "
                          f"error {sd.get('lin_vel_error_mps')}, yaw "
                          f"{sd.get('yaw_rate_error_radps')}", flush=True)
            runs.append(run)
            _write(out, args, runs)
    table = summarize(runs)
    threshold = THRESHOLDS.get(args.task)
    print_table(args.task, table, threshold)
    if not args.no_plot:
        tag = args.plot_tag or args.task.lower().replace("-", "_").replace(".", "_")
        for path in plot(args.task, runs, Path(args.plot_dir), threshold, tag):
            print(f"plot: {path}")
    _write(out, args, runs, table)
    return 0


def _write(out: Path, args: argparse.Namespace, runs: list[dict[str, Any]],
           table: dict[str, Any] | None = None) -> None:
    import platform

    doc = {"runs": runs, "summary": table or summarize(runs),
           "config": {"task": args.task, "budget_s": args.budget_s,
                      "threshold": THRESHOLDS.get(args.task), "window_episodes": WINDOW,
                      "cpus": os.cpu_count(), "machine": platform.machine(),
                      "load_avg_at_end": os.getloadavg()}}
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(out)


if __name__ == "__main__":
    sys.exit(main())
