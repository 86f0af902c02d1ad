"""Is g1-walk-flat stable at a longer physics step? Instability truncations per million env steps.

The C++ task at each physics step (timestep 0.002 x 10, 0.02/6 x 6, 0.004 x 5, 0.005 x 4, 0.02/3
x 3 substeps per 20 ms control step), with the G1 recipe's randomization
(recipes/unilab/g1_walk_flat.yaml: friction U(0.4, 1.0), link masses x U(0.9, 1.1), kp x U(0.9,
1.1), drawn per env and episode), under uniform random actions in [-1, 1] (the untrained
policy's worst case: falls every ~1.5 s), under zero actions (standing at the home pose) and,
with ``--checkpoint``, under the sampled actions of a trained policy (``policy``), each with the
task's ``eulerdamp`` on and off (``--eulerdamp``).

An env whose substeps raise a MuJoCo warning (BADQACC, BADQVEL, ... : a diverging simulation) is
rolled back by the pool and its episode truncated, with the warning bits in ``info["status"]``
(:mod:`lightning_unilab.envs.vector_env`); those truncations are the instability count. Also
counted: rows with a non-finite observation (none should get past the rollback) and steps whose
largest joint speed exceeds ``--qvel-limit`` rad/s (a finite but exploding state the warnings
miss; the task's own ``max_speed`` bound, which would roll those back, is off here), with falls
and mean episode length for context.

    python benchmarks/g1_step_stability.py [--quick] [--checkpoint CKPT] --out FILE
    python benchmarks/g1_step_stability.py --integrator implicitfast --solver-iterations 3,6,10 \
        --timesteps 6.67ms --eulerdamp 0 --out FILE
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import numpy as np
import torch

from lightning_unilab.envs.pool import describe_status
from lightning_unilab.envs.randomization import G1Randomization
from lightning_unilab.envs.tasks import INTEGRATORS
from lightning_unilab.envs.vector_env import TaskVectorEnv

CTRL_DT = 0.02
TIMESTEPS = {"2ms": 0.002, "3.33ms": CTRL_DT / 6, "4ms": 0.004, "5ms": 0.005,
             "6.67ms": CTRL_DT / 3}
RECIPE_RANDOMIZATION = {"friction": (0.4, 1.0), "mass_scale": (0.9, 1.1), "kp_scale": (0.9, 1.1)}


def load_policy(path: str) -> Any:
    """The trained ActorCritic of a checkpoint (float32, CPU)."""
    from lightning_omnilab import safe_load
    from lightning_unilab.learner.appo import APPOModule

    with safe_load.project_types():
        module = APPOModule.load_from_checkpoint(path, map_location="cpu", weights_only=True)
    return module.policy.float()


def run(timestep: float, actions: str, num_envs: int, steps: int, threads: int, seed: int,
        qvel_limit: float, eulerdamp: int = 1, policy: Any = None, integrator: int = 0,
        solver_iterations: int = 3) -> dict:
    """One configuration: num_envs x steps env steps; counts and rates per million env steps."""
    # the task's speed bound off: this measures the physics, finite blow-ups included
    env = TaskVectorEnv("g1-walk-flat", num_envs, threads,
                        params={"timestep": timestep, "max_speed": 0.0, "eulerdamp": eulerdamp,
                                "integrator": integrator,
                                "solver_iterations": solver_iterations},
                        randomization=G1Randomization(**RECIPE_RANDOMIZATION), seed=seed,
                        copy=False)
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    zero = np.zeros((num_envs, env.spec.action_size))
    unstable = nonfinite = fast = falls = time_limits = ended = length_sum = 0
    speeds = np.empty((steps, num_envs))  # each step's largest joint speed per env
    warnings: dict[str, int] = {}
    start = time.perf_counter()
    for k in range(steps):
        if actions == "policy":
            with torch.no_grad():
                act = policy.act(torch.as_tensor(obs, dtype=torch.float32))[0].double().numpy()
        else:
            act = rng.uniform(-1, 1, zero.shape) if actions == "random" else zero
        obs, _, term, trunc, info = env.step(act)
        status = info["status"]
        bad = trunc & (status != 0)
        unstable += int(bad.sum())
        for bits in status[bad]:
            for name in describe_status(int(bits)):
                warnings[name] = warnings.get(name, 0) + 1
        time_limits += int((trunc & (status == 0)).sum())
        nonfinite += int((~np.isfinite(obs).all(axis=1)).sum())
        speeds[k] = np.abs(env.pool.qvel[:, 6:]).max(axis=1)
        fast += int((speeds[k] > qvel_limit).sum())
        falls += int(term.sum())
        done = info["done"]
        ended += int(done.sum())
        length_sum += int(info["episode_length"][done].sum())
    seconds = time.perf_counter() - start
    env.close()
    total = num_envs * steps
    per_m = 1e6 / total
    return {
        "timestep": timestep, "frame_skip": env.spec.frame_skip, "actions": actions,
        "eulerdamp": eulerdamp, "integrator": INTEGRATORS[integrator],
        "solver_iterations": solver_iterations,
        "env_steps": total, "seconds": seconds, "env_steps_per_s": total / seconds,
        "unstable_truncations": unstable, "unstable_per_million": unstable * per_m,
        "warnings": warnings, "nonfinite_obs_rows": nonfinite,
        "fast_joint_steps": fast, "fast_joint_per_million": fast * per_m,
        "joint_speed_p50": float(np.median(speeds)),
        "joint_speed_p999": float(np.quantile(speeds, 0.999)),
        "joint_speed_max": float(speeds.max()),
        "falls": falls, "falls_per_million": falls * per_m, "time_limits": time_limits,
        "mean_episode_length": length_sum / ended if ended else float(steps),
    }


def _table(rows: list[dict]) -> str:
    head = (f"{'integrator':>12} {'it':>3} {'step':>8} {'x':>2} {'damp':>4} {'actions':>7} "
            f"{'env steps':>10} {'unstable/M':>10} "
            f"{'nonfinite':>9} {'fast/M':>8} {'|qd| p99.9':>10} {'|qd| max':>8} {'falls/M':>9} "
            f"{'ep len':>7} {'steps/s':>8}  warnings")
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['integrator']:>12} {r['solver_iterations']:>3} "
            f"{r['timestep'] * 1000:7.3g}m {r['frame_skip']:>2} {r['eulerdamp']:>4} "
            f"{r['actions']:>7} "
            f"{r['env_steps']:>10,} {r['unstable_per_million']:>10.1f} "
            f"{r['nonfinite_obs_rows']:>9} {r['fast_joint_per_million']:>8.1f} "
            f"{r['joint_speed_p999']:>10.1f} {r['joint_speed_max']:>8.1f} "
            f"{r['falls_per_million']:>9.0f} {r['mean_episode_length']:>7.1f} "
            f"{r['env_steps_per_s']:>8,.0f}  {r['warnings'] or '-'}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="32 envs x 100 steps per run")
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--steps", type=int, default=200, help="env steps per env and run")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--timesteps", default=",".join(TIMESTEPS),
                        help=f"comma-separated names of {list(TIMESTEPS)}")
    parser.add_argument("--qvel-limit", type=float, default=100.0,
                        help="joint speed (rad/s) counted as an exploding state")
    parser.add_argument("--actions", default="random,zero",
                        help="comma-separated: random, zero, policy (needs --checkpoint)")
    parser.add_argument("--checkpoint", help="a g1-walk-flat training checkpoint: adds the "
                        "'policy' rows, its sampled actions")
    parser.add_argument("--eulerdamp", default="1,0", help="comma-separated task eulerdamp values")
    parser.add_argument("--integrator", default="Euler",
                        help=f"comma-separated MuJoCo integrators of {list(INTEGRATORS.values())}")
    parser.add_argument("--solver-iterations", default="3",
                        help="comma-separated caps of the constraint solver's iterations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    num_envs, steps = (32, 100) if args.quick else (args.num_envs, args.steps)
    kinds = args.actions.split(",")
    if args.checkpoint and "policy" not in kinds:
        kinds.append("policy")
    if "policy" in kinds and not args.checkpoint:
        parser.error("--actions policy: needs --checkpoint")
    policy = load_policy(args.checkpoint) if args.checkpoint else None
    codes = {name: code for code, name in INTEGRATORS.items()}
    unknown = [v for v in args.integrator.split(",") if v not in codes]
    if unknown:
        parser.error(f"--integrator: expected names among {list(codes)}, got {unknown}")
    rows = []
    for integrator in args.integrator.split(","):
        for iterations in (int(v) for v in args.solver_iterations.split(",")):
            for name in args.timesteps.split(","):
                for damp in (int(v) for v in args.eulerdamp.split(",")):
                    for actions in kinds:
                        rows.append(run(TIMESTEPS[name], actions, num_envs, steps, args.threads,
                                        args.seed, args.qvel_limit, damp, policy,
                                        codes[integrator], iterations))
                        print(_table(rows[-1:]).splitlines()[-1], flush=True)
    print(_table(rows))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"num_envs": num_envs, "steps": steps, "threads": args.threads,
                       "randomization": RECIPE_RANDOMIZATION, "qvel_limit": args.qvel_limit,
                       "checkpoint": args.checkpoint,
                       "runs": rows}, f, indent=2)


if __name__ == "__main__":
    main()
