"""TaskVectorEnv: N environments of one task on a BatchEnvPool, one C++ call per step.

    env = TaskVectorEnv("g1-walk-flat", num_envs=1024)
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(actions)

With a C++ task (a name from ``_core.task_names()``), a step is one call into the pool's worker
threads with the GIL released: per env, actions -> controls -> substeps with instability rollback
-> reward, termination, observation -> auto-reset, written straight into the output arrays.
A :class:`~lightning_unilab.envs.tasks.NumpyTask` runs the same steps in numpy between pool calls.

Auto-reset, in gymnasium's terms (``gymnasium.vector.AutoresetMode``):

- ``"same_step"`` (default): an env whose episode ends in a step restarts within that step; the
  returned obs row is the new episode's first obs, the last obs of the finished episode is in
  ``info["final_obs"]`` (and ``info["final_critic_obs"]``), valid where ``info["done"]``.
- ``"next_step"``: the finished env returns its last obs; the next step restarts it, ignores its
  action and returns reward 0, terminated and truncated False.

``info["episode_return"]`` and ``info["episode_length"]`` hold the totals of the episodes that
ended in this step (rows where ``info["done"]``). Truncation: the task's time limit, or an env
rolled back after a MuJoCo warning (status bits in ``pool.status``).

Outputs: by default (``copy=True``) ``reset`` and ``step`` return fresh arrays, as gymnasium's
``SyncVectorEnv``. ``copy=False`` returns the env's own output buffers, which the next call
overwrites (no copy: for loops that consume each step before the next). A caller's ``out``
buffers (e.g. shared-memory ring slots) are always written in place and returned as they are.

Status: ``info["status"]`` holds each env's status bits at the end of the step (MuJoCo warning
bits, STATUS_TOO_FAST past the task's ``spec.max_speed``, STATUS_BAD_ACTION, STATUS_ERROR), read
before a same-step auto-reset clears them from ``pool.status``: a truncation with nonzero status
was an instability, not a time limit. Named per-step diagnostics of the task (gymnasium's reward
terms ``reward_forward``, ``reward_ctrl``, ... and positions) are in ``info`` under their names
(``spec.info_names``).

Bad actions: ``nonfinite="raise"`` (default) raises ValueError naming the envs, before any env
steps. ``nonfinite="truncate"`` skips the check: an env with NaN or inf in its action is not
stepped, keeps its state, gets STATUS_BAD_ACTION in ``pool.status`` and its episode is truncated
(then auto-reset); the others step normally (C++ tasks only).

State: ``get_state()`` returns everything the next steps depend on as plain data (physics rows
with warm starts, per-env model fields, streams, episode bookkeeping, the randomization's
generator); ``set_state`` on a fresh env of the same task and num_envs continues bit for bit,
at any thread count (a checkpoint of a sync run keeps it: docs/unilab/runtime.md). A
NumpyTask's own attributes are not in it: such a task keeps per-env values in ``memory``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mujoco
import numpy as np

from lightning_omnilab.validate import (
    ArgumentTypeError,
    boolean,
    fail,
    non_negative_int,
    number,
    one_of,
    positive_int,
)
from lightning_unilab import _core
from lightning_unilab.envs import tasks
from lightning_unilab.envs.pool import BatchEnvPool, broadcast_real
from lightning_unilab.envs.tasks.base import NumpyTask, TaskSpec
from lightning_unilab.envs.tasks.ref import TaskBuildError, TaskRef, task_ref
from lightning_unilab.envs.tasks.rng import EnvRng

__all__ = ["AUTORESET_MODES", "STATUS_BAD_ACTION", "StepBuffers", "TaskVectorEnv"]

STATUS_BAD_ACTION: int = _core.STATUS_BAD_ACTION
AUTORESET_MODES = ("same_step", "next_step")

# (rng, env ids) -> {pool randomization field: values for those envs}
Randomizer = Callable[[np.random.Generator, np.ndarray], Mapping[str, np.ndarray]]


@dataclass
class StepBuffers:
    """Output arrays of a step, num_envs rows each; the caller may supply its own (ring slots)."""

    obs: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: np.ndarray
    episode_return: np.ndarray
    episode_length: np.ndarray
    critic: np.ndarray | None = None
    final_critic: np.ndarray | None = None
    # optional: (N, len(spec.info_names)) float64 diagnostics and (N,) uint32 status bits
    info: np.ndarray | None = None
    status: np.ndarray | None = None

    @classmethod
    def allocate(cls, num_envs: int, spec: TaskSpec) -> StepBuffers:
        critic = spec.critic_size
        ninfo = len(spec.info_names)
        return cls(
            obs=np.zeros((num_envs, spec.obs_size)),
            reward=np.zeros(num_envs),
            terminated=np.zeros(num_envs, bool),
            truncated=np.zeros(num_envs, bool),
            final_obs=np.zeros((num_envs, spec.obs_size)),
            episode_return=np.zeros(num_envs),
            episode_length=np.zeros(num_envs, np.int32),
            critic=np.zeros((num_envs, critic)) if critic else None,
            final_critic=np.zeros((num_envs, critic)) if critic else None,
            info=np.zeros((num_envs, ninfo)) if ninfo else None,
            status=np.zeros(num_envs, np.uint32),
        )

    def check(self, num_envs: int, spec: TaskSpec) -> None:
        """Shapes, dtypes, contiguity: the C++ side writes through raw pointers."""
        want = {
            "obs": ((num_envs, spec.obs_size), np.float64),
            "reward": ((num_envs,), np.float64),
            "terminated": ((num_envs,), np.bool_),
            "truncated": ((num_envs,), np.bool_),
            "final_obs": ((num_envs, spec.obs_size), np.float64),
            "episode_return": ((num_envs,), np.float64),
            "episode_length": ((num_envs,), np.int32),
        }
        if spec.critic_size:
            want["critic"] = want["final_critic"] = ((num_envs, spec.critic_size), np.float64)
        if self.info is not None and spec.info_names:
            want["info"] = ((num_envs, len(spec.info_names)), np.float64)
        if self.status is not None:
            want["status"] = ((num_envs,), np.uint32)
        for name, (shape, dtype) in want.items():
            arr = getattr(self, name)
            if not isinstance(arr, np.ndarray) or arr.shape != shape or arr.dtype != dtype:
                got = (f"{arr.dtype}{list(arr.shape)}" if isinstance(arr, np.ndarray)
                       else type(arr).__name__)
                raise ValueError(f"out.{name}: expected a {np.dtype(dtype)} array of shape "
                                 f"{shape}, got {got}")
            if not arr.flags.c_contiguous or not arr.flags.writeable:
                raise ValueError(f"out.{name}: expected a writable C-contiguous array")


def _check_seed(seed: Any, name: str) -> int:
    """A seed: an integer >= 0 (bool refused), as gymnasium requires."""
    return non_negative_int(name, seed) % 2**64


def _check_seeds(seed: Any, n: int) -> np.ndarray:
    """One seed for all (0-d) or one per reset env, all checked before anything is seeded."""
    if isinstance(seed, Sequence | np.ndarray) and not isinstance(seed, str):
        seeds = [_check_seed(s, f"seed[{i}]") for i, s in enumerate(seed)]
        if len(seeds) != n:
            raise ValueError(f"seed: expected one int or {n} ints (one per reset env), got "
                             f"{len(seeds)}")
        return np.array(seeds, np.uint64)
    return np.array(_check_seed(seed, "seed"), np.uint64)


def _check_params(params: Any) -> dict[str, float]:
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise TypeError(f"params: expected a mapping {{name: number}}, got "
                        f"{type(params).__name__}")
    clean = {}
    for key, value in params.items():
        if isinstance(value, bool) or not isinstance(value, int | float | np.integer |
                                                     np.floating):
            raise TypeError(f"params[{key!r}]: expected a number, got {value!r}")
        if math.isnan(float(value)):  # an infinity may mean "no bound" (reward_floor=-inf)
            raise ValueError(f"params[{key!r}]: expected a number, got NaN")
        clean[str(key)] = float(value)
    return clean


def _numpy_model_and_spec(task: NumpyTask) -> tuple[mujoco.MjModel, TaskSpec]:
    """The task's model and spec, an error naming the task class where either fails."""
    label = type(task).__qualname__
    try:
        model = task.model()
        spec = task.spec
    except Exception as err:
        raise TaskBuildError(f"task {label}: its model() or spec raised {type(err).__name__}: "
                             f"{err}") from err
    if not isinstance(model, mujoco.MjModel):
        raise TypeError(f"task {label}: model() returned a {type(model).__name__}, expected a "
                        "mujoco.MjModel")
    if not isinstance(spec, TaskSpec):
        raise TypeError(f"task {label}: spec is a {type(spec).__name__}, expected a TaskSpec")
    if spec.reset_info_size:
        raise ValueError(f"task {label}: spec.reset_info_size must be 0 for a NumpyTask (reset "
                         "info is written by C++ tasks only); report terms per step through "
                         "Transition.info")
    _check_spec(spec, f"task {label}: spec.")
    return model, spec


