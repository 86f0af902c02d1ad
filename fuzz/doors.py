"""The public doors the fuzz campaign knocks on, one generated input per call.

A door is ``setup() -> state`` (built once per campaign process) and ``knock(state, data)``,
which draws one input with hypothesis' ``data`` and runs it. It returns normally for a correct
result (checked here: shapes, finiteness, round trips) or raises one of the door's
``refusals`` (the documented exception, whose message must name the argument). Anything else
is a wrong result: an undocumented exception, a silent NaN, a value that does not round-trip.
Crashes and hangs are the campaign's to see (``fuzz/campaign.py`` runs each door in its own
process under a time box).
"""

from __future__ import annotations

import copy
import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]


class WrongResult(AssertionError):
    """A door returned something it must not (NaN, a wrong shape, a value that changed)."""


def expect(ok: bool, what: str) -> None:
    if not ok:
        raise WrongResult(what)


@dataclass(frozen=True)
class Door:
    name: str
    setup: Callable[[], Any]
    knock: Callable[[Any, Any], None]
    refusals: tuple[type[BaseException], ...]
    names: tuple[str, ...] = ()  # one of these must appear in a refusal's message


# -- values that break things ------------------------------------------------------------------
WILD_FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                        st.sampled_from([0.0, -0.0, 1e308, -1e308, 5e-324, math.nan, math.inf]))
WILD_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), WILD_FLOATS,
                         st.text(max_size=6), st.lists(st.integers(-3, 3), max_size=3))


def mostly(data: Any, valid: st.SearchStrategy, wild: st.SearchStrategy = WILD_SCALARS) -> Any:
    """A valid value three times in four, else a wild one: enough good inputs get through
    that the checks behind the first refusal are reached too."""
    return data.draw(valid if data.draw(st.integers(0, 3)) else wild)


def _array(data: Any, shape: tuple[int, ...]) -> np.ndarray:
    """An array of ``shape`` (or another one) in any dtype, with wild values."""
    if data.draw(st.integers(0, 9)) == 0:
        shape = tuple(data.draw(st.lists(st.integers(0, 4), max_size=3)))
    dtype = data.draw(st.sampled_from(["float64", "float32", "float16", "int64", "bool",
                                       "complex128", "object"]))
    n = int(np.prod(shape)) if shape else 1
    values = data.draw(st.lists(WILD_FLOATS if data.draw(st.booleans()) else
                                st.floats(-2.0, 2.0), min_size=n, max_size=n))
    with np.errstate(all="ignore"):
        arr = np.array(values, dtype=np.float64).reshape(shape)
        return arr.astype(dtype) if dtype != "object" else arr.astype(object)


# -- TaskVectorEnv ------------------------------------------------------------------------------
def _env():
    from lightning_unilab import TaskVectorEnv

    return TaskVectorEnv("InvertedPendulum-v5", 3, 1, seed=0)


def knock_step(env: Any, data: Any) -> None:
    actions = _array(data, (env.num_envs, env.spec.action_size))
    obs, reward, terminated, truncated, info = env.step(actions)
    expect(obs.shape == (env.num_envs, env.spec.obs_size), f"obs shape {obs.shape}")
    expect(bool(np.isfinite(obs).all() and np.isfinite(reward).all()),
           f"non-finite obs or reward after actions {actions!r}")


def knock_reset(env: Any, data: Any) -> None:
    seed = mostly(data, st.one_of(st.none(), st.integers(0, 2**63)),
                  st.one_of(st.integers(-2**70, 2**70), st.lists(st.integers(-5, 2**65),
                                                                 max_size=4), WILD_SCALARS))
    ids = mostly(data, st.one_of(st.none(), st.lists(st.integers(0, 2), min_size=1, max_size=3,
                                                     unique=True)),
                 st.one_of(st.lists(st.integers(-4, 6), max_size=4),
                           st.lists(st.booleans(), min_size=3, max_size=3)))
    ids = None if ids is None else np.asarray(ids)
    obs, _ = env.reset(seed=seed, ids=ids)
    expect(bool(np.isfinite(obs).all()), "non-finite obs after reset")


def knock_make(_: Any, data: Any) -> None:
    from lightning_unilab import TaskVectorEnv

    task = mostly(data, st.just("InvertedPendulum-v5"),
                  st.sampled_from(["no-such-task", "", "Ant-v6", 3]))
    kwargs: dict[str, Any] = {}
    if data.draw(st.booleans()):
        kwargs["num_threads"] = mostly(data, st.integers(1, 3), st.integers(-3, 2**40))
    if data.draw(st.booleans()):
        kwargs["seed"] = mostly(data, st.integers(0, 2**63))
    if data.draw(st.booleans()):
        kwargs["params"] = {mostly(data, st.just("reset_noise_scale"),
                                   st.sampled_from(["nope", ""])):
                            mostly(data, st.floats(0.0, 0.5))}
    if data.draw(st.booleans()):
        kwargs["nonfinite"] = mostly(data, st.sampled_from(["raise", "truncate"]),
                                     st.sampled_from(["ignore", 3, None]))
    num_envs = mostly(data, st.integers(1, 5), st.one_of(st.integers(-2, 2**40), WILD_SCALARS))
    env = TaskVectorEnv(task, num_envs, **kwargs)
    try:
        expect(env.num_envs == num_envs and isinstance(num_envs, int) and num_envs > 0,
               f"built with num_envs={num_envs!r}")
        obs, _ = env.reset()
        expect(bool(np.isfinite(obs).all()), "non-finite obs after the first reset")
    finally:
        env.close()


