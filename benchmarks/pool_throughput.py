"""BatchEnvPool against MuJoCo's own batch engine and the single-thread C-loop limit.

All numbers come from one run on the Unitree G1 29-DoF feet-only flat scene (keyframe 0, random
controls around the keyframe's): the pool, mujoco.batch.Batch and mujoco.rollout step the same
states with the same controls, interleaved round by round so that a busy neighbour slows all of
them alike; each reports its best round.

    python benchmarks/pool_throughput.py [--quick] --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import mujoco
import numpy as np
from mujoco import batch as mjbatch
from mujoco import rollout

from lightning_unilab import BatchEnvPool
from lightning_unilab.envs.assets import g1_flat_scene

NSTEP = 10  # substeps per call: one 0.02 s control step of the G1 task

TARGETS = {
    "pool_vs_limit": 0.97,
    "pool_vs_batch": 0.98,
    "reset_5pct_vs_full": 1 / 15,
    "rss_mb_randomized": 1500.0,
    # a randomized reset of 5% of the envs (mass, friction, kp, mj_setConst, reset) takes at
    # most the time of the same work written by hand on mujoco.batch.Batch
    "randomized_reset_vs_batch": 1.0,
}


def best_rate(fn: Callable[[], int], rounds: list[float]) -> None:
    """Time fn (which returns how many substeps it ran) once and append its rate."""
    t0 = time.perf_counter()
    substeps = fn()
    rounds.append(substeps / (time.perf_counter() - t0))


def best_ms(fn: Callable[[], None], reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * min(times)


def randomization(model: mujoco.MjModel, n: int, rng: np.random.Generator) -> dict:
    """Mass, friction and kp of every env scaled by up to +-20%: the usual domain randomization."""
    scale = lambda shape: rng.uniform(0.8, 1.2, shape)  # noqa: E731
    return {
        "body_mass": model.body_mass * scale((n, model.nbody)),
        "geom_friction": model.geom_friction * scale((n, model.ngeom, 1)),
        "actuator_kp": model.actuator_gainprm[:, 0] * scale((n, model.nu)),
    }


def rss_of_randomized_pool(num_envs: int) -> tuple[float, float]:
    """(resident MB of a fresh process holding a fully randomized pool, MB before the pool)."""
    code = f"""
