"""The public entry points the fuzz campaign runs, one generated input per call.

An entry point (a ``Door``, the campaign's first name for it) is ``setup() -> state`` (built
once per campaign process) and ``knock(state, data)``, which draws one input with hypothesis'
``data`` and runs it. It returns normally for a correct result (checked here: shapes,
finiteness, round trips) or raises one of its ``refusals`` (the documented exception, whose
message must name the argument). Anything else is a wrong result: an undocumented exception, a
silent NaN, a value that does not round-trip. Crashes and hangs are the campaign's to see
(``fuzz/campaign.py`` runs each entry point in its own process under a time box).
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
    """An entry point returned something it must not (NaN, a wrong shape, a value that changed)."""


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


# -- the gymnasium adapter ---------------------------------------------------------------------
def knock_gym(_: Any, data: Any) -> None:
    from lightning_unilab.envs.gym import PoolVectorEnv

    kwargs: dict[str, Any] = {}
    for name, valid, wild in (
            ("autoreset", st.sampled_from(["next_step", "same_step", "disabled"]),
             st.sampled_from(["NEXT_STEP", "later", 1, None])),
            ("max_episode_steps", st.integers(1, 50), st.integers(-3, 0)),
            ("copy", st.booleans(), WILD_SCALARS),
            ("record_episode_statistics", st.booleans(), WILD_SCALARS),
            ("render_envs", st.lists(st.integers(0, 2), min_size=1, max_size=2, unique=True),
             st.lists(st.integers(-4, 6), max_size=3)),
            ("render_size", st.tuples(st.integers(1, 64), st.integers(1, 64)),
             st.tuples(st.integers(-2, 0), WILD_SCALARS))):
        if data.draw(st.booleans()):
            kwargs[name] = mostly(data, valid, wild)
    num_envs = mostly(data, st.integers(1, 3), st.integers(-2, 0))
    env = PoolVectorEnv("InvertedPendulum-v5", num_envs, 1, **kwargs)
    try:
        seed = mostly(data, st.one_of(st.none(), st.integers(0, 2**32)),
                      st.one_of(st.integers(-5, -1), st.lists(st.integers(-1, 3), max_size=4)))
        options = {}
        if data.draw(st.booleans()):
            options["reset_mask"] = mostly(data, st.lists(st.booleans(), min_size=num_envs,
                                                          max_size=num_envs).map(np.asarray),
                                           st.lists(st.integers(0, 2), max_size=4))
        obs, info = env.reset(seed=seed, options=options)
        expect(obs.shape == env.observation_space.shape and bool(np.isfinite(obs).all()),
               f"reset obs {obs.shape}, finite {np.isfinite(obs).all()}")
        for _ in range(data.draw(st.integers(1, 3))):
            actions = (np.asarray(data.draw(st.lists(st.floats(-1.0, 1.0), min_size=num_envs,
                                                     max_size=num_envs))).reshape(-1, 1)
                       if data.draw(st.integers(0, 3)) else _array(data, env.action_space.shape))
            obs, reward, terminated, truncated, info = env.step(actions)
            expect(obs.shape == env.observation_space.shape and reward.shape == (num_envs,),
                   f"step shapes {obs.shape}, {reward.shape}")
            expect(bool(np.isfinite(obs).all() and np.isfinite(reward).all()),
                   f"non-finite obs or reward after actions {actions!r}")
            expect(all(info[f"_{k}"].shape == (num_envs,) for k in info if not k.startswith("_")
                       and f"_{k}" in info), "an info mask of the wrong shape")
        for name in ("copy", "record_episode_statistics"):
            expect(isinstance(kwargs.get(name, True), bool),
                   f"{name}={kwargs.get(name)!r} accepted")
        size = kwargs.get("render_size", (1, 1))
        expect(all(isinstance(v, int) and v > 0 for v in size), f"render_size={size!r} accepted")
    finally:
        env.close()


# -- RolloutDataModule and APPOModule configs --------------------------------------------------
def knock_data_module(_: Any, data: Any) -> None:
    from lightning_unilab.runtime.data import RolloutDataModule

    kwargs: dict[str, Any] = {}
    for name, valid, wild in (
            ("task", st.just("InvertedPendulum-v5"), st.sampled_from(["no-such-task", "", 3])),
            ("num_envs", st.integers(1, 16), st.one_of(st.integers(-2, 0), WILD_SCALARS)),
            ("horizon", st.integers(1, 16), st.one_of(st.integers(-2, 0), WILD_SCALARS)),
            ("num_slots", st.integers(2, 5), st.integers(-1, 1)),
            ("writer_policy", st.sampled_from(["block", "overwrite_oldest"]),
             st.sampled_from(["drop", 1, None])),
            ("mode", st.sampled_from(["auto", "async", "sync"]),
             st.sampled_from(["lockstep", 0, None])),
            ("collector_threads", st.one_of(st.none(), st.just(1)),
             st.one_of(st.integers(-1, 0), st.integers(2**10, 2**40))),
            ("seed", st.integers(0, 2**32), st.integers(-2**70, -1)),
            ("zero_copy", st.booleans(), WILD_SCALARS),
            ("read_newest", st.booleans(), WILD_SCALARS),
            ("pin_ring", st.booleans(), WILD_SCALARS),
            ("inline", st.sampled_from([None, False, True]), WILD_SCALARS),
            ("start_timeout", st.floats(1.0, 600.0), WILD_SCALARS),
            ("rollout_timeout", st.one_of(st.none(), st.floats(1.0, 600.0)), WILD_SCALARS),
            ("task_kwargs", st.one_of(st.none(), st.just({"params": {"reset_noise_scale": 0.1}})),
             st.sampled_from([{"params": {"nope": 1.0}}, {"seed": 3}, {"num_threads": 2}]))):
        if data.draw(st.booleans()):
            kwargs[name] = mostly(data, valid, wild)
    dm = RolloutDataModule(**kwargs)
    spec = dm.rollout_spec  # what setup() checks before a process starts
    for name in ("num_envs", "horizon"):
        want = kwargs.get(name, 64 if name == "num_envs" else 32)
        expect(getattr(spec, name) == want and isinstance(want, int),
               f"{name}={want!r} gave {getattr(spec, name)}")
    expect(dm.env_spec.obs_size == 4 and dm.env_spec.action_size == 1, f"sizes {dm.env_spec}")
    for name in ("zero_copy", "read_newest", "pin_ring"):
        expect(isinstance(kwargs.get(name, True), bool), f"{name}={kwargs.get(name)!r} accepted")


APPO_ARGS = {
    "gamma": (st.floats(0.0, 1.0), st.floats(1.0001, 10.0)),
    "gae_lambda": (st.floats(0.0, 1.0), st.floats(-1.0, -0.001)),
    "clip_ratio": (st.floats(0.01, 1.0), st.floats(-1.0, 0.0)),
    "ratio_form": (st.sampled_from(["decoupled", "behaviour", "impact"]),
                   st.sampled_from(["plain", 1])),
    "lr": (st.floats(1e-6, 1e-2), st.floats(-1.0, 0.0)),
    "epochs": (st.integers(1, 3), st.integers(-2, 0)),
    "minibatches": (st.integers(1, 3), st.integers(-2, 0)),
    "max_grad_norm": (st.one_of(st.none(), st.floats(0.1, 10.0)), st.floats(-1.0, 0.0)),
    "max_policy_lag": (st.one_of(st.none(), st.integers(0, 4)), st.integers(-3, -1)),
    "value_clip": (st.one_of(st.none(), st.floats(0.01, 1.0)), st.floats(-1.0, 0.0)),
    "entropy_coef": (st.floats(0.0, 0.1), st.floats(-1.0, -1e-9)),
    "target_tau": (st.floats(0.01, 1.0), st.floats(1.0001, 2.0)),
    "activation": (st.sampled_from(["elu", "relu", "tanh"]), st.sampled_from(["gelu?", 1])),
    "actor_hidden": (st.lists(st.integers(1, 8), min_size=1, max_size=2),
                     st.lists(st.integers(-2, 0), min_size=1, max_size=2)),
    "obs_size": (st.integers(1, 8), st.integers(-2, 0)),
}


def knock_appo(_: Any, data: Any) -> None:
    import torch

    from lightning_unilab.learner.appo import APPOModule

    kwargs = {name: mostly(data, valid, st.one_of(wild, WILD_SCALARS))
              for name, (valid, wild) in APPO_ARGS.items() if data.draw(st.booleans())}
    kwargs.setdefault("obs_size", 3)
    module = APPOModule(critic_hidden=(4,), action_size=2, critic_size=3, **kwargs)
    module.setup("fit")  # builds the ActorCritic from the sizes
    obs = torch.zeros(2, kwargs["obs_size"])
    actions = module.policy.act(obs)[0]
    expect(actions.shape == (2, 2) and bool(torch.isfinite(actions).all()),
           f"actions {tuple(actions.shape)} from {kwargs}")


# -- OmniSpec and its batches -----------------------------------------------------------------
def _omni_spec():
    import torch

    from lightning_omni.examples.multimodal_data import CaptionDataset, collate
    from lightning_omni.examples.multimodal_model import MultimodalCaptioner

    torch.manual_seed(0)
    model = MultimodalCaptioner(hidden=16, layers=2, heads=2, encoder_dim=8, encoder_heads=2,
                                encoder_layers=1)
    data = CaptionDataset(4, seed=0)
    return model.configure_omni(), collate([data[i] for i in range(4)])


def _mutate(batch: dict, data: Any) -> None:
    """One change to a batch: a key gone, a wild value, another dtype or shape, lengths or
    placeholder tokens that disagree, NaN inputs."""
    import torch

    key = data.draw(st.sampled_from(sorted(batch)))
    x = batch[key]
    kind = data.draw(st.sampled_from(["delete", "wild", "dtype", "shape", "value", "nan"]
                                     if isinstance(x, torch.Tensor) else ["delete", "wild"]))
    if kind == "delete":
        del batch[key]
    elif kind == "wild":
        batch[key] = data.draw(WILD_SCALARS)
    elif kind == "dtype":
        batch[key] = x.to(data.draw(st.sampled_from([torch.float16, torch.float64, torch.int32,
                                                      torch.int64, torch.bool])))
    elif kind == "shape":
        if data.draw(st.booleans()) and x.dim() > 1:
            batch[key] = x[..., : data.draw(st.integers(0, x.shape[-1]))]
        elif data.draw(st.booleans()):
            batch[key] = x[: data.draw(st.integers(0, x.shape[0]))]
        else:
            batch[key] = x.unsqueeze(data.draw(st.integers(0, x.dim())))
    elif kind == "value" and x.numel():
        flat = x.clone().reshape(-1)
        i = data.draw(st.integers(0, flat.numel() - 1))
        flat[i] = data.draw(st.integers(-3, 600)) if not flat.is_floating_point() else \
            data.draw(st.floats(-1e6, 1e6))
        batch[key] = flat.reshape(x.shape)
    elif kind == "nan" and x.is_floating_point() and x.numel():
        flat = x.clone().reshape(-1)
        flat[data.draw(st.integers(0, flat.numel() - 1))] = data.draw(
            st.sampled_from([math.nan, math.inf, -math.inf]))
        batch[key] = flat.reshape(x.shape)


def knock_omni_batch(good: tuple[Any, dict], data: Any) -> None:
    import torch

    spec, base = good
    batch = {k: v.clone() for k, v in base.items()}
    for _ in range(data.draw(st.integers(0, 3))):
        _mutate(batch, data)
    spec.check_batch(batch)
    # accepted: the rules check_batch promises hold; NaN or inf let through is a silent NaN
    for key, x in batch.items():
        expect(not (isinstance(x, torch.Tensor) and x.is_floating_point())
               or bool(torch.isfinite(x).all()), f"NaN or inf in batch[{key!r}] accepted")
    tokens = batch[spec.tokens]
    for m in spec.modalities:
        lengths, x = batch[m.lengths], batch[m.inputs]
        expect(bool(((lengths >= 0) & (lengths <= x.shape[1])).all()),
               f"{m.lengths} outside the padded rows accepted: {lengths.tolist()}")
        expect(torch.equal((tokens == m.token_id).sum(1), lengths.to(torch.long)),
               f"{m.name} placeholders unequal to {m.lengths} accepted")
    probe = spec.check_shapes(batch)
    expect(probe.hidden > 0, f"probe {probe}")


# -- the RL learner's rollout slots ---------------------------------------------------------------
ROLLOUT_FLOATS = ("obs", "critic_obs", "actions", "behaviour_logp", "behaviour_mean",
                  "behaviour_log_std", "rewards", "final_critic_obs", "last_critic_obs")


def _appo_slot():
    """A slot of 4 pendulum envs x 4 steps collected by a small policy, and a Fabric that gives
    APPOModule its optimizer without a Trainer (one update per input)."""
    import torch
    from lightning.fabric import Fabric

    from lightning_unilab import TaskVectorEnv
    from lightning_unilab.learner.policy import ActorCritic
    from lightning_unilab.runtime.rollout import RolloutSpec, RolloutState, as_tensors, collect

    torch.manual_seed(0)
    policy = ActorCritic(4, 4, 1, actor_hidden=(8,), critic_hidden=(8,))
    env = TaskVectorEnv("InvertedPendulum-v5", 4, num_threads=1, seed=0)
    spec = RolloutSpec.from_env(env, 4)
    arrays = spec.allocate()
    collect(env, policy, arrays, RolloutState.start(env, seed=0))
    env.close()
    return policy, as_tensors(arrays), Fabric(accelerator="cpu", devices=1)


def knock_appo_batch(good: tuple[Any, dict, Any], data: Any) -> None:
    """One APPO update (``training_step``) on a slot with up to 3 values replaced at drawn
    places, by NaN, inf or a finite value. Refused: the learner must be as before (weights,
    normalizer statistics, version); accepted: every value it holds must be finite."""
    import torch

    from lightning_unilab.learner.appo import APPOModule

    policy, base, fabric = good
    batch = dict(base)
    for _ in range(data.draw(st.integers(0, 3))):
        key = data.draw(st.sampled_from(ROLLOUT_FLOATS))
        flat = batch[key].clone().reshape(-1)
        flat[data.draw(st.integers(0, flat.numel() - 1))] = data.draw(
            st.one_of(st.sampled_from([math.nan, math.inf, -math.inf]), st.floats(-5.0, 5.0)))
        batch[key] = flat.reshape(base[key].shape)
    module = APPOModule(policy=copy.deepcopy(policy), epochs=1, minibatches=2)
    module.setup("fit")
    fabric.setup(module, module.configure_optimizers())
    before = copy.deepcopy(module.policy.state_dict())
    try:
        module.training_step(batch, 0)
    except ValueError:
        after = module.policy.state_dict()
        expect(module.policy_version == 0 and all(torch.equal(after[k], v)
                                                  for k, v in before.items()),
               "a refused slot changed the learner")
        raise
    expect(module.policy_version == 1, f"version {module.policy_version} after one update")
    for name, value in module.policy.state_dict().items():
        expect(not value.is_floating_point() or bool(torch.isfinite(value).all()),
               f"NaN or inf reached the learner's {name}")


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
    from lightning_omni.spec import OmniSpecError
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
        Door("PoolVectorEnv", lambda: None, knock_gym, (ValueError, TypeError, IndexError),
             ("autoreset", "max_episode_steps", "copy", "record_episode_statistics",
              "render_envs", "render_size", "num_envs", "seed", "reset_mask", "actions")),
        Door("RolloutDataModule(...)", lambda: None, knock_data_module,
             (ValueError, TypeError, KeyError),
             ("task", "num_envs", "horizon", "num_slots", "writer_policy", "mode",
              "collector threads", "seed", "zero_copy", "read_newest", "pin_ring", "inline",
              "start_timeout", "rollout_timeout", "task_kwargs", "params", "shared memory")),
        Door("APPOModule(...)", lambda: None, knock_appo, (ValueError, TypeError),
             tuple(APPO_ARGS)),
        Door("OmniSpec batch", _omni_spec, knock_omni_batch, (OmniSpecError,),
             ("batch", "embedding", "modalities", "blocks", "head", "loss")),
        Door("APPO batch", _appo_slot, knock_appo_batch, (ValueError,), ("batch",)),
    )}


DOORS = _doors  # the registry fuzz/campaign.py loads