# -- the ring -----------------------------------------------------------------------------------
def knock_ring(_: Any, data: Any) -> None:
    from lightning_unilab.runtime.ring import Ring
    from lightning_unilab.runtime.rollout import RolloutSpec

    wild = st.one_of(st.integers(-2, 0), st.integers(2**31, 2**62), WILD_SCALARS)
    sizes = {k: data.draw(st.integers(1, 40)) if data.draw(st.integers(0, 9)) else
             data.draw(wild)
             for k in ("num_envs", "horizon", "obs_size", "critic_size", "action_size")}
    spec = RolloutSpec(**sizes)
    slots = mostly(data, st.integers(2, 5), st.integers(-1, 1))
    policy = mostly(data, st.sampled_from(["block", "overwrite_oldest"]),
                    st.sampled_from(["drop", 1, None]))
    with Ring.create(spec, num_slots=slots, writer_policy=policy) as ring:
        arrays = ring.arrays(0)
        expect(arrays["obs"].shape == (spec.horizon, spec.num_envs, spec.obs_size),
               f"slot obs shape {arrays['obs'].shape} for {spec}")


# -- omni-plan workloads ----------------------------------------------------------------------
def _workload():
    import yaml

    return yaml.safe_load((ROOT / "recipes/omni_plan/workload_a_vit1b_llama12b.yaml").read_text())


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


def knock_workload(base: dict, data: Any) -> None:
    from lightning_omni.workload_yaml import parse_workload

    doc = copy.deepcopy(base)
    for _ in range(data.draw(st.integers(1, 3))):
        paths = _paths(doc)
        if not paths:
            break
        path = data.draw(st.sampled_from(paths))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        if data.draw(st.integers(0, 4)) == 0 and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = data.draw(st.one_of(WILD_SCALARS, st.dictionaries(
                st.text(max_size=4), st.integers(-2, 2), max_size=2)))
    parse_workload(doc, ROOT / "recipes" / "omni_plan")


# -- checkpoints ------------------------------------------------------------------------------
def _checkpoint() -> tuple[bytes, str, dict]:
    import torch

    from lightning_omnilab import safe_load

    state = {"state_dict": {"w": torch.arange(6.0).view(2, 3), "b": torch.ones(3)},
             "epoch": 1, "global_step": 7, "hyper_parameters": {"lr": 1e-3, "name": "x"}}
    with tempfile.TemporaryDirectory() as tmp:  # as the project writes them: with a digest
        path = Path(tmp) / "c.ckpt"
        safe_load.save(state, path)
        return path.read_bytes(), Path(safe_load.digest_path(path)).read_text(), state


def knock_checkpoint(good: tuple[bytes, str, dict], data: Any) -> None:
    import torch

    from lightning_omnilab import safe_load

    raw, digest, state = good
    blob = bytearray(raw)
    kind = data.draw(st.sampled_from(["truncate", "flip", "splice"]))
    if kind == "truncate":
        blob = blob[:data.draw(st.integers(0, len(blob) - 1))]
    elif kind == "flip":
        for _ in range(data.draw(st.integers(1, 8))):
            i = data.draw(st.integers(0, len(blob) - 1))
            blob[i] ^= 1 << data.draw(st.integers(0, 7))
    else:
        i = data.draw(st.integers(0, len(blob)))
        blob[i:i] = data.draw(st.binary(min_size=1, max_size=16))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.ckpt"
        path.write_bytes(bytes(blob))
        Path(safe_load.digest_path(path)).write_text(digest)
        loaded = safe_load.load(path)
    expect(isinstance(loaded, dict) and set(loaded) == set(state), "keys changed")
    for k, v in state["state_dict"].items():
        expect(torch.equal(loaded["state_dict"][k], v), f"tensor {k} changed silently")
    expect({k: v for k, v in loaded.items() if k != "state_dict"} ==
           {k: v for k, v in state.items() if k != "state_dict"}, "values changed silently")


def _doors() -> dict[str, Door]:
    from lightning_omni.workload_yaml import WorkloadError
    from lightning_omnilab.safe_load import CorruptCheckpointError, UnsafeCheckpointError

    env_names = ("actions", "seed", "ids", "initial_state")
    return {d.name: d for d in (
        Door("TaskVectorEnv.step", _env, knock_step, (ValueError, TypeError), env_names),
        # an env id out of range is an IndexError (as numpy's), naming ``ids``
        Door("TaskVectorEnv.reset", _env, knock_reset, (ValueError, TypeError, IndexError),
             env_names),
        Door("TaskVectorEnv(...)", lambda: None, knock_make, (ValueError, TypeError, KeyError),
             ("task", "num_envs", "num_threads", "seed", "params", "nonfinite")),
        Door("Ring.create", lambda: None, knock_ring, (ValueError, TypeError),
             ("num_envs", "horizon", "obs_size", "critic_size", "action_size", "num_slots",
              "writer_policy", "shared memory")),
        Door("omni-plan workload", _workload, knock_workload, (WorkloadError,), ()),
        Door("checkpoint file", _checkpoint, knock_checkpoint,
             (UnsafeCheckpointError, CorruptCheckpointError), ("c.ckpt",)),
    )}


DOORS = _doors  # the registry fuzz/campaign.py loads