import numpy as np, psutil, mujoco, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from pool_throughput import randomization
from lightning_unilab import BatchEnvPool
from lightning_unilab.envs.assets import g1_flat_scene
model = mujoco.MjModel.from_xml_path(str(g1_flat_scene()))
before = psutil.Process().memory_info().rss
pool = BatchEnvPool(model, {num_envs})
pool.reset(keyframe=0, randomization=randomization(model, {num_envs}, np.random.default_rng(0)))
pool.step(nstep=1)
print(psutil.Process().memory_info().rss / 2**20, before / 2**20)
"""
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    after, before = map(float, out.stdout.split())
    return after, before


def measure(quick: bool) -> dict:
    num_envs = 1024 if quick else 4096
    rounds = 3
    # 100 substeps (0.2 s) per round: past the first substeps after a reset, which are slower
    # while contacts settle, and close to the steady state a training run sees
    calls = 10
    num_threads = len(os.sched_getaffinity(0))
    model = mujoco.MjModel.from_xml_path(str(g1_flat_scene()))
    rng = np.random.default_rng(0)
    ctrl = model.key_ctrl[0] + 0.1 * rng.standard_normal((num_envs, model.nu))

    pool = BatchEnvPool(model, num_envs, num_threads)
    batch = mjbatch.Batch(model, num_envs, num_threads)
    batch_ctrl = batch.bind("ctrl")

    # the C-loop limit: mujoco.rollout on one thread from the same states with the same controls
    nroll = num_envs // 4
    pool.reset(keyframe=0)
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    data = mujoco.MjData(model)
    full = np.empty((nroll, mujoco.mj_stateSize(model, spec)))
    for i in range(nroll):
        mujoco.mj_setState(model, data, pool.state[i], mujoco.mjtState.mjSTATE_INTEGRATION)
        mujoco.mj_getState(model, data, full[i], spec)
    roll_ctrl = np.repeat(ctrl[:nroll, None, :], NSTEP * calls, axis=1)
    roll_state = np.empty((nroll, NSTEP * calls, full.shape[1]))
    roll_sensor = np.empty((nroll, NSTEP * calls, model.nsensordata))

    def run_pool() -> int:
        pool.reset(keyframe=0)
        pool.ctrl[:] = ctrl
        t = 0
        for _ in range(calls):
            pool.step(nstep=NSTEP)
            t += num_envs * NSTEP
        return t

    def run_batch() -> int:
        batch.reset(keyframe=0, stage=mujoco.mjtStage.mjSTAGE_NONE)
        batch_ctrl[:] = ctrl
        for _ in range(calls):
            batch.step(nstep=NSTEP)
        return calls * num_envs * NSTEP

    def run_rollout() -> int:
        rollout.rollout(model, data, full, roll_ctrl, state=roll_state, sensordata=roll_sensor)
        return nroll * NSTEP * calls

    # the same C loop on num_threads threads: what two busy cores really give, for reference
    threaded = rollout.Rollout(nthread=num_threads)
    datas = [mujoco.MjData(model) for _ in range(num_threads)]

    def run_threaded_rollout() -> int:
        threaded.rollout(model, datas, full, roll_ctrl, state=roll_state, sensordata=roll_sensor)
        return nroll * NSTEP * calls

    rates: dict[str, list[float]] = {"pool": [], "batch": [], "rollout": [], "rollout_mt": []}
    runs = {"pool": run_pool, "batch": run_batch, "rollout": run_rollout,
            "rollout_mt": run_threaded_rollout}
    run_pool(), run_batch(), run_rollout()  # warm caches and thread pools
    order = list(runs)
    for _ in range(rounds):
        for name in order:
            best_rate(runs[name], rates[name])
        order.reverse()  # no system always runs first or last

    # the two engines are the same physics: prove it on the benchmark's own data
    run_pool(), run_batch()
    identical = bool(np.array_equal(pool.state, batch.state))

    ids = np.arange(0, num_envs, 20)
    reset_full = best_ms(lambda: pool.reset(keyframe=0), 3)
    reset_5pct = best_ms(lambda: pool.reset(ids, keyframe=0), 10)
    rand = randomization(model, len(ids), rng)

    def batch_randomized_reset() -> None:
        batch.expand("body_mass")[ids] = rand["body_mass"]
        batch.expand("geom_friction")[ids] = rand["geom_friction"]
        batch.expand("actuator_gainprm")[ids, :, 0] = rand["actuator_kp"]
        batch.expand("actuator_biasprm")[ids, :, 1] = -rand["actuator_kp"]
        batch.set_const(ids)
        batch.reset(ids, keyframe=0, stage=mujoco.mjtStage.mjSTAGE_NONE)

    batch_reset_full = best_ms(lambda: batch.reset(keyframe=0, stage=0), 3)
    batch_reset_5pct = best_ms(lambda: batch.reset(ids, keyframe=0, stage=0), 10)
    # interleaved, so that a busy neighbour slows both alike; each keeps its best
    rand_times: dict[str, list[float]] = {"pool": [], "batch": []}
    for _ in range(10):
        rand_times["pool"].append(
            best_ms(lambda: pool.reset(ids, keyframe=0, randomization=rand), 1))
        rand_times["batch"].append(best_ms(batch_randomized_reset, 1))
    rand_5pct, batch_rand_5pct = min(rand_times["pool"]), min(rand_times["batch"])
    pool.close()
    threaded.close()

    rss, rss_before = rss_of_randomized_pool(4096)
    single = max(rates["rollout"])
    result = {
        "model": "unitree_g1/scene_mjx_feetonly_flat_terrain.xml",
        "mode": "quick" if quick else "full",
        "num_envs": num_envs,
        "num_threads": num_threads,
        "nstep_per_call": NSTEP,
        "rollout_1thread_substeps_per_s": single,
        "limit_substeps_per_s": num_threads * single,
        "rollout_threaded_substeps_per_s": max(rates["rollout_mt"]),
        "batch_substeps_per_s": max(rates["batch"]),
        "pool_substeps_per_s": max(rates["pool"]),
        "pool_equals_batch_bitwise": identical,
        "reset_full_ms": reset_full,
        "reset_5pct_ms": reset_5pct,
        "randomized_reset_5pct_ms": rand_5pct,
        "batch_reset_full_ms": batch_reset_full,
        "batch_reset_5pct_ms": batch_reset_5pct,
        "batch_randomized_reset_5pct_ms": batch_rand_5pct,
        "randomized_reset_vs_batch": rand_5pct / batch_rand_5pct,
        "median_round_randomized_reset_vs_batch": float(
            np.median(np.divide(rand_times["pool"], rand_times["batch"]))),
        "randomized_reset_rounds_ms": rand_times,
        "rss_mb_randomized": rss,
        "rss_mb_before_pool": rss_before,
        "rounds": rates,
        # per-round ratios: robust to a neighbour that slows one round down
        "median_round_pool_vs_batch": float(np.median(np.divide(rates["pool"], rates["batch"]))),
        "median_round_pool_vs_limit": float(
            np.median(np.divide(rates["pool"], rates["rollout"])) / num_threads),
    }
    return result


def task_checks(r: dict) -> dict[str, bool]:
    """The task-level targets, where task_bench.py measured them."""
    if "pool_task_env_steps_per_s" not in r:
        return {}
    out = {
        "g1 task >= 0.9 x limit / frame_skip": r["pool_task_env_steps_per_s"]
        >= 0.9 * r["task_limit_env_steps_per_s"],
        "g1 task >= numpy task on Batch": r["pool_task_env_steps_per_s"]
        >= r["batch_task_env_steps_per_s"],
    }
    for env in ("ant", "halfcheetah"):
        pool = r[f"pool_{env}_env_steps_per_s"]
        out[f"{env} >= 0.9 x its limit"] = pool >= 0.9 * r[f"{env}_limit_env_steps_per_s"]
        out[f"{env} >= 2 x gymnasium"] = pool >= 2 * r[f"gym_{env}_env_steps_per_s"]
    return out


def checks(r: dict) -> dict[str, bool]:
    return task_checks(r) | {
        "pool >= 0.97 x limit": r["pool_substeps_per_s"]
        >= TARGETS["pool_vs_limit"] * r["limit_substeps_per_s"],
        "pool >= 0.98 x batch": r["pool_substeps_per_s"]
        >= TARGETS["pool_vs_batch"] * r["batch_substeps_per_s"],
        "reset 5% <= full / 15": r["reset_5pct_ms"]
        <= TARGETS["reset_5pct_vs_full"] * r["reset_full_ms"],
        "rss <= 1500 MB": r["rss_mb_randomized"] <= TARGETS["rss_mb_randomized"],
        "randomized reset 5% <= Batch's": r["randomized_reset_vs_batch"]
        <= TARGETS["randomized_reset_vs_batch"],
    }


def print_table(r: dict) -> None:
    lim = r["limit_substeps_per_s"]
    print(f"\nBatchEnvPool on G1 ({r['num_envs']} envs, {r['num_threads']} threads, "
          f"{r['nstep_per_call']} substeps per call, {r['mode']} mode)")
    print(f"{'path':44s} {'value':>12s}  {'vs limit':>8s}")
    for label, key in [
        ("mujoco.rollout 1 thread (substeps/s)", "rollout_1thread_substeps_per_s"),
        ("limit = threads x rollout (substeps/s)", "limit_substeps_per_s"),
        ("mujoco.rollout, all threads (substeps/s)", "rollout_threaded_substeps_per_s"),
        ("mujoco.batch.Batch (substeps/s)", "batch_substeps_per_s"),
        ("BatchEnvPool (substeps/s)", "pool_substeps_per_s"),
    ]:
        print(f"{label:44s} {r[key]:12,.0f}  {r[key] / lim:8.3f}")
    for label, key in [
        ("pool reset, all envs (ms)", "reset_full_ms"),
        ("pool reset, 5% of envs (ms)", "reset_5pct_ms"),
        ("pool randomized reset, 5% (ms)", "randomized_reset_5pct_ms"),
        ("Batch reset, all envs (ms)", "batch_reset_full_ms"),
        ("Batch reset, 5% (ms)", "batch_reset_5pct_ms"),
        ("Batch expand+set_const+reset, 5% (ms)", "batch_randomized_reset_5pct_ms"),
        ("randomized reset, pool / Batch", "randomized_reset_vs_batch"),
        ("RSS, 4096 randomized envs (MB)", "rss_mb_randomized"),
        ("RSS of that process before the pool (MB)", "rss_mb_before_pool"),
    ]:
        print(f"{label:44s} {r[key]:12,.2f}")
    for key, value in r.items():
        if key.endswith("_env_steps_per_s"):
            print(f"{key:44s} {value:12,.0f}")
    print(f"pool state == Batch state, bitwise: {r['pool_equals_batch_bitwise']}")
    for name, ok in r["checks"].items():
        print(f"  [{'ok' if ok else 'MISS'}] {name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1024 envs, under 60 s")
    parser.add_argument("--out", type=Path, help="write the results as JSON")
    args = parser.parse_args(argv)
    result = measure(args.quick)
    try:
        sys.path.insert(0, str(Path(__file__).parent))
        from task_bench import measure_tasks
    except ImportError:
        measure_tasks = None
    if measure_tasks is not None:
        result.update(measure_tasks(args.quick, result["num_threads"],
                                    result["limit_substeps_per_s"]))
    result["checks"] = checks(result)
    print_table(result)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(args.out.suffix + ".tmp")
        tmp.write_text(json.dumps(result, indent=2))
        tmp.replace(args.out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