def _check_spec(spec: TaskSpec, prefix: str) -> None:
    """A user's spec against the rules a C++ task's spec follows, each field by name."""
    for name in ("obs_size", "action_size", "frame_skip"):
        positive_int(prefix + name, getattr(spec, name))
    for name in ("max_episode_steps", "critic_size", "memory_size", "resample_steps"):
        non_negative_int(prefix + name, getattr(spec, name), why="0: none")
    number(prefix + "max_speed", spec.max_speed, low=0)
    for name in ("action_low", "action_high"):
        bound = np.asarray(getattr(spec, name))
        if bound.shape != (spec.action_size,) or not np.issubdtype(bound.dtype, np.number) \
                or not np.isfinite(bound).all():
            fail(prefix + name, f"{spec.action_size} finite numbers (action_size)",
                 getattr(spec, name))
    if not (np.asarray(spec.action_low) < np.asarray(spec.action_high)).all():
        fail(prefix + "action_low", "below action_high in every entry", spec.action_low)
    if not all(isinstance(n, str) for n in spec.info_names):
        fail(prefix + "info_names", "a tuple of str", spec.info_names, ArgumentTypeError)


class TaskVectorEnv:
    """num_envs copies of a task, stepped together.

    Args:
        task: a registered task name (see ``lightning_unilab.envs.tasks.task_names()``), a
            :class:`NumpyTask` instance, or a task class (a NumpyTask subclass, its import path
            "pkg.module.Class", or ``{"class_path": ..., "init_args": {...}}``: built here, see
            :mod:`lightning_unilab.envs.tasks.ref`).
        num_envs: as for :class:`BatchEnvPool`.
        num_threads: as for :class:`BatchEnvPool`.
        autoreset: "same_step" or "next_step" (see the module doc).
        params: task parameters overriding defaults (C++ tasks; e.g. {"ctrl_cost_weight": 0.2});
            for a task class, init args over its own (a NumpyTask instance takes none).
        task_data: a C++ task's data that are not numbers (g1-motion-tracking's ``motions``:
            clip files), which its registry entry turns into the arrays the task reads.
        randomization: optional function (rng, ids) -> {pool model field: values} applied through
            ``BatchEnvPool.reset(randomization=...)`` to every env at reset() and to each env
            whose episode ended, before its next episode's first step.
        nonfinite: "raise" or "truncate" (see the module doc).
        seed: seed of the start-state streams (reset(seed=...) re-seeds).
        copy: return fresh arrays from reset and step (default), or, False, the env's own
            buffers, overwritten by the next call.
    """

    def __init__(
        self,
        task: str | NumpyTask | type[NumpyTask] | Mapping[str, Any] | TaskRef,
        num_envs: int,
        num_threads: int | None = None,
        *,
        autoreset: str = "same_step",
        params: Mapping[str, float] | None = None,
        task_data: Mapping[str, Any] | None = None,
        randomization: Randomizer | None = None,
        nonfinite: str = "raise",
        seed: int = 0,
        copy: bool = True,
    ) -> None:
        self._closed = True  # until constructed: close() and __del__ stay harmless
        one_of("autoreset", autoreset, AUTORESET_MODES)
        one_of("nonfinite", nonfinite, ("raise", "truncate"))
        if randomization is not None and not callable(randomization):
            raise TypeError("randomization: expected a function (rng, ids) -> {field: values}, "
                            f"got {type(randomization).__name__}")
        seed = _check_seed(seed, "seed")
        self.autoreset = autoreset
        self.nonfinite = nonfinite
        self.copy = boolean("copy", copy)
        self._randomization = randomization
        self._np_rng = np.random.default_rng(seed)
        self._params: dict[str, float] = {}
        self.task_data = dict(task_data) if task_data else None  # as given (evaluation, ghost)
        # the task as plain data ({class_path, init_args}) when built from a task class
        self.task_ref: TaskRef | None = None
        if not isinstance(task, NumpyTask):
            ref = task_ref(task)
            if isinstance(ref, TaskRef):
                if params:  # e.g. an evaluation's task_params over the class's init args
                    _check_params(params)
                    ref = ref.with_args({str(k): v for k, v in params.items()})
                    params = None
                self.task_ref = ref
                task = ref.build()
        if isinstance(task, NumpyTask):
            self._numpy: NumpyTask | None = task
            self.name = task.name if task.name != NumpyTask.name else type(task).__name__
            if params:
                raise ValueError("params: a NumpyTask takes its parameters in its constructor")
            if task_data:
                raise ValueError("task_data: a NumpyTask takes its data in its constructor")
            model, self.spec = _numpy_model_and_spec(task)
            self.pool = BatchEnvPool(model, num_envs, num_threads, outputs=task.outputs,
                                     stage=task.stage)
            self._core = None
            self._memory = np.zeros((num_envs, self.spec.memory_size))
            self._rng = EnvRng(num_envs, seed)
            self._length = np.zeros(num_envs, np.int32)
            self._return = np.zeros(num_envs)
            self._pending = np.zeros(num_envs, bool)
        elif isinstance(task, str):
            info = tasks.get(task)
            self._numpy = None
            self.name = info.name
            clean = _check_params(params)
            self._params = clean
            # model-level params (g1-walk-flat's timestep) go into the model here: the C++
            # task sees it const and checks it
            model = info.load_model(clean)
            arrays = info.task_arrays(model, clean, task_data)
            self.pool = BatchEnvPool(model, num_envs, num_threads)
            self._core = _core.TaskEnv(self.pool.core, info.name, clean,
                                       autoreset == "same_step", arrays)
            self.spec = TaskSpec.from_dict(self._core.spec)
            self._memory = self._core.memory()
            self._core.seed(None, int(seed) % 2**64)
        else:
            raise TypeError(f"task: expected a task name, a task class or a NumpyTask, got "
                            f"{type(task).__name__}")
        # model fields set by task parameters (g1-walk-flat: opt.timestep): fixed per task
        self._task_fields = tasks.model_param_fields(self.name)
        self.num_envs = self.pool.num_envs
        self.buffers = StepBuffers.allocate(self.num_envs, self.spec)
        self._all = np.arange(self.num_envs)
        self._closed = False

    # ------------------------------------------------------------------ public

    @property
    def model(self) -> mujoco.MjModel:
        return self.pool.model

    @property
    def episode_steps(self) -> np.ndarray:
        """Live (num_envs,) int32 steps taken in each env's current episode; writable, e.g. to
        start episodes at random points of the time limit."""
        self._check_open()
        if self._core is not None:
            return self._core.episode_steps()
        return self._length

    @property
    def memory(self) -> np.ndarray:
        """Live (num_envs, memory_size) task memory (commands, last actions ...)."""
        return self._memory

    def reset(
        self,
        seed: int | Sequence[int] | None = None,
        ids: np.ndarray | None = None,
        initial_state: np.ndarray | None = None,
        out: StepBuffers | None = None,
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start new episodes in ids (default: all), sampled or from initial_state rows.

        seed re-seeds the start-state streams of those envs: an int (env i's stream then
        depends on seed and i only, so results do not depend on num_threads), or one int per
        reset env (env i's stream from its own seed and i). Seeds are integers >= 0. Returns
        obs and info ("critic_obs" for tasks that have one, the task's reset diagnostics); only
        the rows of ids are written.
        """
        self._check_open()
        sel = self.pool.select(ids)
        idx = self._all if sel is None else sel.astype(np.int64)
        seeds = None if seed is None else _check_seeds(seed, len(idx))
        out = self._out(out)
        rows = None
        if initial_state is not None:
            rows = broadcast_real("initial_state", initial_state,
                                  (len(idx), self.pool.state_size))
        if seeds is not None:
            if self._core is not None:
                if seeds.ndim == 0:
                    self._core.seed(sel, int(seeds))
                else:
                    for env, s in zip(idx.tolist(), seeds.tolist(), strict=True):
                        self._core.seed(np.array([env], np.int32), s)
            else:
                if seeds.ndim == 0:
                    self._rng.seed(idx, int(seeds))
                else:
                    for env, s in zip(idx.tolist(), seeds.tolist(), strict=True):
                        self._rng.seed(np.array([env]), s)
            self._np_rng = np.random.default_rng(seeds.tolist())
        if self._randomization is not None:
            self._randomize(idx)
        if self._core is not None:
            self._core.reset(sel, rows, out.obs, out.critic, out.info)
        else:
            self._start(idx, rows, out)
        if out.status is not None:
            out.status[idx] = 0
        bad = ~np.isfinite(out.obs[idx]).all(axis=1)
        if bad.any():  # no silent NaN: start states the task's parameters made unreal
            raise ValueError(f"params: the start states of env(s) {idx[bad][:8].tolist()} are "
                             f"not finite under this task's parameters {self._params!r} (or "
                             "initial_state rows); check their magnitudes")
        return self._result(out, out.obs), self._info(out, reset=True)

    def step(
        self, actions: np.ndarray, out: StepBuffers | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """One env step of every env; see the module doc for auto-reset and outputs."""
        self._check_open()
        given = out is not None
        out = self._out(out)
        acts, float32 = self._actions(actions)
        if self._core is not None:
            self._core.step(acts, out.obs, out.critic, out.reward, out.terminated.view(np.uint8),
                            out.truncated.view(np.uint8), out.final_obs, out.final_critic,
                            out.episode_return, out.episode_length, out.info, out.status,
                            float32)
        else:
            self._numpy_step(acts, out)
            self._numpy.update(self._memory)
        done = out.terminated | out.truncated
        if self._randomization is not None and done.any():
            self._randomize(np.flatnonzero(done), keep_state=True)
        info = self._info(out, done=done)
        if given or not self.copy:
            return out.obs, out.reward, out.terminated, out.truncated, info
        return (out.obs.copy(), out.reward.copy(), out.terminated.copy(), out.truncated.copy(),
                info)

    def get_state(self) -> dict[str, Any]:
        """Everything the next steps depend on, as plain data (numpy arrays, ints, str): the
        pool's state (physics rows with warm starts, status, per-env model fields), each env's
        start-state stream, task memory, running return and length, pending restarts, and the
        randomization's generator. A fresh env of the same task, num_envs and autoreset given
        it by :meth:`set_state` steps on bit for bit as this one would (any num_threads)."""
        self._check_open()
        if self._core is not None:
            episodes = self._core.get_state()
        else:
            episodes = {"rng": self._rng.state.copy(), "memory": self._memory.ravel().copy(),
                        "returns": self._return.copy(), "lengths": self._length.copy(),
                        "pending": self._pending.astype(np.uint8),
                        "shared": self._numpy.shared.copy()}
        return {"task": self.name, "num_envs": self.num_envs, "autoreset": self.autoreset,
                "timestep": float(self.model.opt.timestep),
                "pool": self.pool.get_state(), "episodes": episodes,
                "randomization_rng": json.dumps(self._np_rng.bit_generator.state)}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`get_state` of an env of the same task, num_envs, autoreset and
        physics step (``timestep``, where the state has it).
        Everything is checked first: ValueError naming the entry that does not fit."""
        self._check_open()
        if not isinstance(state, Mapping):
            raise TypeError(f"state: expected the mapping of get_state(), got "
                            f"{type(state).__name__}")
        checks = [("task", self.name), ("num_envs", self.num_envs), ("autoreset", self.autoreset)]
        if "timestep" in state:  # (states saved before it was kept have none)
            checks.append(("timestep", float(self.model.opt.timestep)))
        for key, want in checks:
            if state.get(key) != want:
                raise ValueError(f"state[{key!r}]: saved from an env with {key} "
                                 f"{state.get(key)!r}, this one has {want!r}")
        episodes = state.get("episodes")
        if not isinstance(episodes, Mapping):
            raise ValueError("state['episodes']: expected a mapping of per-env arrays")
        n = self.num_envs
        shared = self.shared
        want = {"rng": ((n,), np.uint64), "memory": ((n * self.spec.memory_size,), np.float64),
                "returns": ((n,), np.float64), "lengths": ((n,), np.int32),
                "pending": ((n,), np.uint8), "shared": ((shared.size,), np.float64)}
        if "shared" not in episodes and shared.size == 0:  # saved before tasks shared state
            episodes = {**episodes, "shared": np.zeros(0)}
        clean = {}
        for key, (shape, dtype) in want.items():
            arr = np.asarray(episodes.get(key))
            if arr.shape != shape or arr.dtype != dtype:
                raise ValueError(f"state['episodes'][{key!r}]: expected {np.dtype(dtype)}"
                                 f"{list(shape)}, got {arr.dtype}{list(arr.shape)}")
            clean[key] = np.ascontiguousarray(arr)
        generator = np.random.default_rng()
        try:
            generator.bit_generator.state = json.loads(state.get("randomization_rng"))
        except (TypeError, ValueError, KeyError) as err:
            raise ValueError(f"state['randomization_rng']: not a generator state ({err})") from None
        if not isinstance(state.get("pool"), Mapping):
            raise ValueError("state['pool']: expected the mapping of BatchEnvPool.get_state()")
        self.pool.set_state(state["pool"])  # checks all of its entries before writing
        if self._core is not None:
            self._core.set_state(clean)
        else:
            self._rng.state[:] = clean["rng"]
            self._memory[:] = clean["memory"].reshape(self._memory.shape)
            self._return[:] = clean["returns"]
            self._length[:] = clean["lengths"]
            self._pending[:] = clean["pending"].astype(bool)
            self._numpy.shared[:] = clean["shared"]
        self._np_rng = generator

    @property
    def params(self) -> dict[str, float]:
        """The C++ task's parameters as given (its defaults: ``_core.task_defaults``)."""
        return dict(self._params)

    @property
    def shared(self) -> np.ndarray:
        """A copy of the task's state shared by all envs (g1-motion-tracking: the failure
        average and the sampling distribution over its start bins; empty for most tasks)."""
        self._check_open()
        if self._core is not None:
            return self._core.shared()
        return self._numpy.shared.copy()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Release the pool; later calls raise RuntimeError. Closing twice is harmless."""
        if self._closed:
            return
        self._closed = True
        self._core = None
        self.pool.close()

    def __repr__(self) -> str:
        if self._closed:
            return "TaskVectorEnv(closed)"
        return (f"TaskVectorEnv({self.name!r}, num_envs={self.num_envs}, "
                f"autoreset={self.autoreset!r}, {'numpy' if self._numpy else 'C++'})")

    # ------------------------------------------------------------------ internals

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"the TaskVectorEnv of {self.name!r} is closed")

    def _out(self, out: StepBuffers | None) -> StepBuffers:
        if out is None:
            return self.buffers
        if not isinstance(out, StepBuffers):
            raise TypeError(f"out: expected StepBuffers, got {type(out).__name__}")
        out.check(self.num_envs, self.spec)
        return out

    def _result(self, out: StepBuffers, arr: np.ndarray) -> np.ndarray:
        """arr itself for caller buffers or copy=False, else a copy."""
        return arr if out is not self.buffers or not self.copy else arr.copy()

    def _actions(self, actions: Any) -> tuple[np.ndarray, bool]:
        shape = (self.num_envs, self.spec.action_size)
        arr = np.asarray(actions)
        if arr.dtype.kind != "f":
            raise TypeError(f"actions: expected floating-point actions of shape {shape}, got "
                            f"dtype {arr.dtype}")
        if arr.shape != shape:
            raise ValueError(f"actions: expected shape {shape} (num_envs, action_size), got "
                             f"{arr.shape}")
        float32 = arr.dtype == np.float32
        arr = np.ascontiguousarray(arr, dtype=np.float64)
        if self.nonfinite == "raise" or self._core is None:
            bad = ~np.isfinite(arr).all(axis=1)
            if bad.any():
                envs = np.flatnonzero(bad)
                raise ValueError(f"actions: NaN or inf in the actions of env(s) "
                                 f"{envs[:8].tolist()}{' ...' if len(envs) > 8 else ''}; "
                                 "no env was stepped")
        return arr, float32

    def _info(self, out: StepBuffers, reset: bool = False,
              done: np.ndarray | None = None) -> dict[str, Any]:
        keep = self._result
        info: dict[str, Any] = {}
        if out.critic is not None:
            info["critic_obs"] = keep(out, out.critic)
        names = self.spec.info_names
        if out.info is not None and names:
            columns = keep(out, out.info)
            for k, name in enumerate(names[: self.spec.reset_info_size] if reset else names):
                info[name] = columns[:, k]
        if reset:
            return info
        info["done"] = done
        info["episode_return"] = keep(out, out.episode_return)
        info["episode_length"] = keep(out, out.episode_length)
        if out.status is not None:
            info["status"] = keep(out, out.status)
        if self.autoreset == "same_step":
            info["final_obs"] = keep(out, out.final_obs)
            if out.final_critic is not None:
                info["final_critic_obs"] = keep(out, out.final_critic)
        return info

    def _randomize(self, ids: np.ndarray, keep_state: bool = False) -> None:
        assert self._randomization is not None
        fields = dict(self._randomization(self._np_rng, ids))
        fixed = sorted(fields.keys() & self._task_fields.keys())
        if fixed:
            raise ValueError(f"randomization: {fixed[0]!r} is {self.name}'s task parameter "
                             f"{self._task_fields[fixed[0]]!r} (its substeps and dt follow it): "
                             "set it through params, not per env")
        sel = ids.astype(np.int32)
        state = self.pool.state[sel].copy() if keep_state else None
        self.pool.reset(sel, initial_state=state, randomization=fields)

    # numpy task path: the same steps as TaskEnv::StepKernel, vectorized over envs

    def _start(self, ids: np.ndarray, rows: np.ndarray | None, out: StepBuffers) -> None:
        task = self._numpy
        assert task is not None
        sel = ids.astype(np.int32)
        if rows is not None:
            self.pool.reset(sel, initial_state=rows)
        else:
            self.pool.reset(sel)
            task.reset(self.pool, ids, self._rng, self._memory)
        self.pool.forward(sel, "acc")
        task.start(self.pool, ids, self._memory)
        task.resample(ids, self._rng, self._memory)
        self._return[ids] = 0
        self._length[ids] = 0
        self._pending[ids] = False
        task.observe(self.pool, ids, self._memory, out.obs, out.critic)

    def _info_rows(self, info: Any, n: int) -> np.ndarray:
        """A NumpyTask's ``Transition.info`` as (n, len(info_names)) rows in the spec's order."""
        names = self.spec.info_names
        label = f"task {self.name}"
        if info is None:
            raise ValueError(f"{label}: spec.info_names names {list(names)} but evaluate() "
                             "returned no Transition.info")
        if isinstance(info, Mapping):
            if set(info) != set(names):
                raise ValueError(f"{label}: Transition.info has keys {sorted(info)}, expected "
                                 f"spec.info_names {list(names)}")
            rows = np.stack([np.broadcast_to(np.asarray(info[k], np.float64), (n,))
                             for k in names], axis=1)
        else:
            rows = np.asarray(info, np.float64)
        if rows.shape != (n, len(names)):
            raise ValueError(f"{label}: Transition.info: expected {n} rows (the stepped envs) of "
                             f"{len(names)} terms {list(names)}, got shape {rows.shape}")
        return rows

    def _numpy_step(self, actions: np.ndarray, out: StepBuffers) -> None:
        task = self._numpy
        assert task is not None
        spec = self.spec
        pending = np.flatnonzero(self._pending)
        active = np.flatnonzero(~self._pending)
        if len(pending):
            self._start(pending, None, out)
            out.reward[pending] = 0
            out.terminated[pending] = False
            out.truncated[pending] = False
            if out.status is not None:
                out.status[pending] = 0
            if out.info is not None:
                out.info[pending] = 0
        if not len(active):
            return
        status_before = self.pool.status[active].copy()
        ctrl_before = self.pool.ctrl[active]  # a copy: fancy indexing
        task.act(self.pool, active, actions[active], self._memory)
        self.pool.step(active.astype(np.int32), nstep=spec.frame_skip, stage=task.stage,
                       max_speed=spec.max_speed)
        raised = self.pool.status[active] != status_before
        if raised.any():
            # the whole state from before the step, its controls too, as the C++ task's rollback
            # (act wrote this step's controls into the pool's state rows, which the pool restored)
            self.pool.ctrl[active[raised]] = ctrl_before[raised]
            self.pool.forward(active[raised].astype(np.int32), "acc")
        tr = task.evaluate(self.pool, active, actions[active], self._memory)
        truncated = np.zeros(len(active), bool) if tr.truncated.size == 0 else tr.truncated.copy()
        truncated |= raised
        self._return[active] += tr.reward
        self._length[active] += 1
        length = self._length[active]
        if spec.max_episode_steps > 0:
            truncated |= length >= spec.max_episode_steps
        terminated = np.asarray(tr.terminated, bool)
        if spec.resample_steps > 0:
            due = (length % spec.resample_steps == 0) & ~terminated & ~truncated
            if due.any():
                task.resample(active[due], self._rng, self._memory)
        task.observe(self.pool, active, self._memory, out.obs, out.critic)
        out.reward[active] = tr.reward
        out.terminated[active] = terminated
        if out.info is not None and spec.info_names:
            out.info[active] = self._info_rows(tr.info, len(active))
        out.truncated[active] = truncated
        if out.status is not None:
            out.status[active] = self.pool.status[active]
        done = active[terminated | truncated]
        if not len(done):
            return
        out.episode_return[done] = self._return[done]
        out.episode_length[done] = self._length[done]
        if self.autoreset == "next_step":
            self._pending[done] = True
            return
        out.final_obs[done] = out.obs[done]
        if out.critic is not None and out.final_critic is not None:
            out.final_critic[done] = out.critic[done]
        self._start(done, None, out)
