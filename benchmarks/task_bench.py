"""Env-steps/s of fused C++ tasks on the pool against the strongest alternatives, in one run.

- g1-walk-flat: TaskVectorEnv (fused C++ task, auto-reset) against the same task written in
  numpy over upstream ``mujoco.batch.Batch`` (what an expert would write with MuJoCo alone);
  the ceiling is num_threads x the single-thread ``mujoco.rollout`` rate / frame_skip substeps.
  Measured at the task's default step (the scene's own 2 ms x 10 per 20 ms control step: the
  unsuffixed keys) and at 5 ms x 4 (keys with ``_5ms``; stable only under random and zero
  actions, docs/unilab/tasks.md).
- Ant-v5 and HalfCheetah-v5 (random actions, auto-reset): TaskVectorEnv against gymnasium's
  SyncVectorEnv (64 envs) and AsyncVectorEnv (2 workers), best of the two; the ceiling is
  num_threads x the single-thread ``mujoco.rollout`` rate from gymnasium's own reset states over
  the mean episode length, frame_skip substeps per env step.

Alternatives are measured interleaved, round after round, and each keeps its best round: other
work on the machine then hurts all of them alike. ``benchmarks/pool_throughput.py`` calls
:func:`measure_tasks`; standalone: ``python benchmarks/task_bench.py [--quick] --out FILE.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import sys
import time
from collections.abc import Callable

import mujoco
import numpy as np
from mujoco import batch as mjbatch
from mujoco import rollout as mjrollout

from lightning_unilab.envs import tasks
from lightning_unilab.envs.tasks.g1_walk import COMMAND, MEMORY, G1WalkFlat
from lightning_unilab.envs.tasks.rng import EnvRng
from lightning_unilab.envs.vector_env import TaskVectorEnv

GYM_ENVS = {"ant": "Ant-v5", "halfcheetah": "HalfCheetah-v5"}
OTHER_TIMESTEP = 0.005  # Isaac Lab's G1 step, the task's default for a while (keys "_5ms")


def _rate(step: Callable[[], int], seconds: float) -> float:
    """Items per second of step() (which returns its item count), after one warm-up call."""
    step()
    done, start = 0, time.perf_counter()
    while True:
        done += step()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return done / elapsed


def _interleave(methods: dict[str, Callable[[], int]], rounds: int,
                seconds: float) -> dict[str, float]:
    best = dict.fromkeys(methods, 0.0)
    for _ in range(rounds):
        for name, step in methods.items():
            best[name] = max(best[name], _rate(step, seconds))
    return best


# ---------------------------------------------------------------------------- G1


def _g1_params(timestep: float | None) -> dict[str, float]:
    return {} if timestep is None else {"timestep": timestep}


class _BatchG1:
    """g1-walk-flat over mujoco.batch.Batch: the numpy task on upstream MuJoCo's batch engine."""

    def __init__(self, num_envs: int, num_threads: int, seed: int = 0,
                 timestep: float | None = None) -> None:
        self.task = G1WalkFlat(**_g1_params(timestep))
        self.model = self.task.model()
        self.batch = mjbatch.Batch(self.model, num_envs, num_threads)
        self.n = num_envs
        self.rng = EnvRng(num_envs, seed)
        self.memory = np.zeros((num_envs, MEMORY))
        self.length = np.zeros(num_envs, np.int64)
        self.qpos, self.qvel, self.ctrl = (self.batch.bind(f) for f in ("qpos", "qvel", "ctrl"))
        self.sensordata = self.batch.bind("sensordata")
        self.force = self.batch.bind("actuator_force")
        self.site_xpos = self.batch.bind("site_xpos")  # the feet's heights (feet_phase)
        self.limit = self.task.spec.max_episode_steps
        self.start(np.arange(num_envs))

    def start(self, ids: np.ndarray) -> None:
        self.batch.reset(ids, stage=mujoco.mjtStage.mjSTAGE_NONE)
        qpos, base_vel = self.task.sample_start(ids, self.rng)
        self.qpos[ids] = qpos
        self.qvel[ids, :6] = base_vel
        self.batch.forward(ids)
        self.memory[ids] = 0
        self.memory[ids, COMMAND] = self.rng.uniform(ids, self.task.command_low,
                                                     self.task.command_high, 3)
        self.length[ids] = 0

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        self.ctrl[:] = self.task.controls(actions)
        try:
            self.batch.step(nstep=self.task.frame_skip)
            failed = np.zeros(self.n, bool)
        except mjbatch.SimulationError:
            failed = self.batch.status != 0
        reward, term = self.task.rewards(self.qpos, self.qvel, self.sensordata, self.force,
                                         actions, self.memory,
                                         self.site_xpos[:, self.task.feet_sites, 2])
        self.length += 1
        trunc = (self.length >= self.limit) | failed
        obs, critic = self.task.observe_arrays(self.qpos, self.qvel, self.sensordata,
                                               self.memory)
        done = np.flatnonzero(term | trunc)
        if len(done):
            self.start(done)
            obs[done], critic[done] = self.task.observe_arrays(
                self.qpos[done], self.qvel[done], self.sensordata[done], self.memory[done])
        return obs, reward, term


