"""The rollout batch: T steps of N envs, time-major, and the one function that fills it.

The same layout is used for a ring slot in shared memory (:mod:`lightning_unilab.runtime.ring`) and
for plain numpy arrays in a single process (tests, the synchronous path). :func:`collect` writes
straight into whatever arrays it is given, so a collector fills a ring slot with no extra copy.

Fields (``RolloutSpec.fields()``; ``obs``, ``critic`` and ``act`` are the sizes of the spec):

==================  ================  =====================================================
name                shape, dtype      meaning
==================  ================  =====================================================
obs                 [T,N,obs] f32     raw (unnormalized) observation the action was taken on
critic_obs          [T,N,critic] f32  raw critic observation at the same state
actions             [T,N,act] f32     sampled actions (before the task clips them)
behaviour_logp      [T,N] f32         log-prob of ``actions`` under the behaviour policy
behaviour_mean      [T,N,act] f32     behaviour policy mean
behaviour_log_std   [T,N,act] f32     behaviour policy log std
rewards             [T,N] f32         reward of step t
terminated          [T,N] bool        episode ended in a terminal state at step t
truncated           [T,N] bool        episode was cut (time limit, unstable physics) at step t
final_critic_obs    [T,N,critic] f32  critic obs of the last state of the episode that ended at
                                      step t; valid where terminated | truncated (bootstrap
                                      truncated episodes with V(final_critic_obs))
last_critic_obs     [N,critic] f32    critic obs after step T-1 (bootstrap value of the rollout)
policy_version      [] int64          version of the weights that produced the rollout
seq                 [] int64          rollout number of this collector, from 0
env_steps           [] int64          env steps of this collector so far, this rollout included
episodes            [] int64          episodes that ended in this rollout
episode_return_sum  [] f64            sum of their returns
episode_length_sum  [] int64          sum of their lengths
unstable_episodes   [] int64          of them, those the env cut for instability (nonzero
                                      status: a MuJoCo warning, a speed past the task's
                                      max_speed, a non-finite action; rolled back)
episodes_total      [] int64          episodes ended since the collector started
recent_return_mean  [] f64            mean return of this rollout's episodes, or of the latest
recent_length_mean  [] f64            rollout that had any (NaN before the first episode ends)
collect_s           [] f64            wall time of :func:`collect` for this rollout
info_mean           [K] f64           mean over the T*N steps of each of the task's K named
                                      per-step diagnostics (``info_names``: reward terms,
                                      velocities ...); only when the task has any
==================  ================  =====================================================

Auto-reset is the env's ``same_step`` mode: when step t ends an episode, ``obs[t+1]`` is already
the first observation of the next episode. Tasks without separate critic observations use the
actor observation as critic observation (``critic_size == obs_size``).

:func:`as_tensors` turns the arrays into zero-copy torch tensors plus a ``"stats"`` dict of Python
scalars with exactly these keys, which the learner logs:

- ``episodes``: episodes that ended in this rollout (int)
- ``episodes_total``: episodes ended since the collector started (int)
- ``unstable_episodes``: episodes of this rollout cut for instability (int; see above)
- ``episode_return_mean``, ``episode_length_mean``: ``recent_*_mean`` above (float; NaN until
  the first episode ends, so log them only when ``episodes_total > 0``)
- ``env_steps``: env steps of the collector so far (int)
- ``env_steps_per_s``: N*T / collect_s of this rollout (float; collection speed alone)
- ``policy_version``: version of the weights that produced the rollout (int)
- ``seq``: rollout number (int)
- ``wait_s``: time the reader waited for this rollout (float; 0.0 in-process)
- ``step_info``: ``{name: mean per step}`` of the task's diagnostics (``info_mean`` under the
  spec's ``info_names``; empty when the task has none or the caller passed no names). A reward
  term's mean per step shows what the policy gets better at while episodes grow longer.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from lightning_omnilab.validate import positive_int
from lightning_unilab.envs.vector_env import StepBuffers, TaskVectorEnv

__all__ = ["RolloutSpec", "RolloutState", "as_tensors", "collect", "STATS_KEYS"]

ALIGN = 64  # every field starts on a cache line: no false sharing, aligned atomics in headers

STATS_KEYS = ("episodes", "episodes_total", "episode_return_mean", "episode_length_mean",
              "unstable_episodes", "env_steps", "env_steps_per_s", "policy_version", "seq",
              "wait_s", "step_info")

_SCALARS: dict[str, type] = {
    "policy_version": np.int64, "seq": np.int64, "env_steps": np.int64, "episodes": np.int64,
    "episode_return_sum": np.float64, "episode_length_sum": np.int64, "unstable_episodes": np.int64,
    "episodes_total": np.int64, "recent_return_mean": np.float64,
    "recent_length_mean": np.float64, "collect_s": np.float64,
}


@dataclass(frozen=True)
class RolloutSpec:
    """Sizes of one rollout batch; everything else (fields, bytes, offsets) follows from them."""

    num_envs: int
    horizon: int
    obs_size: int
    critic_size: int
    action_size: int
    info_names: tuple[str, ...] = ()  # the task's per-step diagnostics, averaged per rollout

    def __post_init__(self) -> None:
        hint = {"num_envs": " (N: envs per collector)", "horizon": " (T: steps per rollout)"}
        for name in ("num_envs", "horizon", "obs_size", "critic_size", "action_size"):
            try:
                positive_int(name, getattr(self, name), below=2**31)
            except ValueError as err:
                raise ValueError(f"{err}{hint.get(name, '')}") from None
        names = self.info_names
        if not isinstance(names, tuple) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"info_names: expected a tuple of str, got {names!r}")

    @classmethod
    def from_env(cls, env: TaskVectorEnv, horizon: int) -> RolloutSpec:
        spec = env.spec
        return cls(num_envs=env.num_envs, horizon=horizon, obs_size=spec.obs_size,
                   critic_size=spec.critic_size or spec.obs_size, action_size=spec.action_size,
                   info_names=tuple(spec.info_names))

    def resized(self, num_envs: int, horizon: int) -> RolloutSpec:
        """The same task's layout for another number of envs and steps."""
        return dataclasses.replace(self, num_envs=num_envs, horizon=horizon)

    def fields(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """{name: (shape, dtype)} in layout order (see the module doc)."""
        t, n, o, c, a = (self.horizon, self.num_envs, self.obs_size, self.critic_size,
                         self.action_size)
        f32, b = np.dtype(np.float32), np.dtype(np.bool_)
        out: dict[str, tuple[tuple[int, ...], np.dtype]] = {
            "obs": ((t, n, o), f32),
            "critic_obs": ((t, n, c), f32),
            "actions": ((t, n, a), f32),
            "behaviour_logp": ((t, n), f32),
            "behaviour_mean": ((t, n, a), f32),
            "behaviour_log_std": ((t, n, a), f32),
            "rewards": ((t, n), f32),
            "terminated": ((t, n), b),
            "truncated": ((t, n), b),
            "final_critic_obs": ((t, n, c), f32),
            "last_critic_obs": ((n, c), f32),
        }
        for name, dtype in _SCALARS.items():
            out[name] = ((), np.dtype(dtype))
        if self.info_names:
            out["info_mean"] = ((len(self.info_names),), np.dtype(np.float64))
        return out

    def layout(self) -> dict[str, tuple[int, tuple[int, ...], np.dtype]]:
        """{name: (byte offset, shape, dtype)}, each field 64-byte aligned."""
        offset, out = 0, {}
        for name, (shape, dtype) in self.fields().items():
            out[name] = (offset, shape, dtype)
            size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            offset += -(-size // ALIGN) * ALIGN
        return out

    @property
    def nbytes(self) -> int:
        """Bytes of one batch in the aligned layout (a ring slot's payload)."""
        offset, shape, dtype = list(self.layout().values())[-1]
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return offset + -(-size // ALIGN) * ALIGN

    def views(self, buffer: Any, offset: int = 0) -> dict[str, np.ndarray]:
        """Numpy views of every field in ``buffer`` (e.g. a shared-memory block) at ``offset``."""
        return {name: np.ndarray(shape, dtype, buffer=buffer, offset=offset + off)
                for name, (off, shape, dtype) in self.layout().items()}

    def allocate(self) -> dict[str, np.ndarray]:
        """Zeroed arrays of one batch in one private aligned block."""
        return self.views(np.zeros(self.nbytes, np.uint8))


@dataclass
class RolloutState:
    """What :func:`collect` keeps between rollouts: the env's current observations and counters.

    The env writes into ``buffers`` (float64, the env's own dtype); ``buffers.obs`` is the running
    observation, cast into the batch's float32 ``obs`` row before the policy acts on it.
    """

    buffers: StepBuffers
    policy_version: int = 0
    seq: int = 0
    env_steps: int = 0
    episodes_total: int = 0
    recent_return_mean: float = float("nan")
    recent_length_mean: float = float("nan")
    _views: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def start(cls, env: TaskVectorEnv, seed: int | None = 0) -> RolloutState:
        """Reset every env of ``env`` (seeded) and return the state of the first rollout."""
        if env.autoreset != "same_step":
            raise ValueError(f"env.autoreset: the rollout format needs 'same_step', got "
                             f"{env.autoreset!r}")
        buffers = StepBuffers.allocate(env.num_envs, env.spec)
        env.reset(seed=seed, out=buffers)
        return cls(buffers=buffers)

    @property
    def critic(self) -> np.ndarray:
        return self.buffers.critic if self.buffers.critic is not None else self.buffers.obs

    @property
    def final_critic(self) -> np.ndarray:
        buf = self.buffers
        return buf.final_critic if buf.final_critic is not None else buf.final_obs

    def counters(self) -> dict[str, Any]:
        """The episode and step counters (a collector's share of a checkpoint)."""
        return {"seq": self.seq, "env_steps": self.env_steps,
                "episodes_total": self.episodes_total,
                "recent_return_mean": self.recent_return_mean,
                "recent_length_mean": self.recent_length_mean}

    def load_counters(self, counters: dict[str, Any]) -> None:
        for key in ("seq", "env_steps", "episodes_total"):
            setattr(self, key, int(counters[key]))
        for key in ("recent_return_mean", "recent_length_mean"):
            setattr(self, key, float(counters[key]))

    def get_state(self) -> dict[str, Any]:
        """Counters and copies of the env's output rows (the running observations, and the
        final-observation rows :func:`collect` copies whole into every batch)."""
        buffers = {name: arr.copy() for name, arr in vars(self.buffers).items()
                   if isinstance(arr, np.ndarray)}
        return {"buffers": buffers, "policy_version": self.policy_version, **self.counters()}

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`get_state` of a rollout of the same env; ValueError naming the
        buffer that does not fit."""
        if not isinstance(state, dict):
            raise ValueError(f"state: expected the dict of get_state(), got "
                             f"{type(state).__name__}")
        saved = state.get("buffers")
        if not isinstance(saved, dict):
            raise ValueError("state['buffers']: expected {name: array} of the env's outputs")
        mine = {name: arr for name, arr in vars(self.buffers).items()
                if isinstance(arr, np.ndarray)}
        if set(saved) != set(mine):
            raise ValueError(f"state['buffers']: holds {sorted(saved)}, expected {sorted(mine)}")
        for name, arr in mine.items():
            value = np.asarray(saved[name])
            if value.shape != arr.shape or value.dtype != arr.dtype:
                raise ValueError(f"state['buffers'][{name!r}]: expected {arr.dtype}"
                                 f"{list(arr.shape)}, got {value.dtype}{list(value.shape)}")
        for name, arr in mine.items():
            arr[...] = saved[name]
        self.load_counters(state)
        self.policy_version = int(state["policy_version"])


def _check_arrays(env: TaskVectorEnv, arrays: dict[str, np.ndarray]) -> int:
    horizon = arrays["rewards"].shape[0] if "rewards" in arrays else 0
    want = RolloutSpec.from_env(env, max(horizon, 1)).fields()
    for name, (shape, dtype) in want.items():
        arr = arrays.get(name)
        if name == "info_mean" and arr is None:
            continue  # diagnostics are optional: a layout without them just does not report them
        if not isinstance(arr, np.ndarray) or arr.shape != shape or arr.dtype != dtype:
            got = f"{arr.dtype}{list(arr.shape)}" if isinstance(arr, np.ndarray) else repr(arr)
            raise ValueError(f"arrays[{name!r}]: expected {dtype}{list(shape)} for this env, "
                             f"got {got}")
    return horizon


def collect(
    env: TaskVectorEnv,
    policy: Any,
    arrays: dict[str, np.ndarray],
    state: RolloutState,
) -> dict[str, np.ndarray]:
    """Step ``env`` T times with ``policy.act`` and write the rollout into ``arrays``.

    ``policy`` is an :class:`~lightning_unilab.learner.policy.ActorCritic` (float32, CPU) or
    anything with its ``act(obs) -> (action, logp, mean, log_std)``. ``arrays`` are the batch
    fields (from :meth:`RolloutSpec.views` of a ring slot or :meth:`RolloutSpec.allocate`);
    terminated and truncated are written by the env itself, the float fields are cast from the
    env's float64 rows (the one unavoidable conversion). Returns ``arrays``.
    """
    horizon = _check_arrays(env, arrays)
    start = time.perf_counter()
    tens = {name: torch.from_numpy(arr) for name, arr in arrays.items() if arr.ndim}
    buf = state.buffers
    info_mean = arrays.get("info_mean")
    info_sum = np.zeros(len(env.spec.info_names)) if info_mean is not None else None
    ret_sum, len_sum, episodes, unstable = 0.0, 0, 0, 0
    critic_is_obs = buf.critic is None
    for t in range(horizon):
        obs_t = arrays["obs"][t]
        np.copyto(obs_t, buf.obs, casting="same_kind")
        if critic_is_obs:
            arrays["critic_obs"][t] = obs_t
        else:
            np.copyto(arrays["critic_obs"][t], buf.critic, casting="same_kind")
        action, logp, mean, log_std = policy.act(tens["obs"][t])
        tens["actions"][t].copy_(action)
        tens["behaviour_logp"][t].copy_(logp)
        tens["behaviour_mean"][t].copy_(mean)
        tens["behaviour_log_std"][t].copy_(log_std.expand_as(mean))
        # the env writes its flags straight into the batch rows; float outputs go to float64 rows
        buf.terminated = arrays["terminated"][t]
        buf.truncated = arrays["truncated"][t]
        env.step(arrays["actions"][t], out=buf)
        np.copyto(arrays["rewards"][t], buf.reward, casting="same_kind")
        done = buf.terminated | buf.truncated
        np.copyto(arrays["final_critic_obs"][t], state.final_critic, casting="same_kind")
        if info_sum is not None and buf.info is not None:
            info_sum += buf.info.sum(axis=0)
        if done.any():
            episodes += int(done.sum())
            ret_sum += float(buf.episode_return[done].sum())
            len_sum += int(buf.episode_length[done].sum())
            if buf.status is not None:  # read before the same-step restart cleared the pool's
                unstable += int(np.count_nonzero(buf.status[done]))
    np.copyto(arrays["last_critic_obs"], state.critic, casting="same_kind")
    # detach the flag rows from the batch again: the next call may get other arrays
    buf.terminated = np.zeros(env.num_envs, bool)
    buf.truncated = np.zeros(env.num_envs, bool)

    state.env_steps += horizon * env.num_envs
    state.episodes_total += episodes
    if episodes:
        state.recent_return_mean = ret_sum / episodes
        state.recent_length_mean = len_sum / episodes
    scalars = {
        "policy_version": state.policy_version, "seq": state.seq, "env_steps": state.env_steps,
        "episodes": episodes, "episode_return_sum": ret_sum, "episode_length_sum": len_sum,
        "unstable_episodes": unstable,
        "episodes_total": state.episodes_total, "recent_return_mean": state.recent_return_mean,
        "recent_length_mean": state.recent_length_mean,
        "collect_s": time.perf_counter() - start,
    }
    for name, value in scalars.items():
        arrays[name][()] = value
    if info_mean is not None and info_sum is not None:
        info_mean[:] = info_sum / (horizon * env.num_envs)
    state.seq += 1
    return arrays


def stats_of(arrays: dict[str, np.ndarray], wait_s: float = 0.0,
             info_names: tuple[str, ...] = ()) -> dict[str, Any]:
    """The ``"stats"`` dict of :func:`as_tensors` (keys in ``STATS_KEYS``)."""
    n = arrays["rewards"].size
    collect_s = float(arrays["collect_s"])
    info = arrays.get("info_mean")
    if info_names and (info is None or info.shape != (len(info_names),)):
        got = None if info is None else info.shape
        raise ValueError(f"info_names: {len(info_names)} names, but the batch's info_mean has "
                         f"shape {got}")
    step_info = ({name: float(v) for name, v in zip(info_names, info, strict=True)}
                 if info_names else {})
    return {
        "episodes": int(arrays["episodes"]),
        "episodes_total": int(arrays["episodes_total"]),
        "episode_return_mean": float(arrays["recent_return_mean"]),
        "episode_length_mean": float(arrays["recent_length_mean"]),
        "unstable_episodes": int(arrays["unstable_episodes"]),
        "env_steps": int(arrays["env_steps"]),
        "env_steps_per_s": n / collect_s if collect_s > 0 else float("nan"),
        "policy_version": int(arrays["policy_version"]),
        "seq": int(arrays["seq"]),
        "wait_s": float(wait_s),
        "step_info": step_info,
    }


def as_tensors(arrays: dict[str, np.ndarray], wait_s: float = 0.0,
               info_names: tuple[str, ...] = ()) -> dict[str, Any]:
    """Zero-copy torch tensors of the batch fields (not the scalars) plus ``"stats"``.

    ``info_names`` (the spec's) name the entries of ``stats["step_info"]``.

    The tensors share memory with ``arrays``: if these are a ring slot, use them only while the
    slot is held (the DataModule takes care of that).
    """
    out: dict[str, Any] = {name: torch.from_numpy(arr) for name, arr in arrays.items()
                           if arr.ndim and name not in _SCALARS and name != "info_mean"}
    out["stats"] = stats_of(arrays, wait_s, info_names)
    return out