def g1_rollout_limit(num_threads: int, nbatch: int = 32, nstep: int = 200,
                     timestep: float | None = None) -> float:
    """num_threads x single-thread mujoco.rollout substeps/s on G1 from its knees_bent pose, at
    the task's step (its default, or timestep)."""
    m = tasks.load_model("g1-walk-flat", _g1_params(timestep))
    d = mujoco.MjData(m)
    mujoco.mj_resetDataKeyframe(m, d, m.key("knees_bent").id)
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    state = np.empty(mujoco.mj_stateSize(m, spec))
    mujoco.mj_getState(m, d, state, spec)
    control = np.broadcast_to(m.key("knees_bent").qpos[7:], (nbatch, nstep, m.nu)).copy()
    starts = np.broadcast_to(state, (nbatch, state.size)).copy()
    mjrollout.rollout(m, d, starts[:2], control[:2, :10])
    t = time.perf_counter()
    mjrollout.rollout(m, d, starts, control)
    return num_threads * nbatch * nstep / (time.perf_counter() - t)


def _mean_episode_length(env: TaskVectorEnv, actions: list[np.ndarray], steps: int) -> float:
    """Mean length of the episodes that end within steps of random play (max_episode_steps if
    none does): the workload over which rollout ceilings are measured."""
    total, ends = 0.0, 0
    for k in range(steps):
        *_, info = env.step(actions[k % len(actions)])
        total += float(info["episode_length"][info["done"]].sum())
        ends += int(info["done"].sum())
    return total / ends if ends else float(env.spec.max_episode_steps)


def _actions(rng: np.random.Generator, n: int, low: np.ndarray, high: np.ndarray,
             count: int = 8) -> list[np.ndarray]:
    return [rng.uniform(low, high, (n, len(low))) for _ in range(count)]


def _cycling(env_step: Callable[[np.ndarray], object], actions: list[np.ndarray],
             n: int) -> Callable[[], int]:
    k = [0]

    def step() -> int:
        env_step(actions[k[0] % len(actions)])
        k[0] += 1
        return n

    return step


def g1_task_rollout(num_threads: int, mean_length: float, count: int,
                    rng: np.random.Generator, timestep: float | None = None
                    ) -> Callable[[], int]:
    """A step function: single-thread rollouts of the task's own workload (its start states,
    its random actions held for frame_skip substeps, over its mean episode length), x
    num_threads."""
    task = G1WalkFlat(**_g1_params(timestep))
    m = task.model()
    d = mujoco.MjData(m)
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    qpos, base_vel = task.sample_start(np.arange(count), EnvRng(count, 7))
    starts = np.empty((count, mujoco.mj_stateSize(m, spec)))
    for i in range(count):
        mujoco.mj_resetData(m, d)
        d.qpos[:] = qpos[i]
        d.qvel[:6] = base_vel[i]
        mujoco.mj_getState(m, d, starts[i], spec)
    steps = max(1, int(round(mean_length)))
    actions = rng.uniform(-1, 1, (count, steps, 29))
    control = np.repeat(task.controls(actions), task.frame_skip, axis=1)

    def step() -> int:
        mjrollout.rollout(m, d, starts, control)
        return num_threads * count * steps

    return step


def measure_g1(quick: bool, num_threads: int, rounds: int, seconds: float,
               timestep: float | None = None) -> dict[str, float]:
    """The G1 rows at the task's default step, or at timestep (keys tagged ``_5ms`` etc.)."""
    n = 256 if quick else 1024
    rng = np.random.default_rng(0)
    acts = _actions(rng, n, -np.ones(29), np.ones(29))
    params = _g1_params(timestep)
    # copy=False: the zero-copy path a collector takes (its ring slots are passed as out=)
    pool = TaskVectorEnv("g1-walk-flat", n, num_threads, copy=False, params=params)
    pool.reset(seed=0)
    pool1 = TaskVectorEnv("g1-walk-flat", n // 4, 1, copy=False, params=params)
    pool1.reset(seed=0)
    mean_length = _mean_episode_length(pool1, [a[: n // 4] for a in acts],
                                       40 if quick else 200)
    batch = _BatchG1(n, num_threads, timestep=timestep)
    best = _interleave({
        "pool": _cycling(pool.step, acts, n),
        "batch": _cycling(batch.step, acts, n),
        "pool1": _cycling(pool1.step, [a[: n // 4] for a in acts], n // 4),
        "rollout": g1_task_rollout(num_threads, min(mean_length, 100.0), 4 if quick else 16,
                                   rng, timestep),
    }, rounds, seconds)
    t = "" if timestep is None else f"_{timestep * 1000:g}ms"
    return {f"pool_task{t}_env_steps_per_s": best["pool"],
            f"batch_task{t}_env_steps_per_s": best["batch"],
            f"task{t}_workload_limit_env_steps_per_s": best["rollout"],
            f"pool_task{t}_vs_workload_limit": best["pool"] / best["rollout"],
            f"pool_task{t}_1thread_vs_rollout": best["pool1"] * num_threads / best["rollout"],
            f"task{t}_mean_episode_length": mean_length,
            f"task{t}_timestep": float(pool.model.opt.timestep),
            f"task{t}_frame_skip": pool.spec.frame_skip, "task_num_envs": n}


# ---------------------------------------------------------------------------- gymnasium


@contextlib.contextmanager
def _quiet_stdout():
    """gymnasium's half_cheetah.xml uses a compiler attribute MuJoCo 4 deprecates, and MuJoCo
    prints the warning (to stderr) for every env made: keep the benchmark's table readable."""
    libc = ctypes.CDLL(None)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    try:
        with open(os.devnull, "w") as null:
            for fd in saved:
                os.dup2(null.fileno(), fd)
        yield
    finally:
        libc.fflush(None)  # drain C's buffers while they still go to /dev/null
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)


def _reset_states(name: str, count: int) -> tuple[mujoco.MjModel, np.ndarray, int]:
    import gymnasium as gym

    with _quiet_stdout():
        env = gym.make(name)
    u = env.unwrapped
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    rows = np.empty((count, mujoco.mj_stateSize(u.model, spec)))
    for i in range(count):
        env.reset(seed=i)
        mujoco.mj_getState(u.model, u.data, rows[i], spec)
    return u.model, rows, u.frame_skip


def gym_rollout_limit(name: str, num_threads: int, mean_length: float, count: int,
                      rng: np.random.Generator) -> Callable[[], int]:
    """A step function: single-thread rollouts from reset states over the mean episode length;
    returns env-steps done (substeps / frame_skip) x num_threads."""
    model, starts, frame_skip = _reset_states(name, count)
    data = mujoco.MjData(model)
    nstep = max(frame_skip, int(round(mean_length)) * frame_skip)
    low, high = model.actuator_ctrlrange[:, 0], model.actuator_ctrlrange[:, 1]
    control = rng.uniform(low, high, (count, nstep, model.nu))

    def step() -> int:
        mjrollout.rollout(model, data, starts, control)
        return num_threads * count * nstep // frame_skip

    return step


def _gym_vector(name: str, kind: str, n: int, rng: np.random.Generator
                ) -> tuple[Callable[[], int], Callable[[], None]]:
    import gymnasium as gym

    fns = [lambda: gym.make(name)] * n
    with _quiet_stdout():
        env = gym.vector.SyncVectorEnv(fns) if kind == "sync" else gym.vector.AsyncVectorEnv(fns)
        env.reset(seed=0)
    space = env.single_action_space
    acts = [rng.uniform(space.low, space.high, (n, space.shape[0])) for _ in range(8)]
    return _cycling(env.step, acts, n), env.close


def measure_gym_env(key: str, quick: bool, num_threads: int, rounds: int,
                    seconds: float) -> dict[str, float]:
    name = GYM_ENVS[key]
    rng = np.random.default_rng(1)
    n = 256 if quick else 1024
    with _quiet_stdout():
        pool = TaskVectorEnv(name, n, num_threads, copy=False)
        pool1 = TaskVectorEnv(name, n // 4, 1, copy=False)
    pool.reset(seed=0)
    spec = pool.spec
    acts = _actions(rng, n, spec.action_low, spec.action_high)
    pool1.reset(seed=0)
    mean_length = _mean_episode_length(pool1, [a[: n // 4] for a in acts], 50 if quick else 300)
    sync_step, sync_close = _gym_vector(name, "sync", 64, rng)
    async_step, async_close = _gym_vector(name, "async", 2, rng)
    count = 4 if quick else 16
    limit_len = min(mean_length, 200 if quick else 1000)
    try:
        best = _interleave({
            "pool": _cycling(pool.step, acts, n),
            "pool1": _cycling(pool1.step, [a[: n // 4] for a in acts], n // 4),
            "limit": gym_rollout_limit(name, num_threads, limit_len, count, rng),
            "sync": sync_step,
            "async": async_step,
        }, rounds, seconds)
    finally:
        sync_close()
        async_close()
    gym_best = max(best["sync"], best["async"])
    return {
        f"pool_{key}_env_steps_per_s": best["pool"],
        f"{key}_limit_env_steps_per_s": best["limit"],
        f"gym_{key}_env_steps_per_s": gym_best,
        f"gym_sync64_{key}_env_steps_per_s": best["sync"],
        f"gym_async2_{key}_env_steps_per_s": best["async"],
        f"{key}_mean_episode_length": mean_length,
        f"pool_{key}_vs_limit": best["pool"] / best["limit"],
        f"pool_{key}_vs_gym": best["pool"] / gym_best,
        f"pool_{key}_1thread_vs_rollout": best["pool1"] * num_threads / best["limit"],
    }


def measure_tasks(quick: bool, num_threads: int, limit_substeps_per_s: float) -> dict:
    """Every task-level number of the benchmark, measured in this run (see the module doc)."""
    rounds, seconds = (3, 0.3) if quick else (3, 2.0)
    out: dict[str, float] = {}
    out.update(measure_g1(quick, num_threads, rounds, seconds))
    out.update(measure_g1(quick, num_threads, rounds, seconds, timestep=OTHER_TIMESTEP))
    for key in GYM_ENVS:
        out.update(measure_gym_env(key, quick, num_threads, rounds, seconds * 0.6))
    # limit_substeps_per_s: a rollout's substeps/s, over each step's substeps per env step (from
    # the standing pose a substep costs about the same at 2 and 5 ms: docs/unilab/tasks.md)
    for t in ("", "_5ms"):
        limit = limit_substeps_per_s / out[f"task{t}_frame_skip"]
        out[f"task{t}_limit_env_steps_per_s"] = limit
        out[f"pool_task{t}_vs_limit"] = out[f"pool_task{t}_env_steps_per_s"] / limit
        out[f"pool_task{t}_vs_workload_limit"] = out.pop(f"pool_task{t}_vs_workload_limit")
        out[f"pool_task{t}_vs_batch"] = (out[f"pool_task{t}_env_steps_per_s"]
                                         / out[f"batch_task{t}_env_steps_per_s"])
    return out


def _table(results: dict) -> str:
    rows = [f"{'metric':<40} {'value':>14}"]
    for key, value in results.items():
        text = f"{value:14.3f}" if isinstance(value, float) and abs(value) < 100 else (
            f"{value:14,.0f}" if isinstance(value, int | float) else f"{value!s:>14}")
        rows.append(f"{key:<40} {text}")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="about 30 s instead of 3 minutes")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    start = time.perf_counter()
    limit = max(g1_rollout_limit(args.threads) for _ in range(2 if args.quick else 3))
    results = {"num_threads": args.threads, "limit_substeps_per_s": limit,
               **measure_tasks(args.quick, args.threads, limit)}
    results["seconds"] = time.perf_counter() - start
    print(_table(results))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
