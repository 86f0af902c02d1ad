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


def tmp_dir() -> str:
    """This process's scratch directory, in memory where /dev/shm exists (removed at exit)."""
    global _TMP
    if _TMP is None:
        _TMP = tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None)
    return _TMP.name


_TMP: Any = None


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

    import lightning_omni.workload_yaml  # noqa: F401  (its import is no input's time)

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


def mutate_doc(base: dict, data: Any, changes: tuple[int, int] = (1, 3),
               under: tuple = ()) -> tuple[dict, list[tuple]]:
    """A deep copy of a YAML document with ``changes`` keys (below ``under``) deleted or
    replaced by wild values; returns it and the paths changed."""
    doc, changed = copy.deepcopy(base), []
    for _ in range(data.draw(st.integers(*changes))):
        paths = [p for p in _paths(doc) if p[:len(under)] == under and len(p) > len(under)]
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
        changed.append(path)
    return doc, changed


def knock_workload(base: dict, data: Any) -> None:
    from lightning_omni.workload_yaml import parse_workload

    parse_workload(mutate_doc(base, data)[0], ROOT / "recipes" / "omni_plan")


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


# -- OmniStrategy's own arguments ----------------------------------------------------------------
def _omni_args() -> dict[str, tuple[st.SearchStrategy, st.SearchStrategy]]:
    """(valid, wild) values of every OmniStrategy keyword."""
    from datetime import timedelta

    flag = (st.booleans(), WILD_SCALARS)
    ints = st.lists(st.integers(0, 3), min_size=1, max_size=8)
    return {
        "pipeline_parallel": (st.integers(1, 4), st.integers(-2, 0)),
        "data_parallel": (st.one_of(st.none(), st.integers(1, 4)), st.integers(-2, 0)),
        "tensor_parallel": (st.integers(1, 4), st.integers(-2, 0)),
        "encoder_tensor_parallel": (st.one_of(st.none(), st.integers(1, 4)),
                                    st.integers(-2, 0)),
        "virtual_pipeline_parallel": (st.integers(1, 3), st.integers(-2, 0)),
        "num_microbatches": (st.one_of(st.none(), st.integers(1, 16)), st.integers(-2, 0)),
        "schedule": (st.sampled_from(["encoder_first_stage", "uniform_insertion"]),
                     st.sampled_from(["1f1b?", ""])),
        "stage_blocks": (st.one_of(st.none(), st.lists(st.integers(1, 4), min_size=1,
                                                        max_size=4)),
                         st.lists(st.integers(-2, 0), min_size=1, max_size=3)),
        "timeout": (st.timedeltas(timedelta(seconds=1), timedelta(hours=3)),
                    st.one_of(st.timedeltas(max_value=timedelta(0)), st.integers(-5, 600))),
        "lssp": flag, "reorder": flag, "recompute": flag, "encoder_recompute": flag,
        "meta_init": flag, "check_finite": flag,
        "locality_groups": (st.one_of(st.none(), ints), st.lists(st.integers(-3, -1),
                                                                  min_size=1, max_size=3)),
        "lssp_max_rows": (st.one_of(st.none(), st.floats(0.5, 1e5)), st.floats(-1.0, 0.0)),
        "encoder_cost": (st.tuples(st.floats(0.0, 2.0), st.floats(0.01, 2.0)),
                         st.one_of(st.tuples(WILD_FLOATS, WILD_FLOATS),
                                   st.lists(st.floats(0.0, 1.0), max_size=3))),
        "ulysses_backend": (st.sampled_from(["auto", "deepspeed", "torch"]),
                            st.sampled_from(["nccl", ""])),
        "zero_stage": (st.sampled_from([0, 1]), st.sampled_from([2, 3, -1, True])),
    }


def _omni_setup() -> dict:
    """The keywords' values, after one OmniStrategy built with its defaults: the imports its
    first construction makes are no input's time."""
    from lightning_omni import OmniStrategy

    OmniStrategy()
    return _omni_args()


def knock_omni_strategy(args: dict, data: Any) -> None:
    """OmniStrategy(...) with each keyword left out, valid or wild, then ``for_world`` for a
    drawn world: accepted, the layout holds the values given and fills the world exactly."""
    from datetime import timedelta

    from lightning_omni import OmniStrategy

    kwargs = {name: mostly(data, valid, st.one_of(wild, WILD_SCALARS))
              for name, (valid, wild) in args.items() if data.draw(st.booleans())}
    strategy = OmniStrategy(**kwargs)
    for name, value in kwargs.items():
        held = strategy.omni_timeout if name == "timeout" else getattr(strategy, name)
        if name == "encoder_tensor_parallel" and value is None:
            value = strategy.tensor_parallel
        if name == "num_microbatches" and value is None:
            value = 2 * strategy.pipeline_parallel
        if name == "encoder_cost":
            value = tuple(float(v) for v in value)
        expect(held == value and type(held) is not bool or held is value,
               f"{name}={value!r} held as {held!r}")
    expect(isinstance(strategy.omni_timeout, timedelta)
           and strategy.omni_timeout > timedelta(0), f"timeout {strategy.omni_timeout!r}")
    world = data.draw(st.integers(1, 16))
    dims = strategy.dims.for_world(world, data.draw(st.integers(1, world)))
    expect(dims.pp * dims.dp * dims.tp == world, f"{dims} for a world of {world}")


# -- the weight board -----------------------------------------------------------------------------
BOARD_DTYPES = ("float32", "float64", "float16", "int64", "int32", "bool", "bfloat16",
                "complex64", "uint8")


def _state(data: Any) -> dict:
    """A state dict of 1 to 4 tensors of drawn shapes (0-size included) and dtypes."""
    import torch

    state = {}
    for i in range(data.draw(st.integers(1, 4))):
        shape = tuple(data.draw(st.lists(st.integers(0, 5), max_size=3)))
        dtype = getattr(torch, mostly(data, st.sampled_from(BOARD_DTYPES[:6]),
                                      st.sampled_from(BOARD_DTYPES)))
        state[f"w{i}"] = (torch.randn(shape) * 3).to(dtype)
    return state


def _changed_state(state: dict, data: Any) -> dict:
    """``state`` with up to 2 changes: a key gone or added, another shape or dtype, NaN."""
    import torch

    new = {k: v.clone() for k, v in state.items()}
    for _ in range(data.draw(st.integers(0, 2))):
        key = data.draw(st.sampled_from(sorted(new) or ["w0"]))
        kind = data.draw(st.sampled_from(["delete", "add", "shape", "dtype", "nan", "value"]))
        if kind == "delete":
            new.pop(key, None)
        elif kind == "add":
            new[f"extra_{key}"] = torch.zeros(2)
        elif key not in new:
            continue
        elif kind == "shape":
            new[key] = torch.zeros(tuple(data.draw(st.lists(st.integers(0, 5), max_size=3))))
        elif kind == "dtype":
            new[key] = new[key].to(getattr(torch, data.draw(st.sampled_from(BOARD_DTYPES))))
        elif new[key].numel():
            flat = new[key].reshape(-1).clone()
            flat[data.draw(st.integers(0, flat.numel() - 1))] = (
                math.nan if kind == "nan" else data.draw(st.floats(-9.0, 9.0)))
            new[key] = flat.reshape(new[key].shape)
    return new


def knock_board(_: Any, data: Any) -> None:
    """A board created for a drawn state dict and version, a second state published (changed
    keys, shapes, dtypes, values), then read by an attached board into a fresh copy: accepted,
    the reader holds exactly what was published, as the version published."""
    import torch

    from lightning_unilab.runtime.weights import WeightBoard

    state = _state(data)
    version = mostly(data, st.integers(0, 2**40), st.one_of(st.integers(-2**70, -1),
                                                             st.integers(2**64, 2**70)))
    board = WeightBoard.create(_as_module(state), version)
    try:
        reader = WeightBoard.attach(board.handle)
        published = _changed_state(state, data)
        new_version = mostly(data, st.integers(0, 2**40), st.integers(-2**70, -1))
        board.publish(published, new_version)
        into = {k: torch.full_like(v, 7) for k, v in state.items()}
        got = reader.read_into(into)
        expect(got == new_version, f"read version {got}, published {new_version}")
        for key, value in into.items():
            sent = published[key]
            expect(sent.shape == value.shape, f"{key}: {tuple(sent.shape)} published into "
                   f"{tuple(value.shape)} accepted")
            expect(torch.equal(value, sent.to(value.dtype)) or
                   bool(torch.isnan(sent).any()) and
                   torch.equal(value.isnan(), sent.to(value.dtype).isnan()),
                   f"{key}: read {value} after publishing {sent}")
        reader.close()
    finally:
        board.close()
        board.unlink()


def _as_module(state: dict) -> Any:
    """A module whose state dict is ``state`` (buffers: any dtype)."""
    import torch

    module = torch.nn.Module()
    for key, value in state.items():
        module.register_buffer(key, value)
    return module


# -- motion clips (BeyondMimic's .npz) ------------------------------------------------------------
CLIP_FRAMES = 6  # the first frames of the shipped backflip: the format, at a small cost


def _clip() -> tuple[Any, dict]:
    from lightning_unilab.envs import tasks
    from lightning_unilab.motions import CLIPS

    with np.load(CLIPS / "g1_backflip.npz") as archive:
        arrays = {k: archive[k] if archive[k].ndim < 2 or k.endswith("_names")
                  else archive[k][:CLIP_FRAMES] for k in archive.files}
    return tasks.load_model("g1-motion-tracking"), arrays


def _mutate_clip(arrays: dict, data: Any) -> None:
    """One change to a clip's arrays: a key gone, a wild value, another dtype or shape, a
    non-finite or changed value, quaternions scaled, joint or body names shuffled, repeated or
    unknown."""
    key = data.draw(st.sampled_from(sorted(arrays)))
    x = arrays[key]
    kind = data.draw(st.sampled_from(["delete", "wild", "dtype", "shape", "value", "nan",
                                      "scale", "names"]))
    if kind == "delete":
        del arrays[key]
    elif kind == "wild":
        arrays[key] = np.asarray(data.draw(WILD_SCALARS), dtype=object if
                                 data.draw(st.booleans()) else None)
    elif kind == "dtype" and x.dtype.kind != "U":
        arrays[key] = x.astype(data.draw(st.sampled_from(["float32", "float16", "int64",
                                                          "bool", "complex128", "U3"])))
    elif kind == "shape" and x.ndim:
        arrays[key] = (x[: data.draw(st.integers(0, x.shape[0]))] if data.draw(st.booleans())
                       else x[..., : data.draw(st.integers(0, x.shape[-1]))] if x.ndim > 1
                       else x[None])
    elif kind in ("value", "nan") and x.dtype.kind == "f" and x.size:
        flat = x.copy().reshape(-1)
        flat[data.draw(st.integers(0, flat.size - 1))] = data.draw(
            st.floats(-9.0, 9.0) if kind == "value" else
            st.sampled_from([math.nan, math.inf, -math.inf]))
        arrays[key] = flat.reshape(x.shape)
    elif kind == "scale" and "body_quat_w" in arrays:
        arrays["body_quat_w"] = arrays["body_quat_w"] * data.draw(st.floats(0.0, 2.0))
    elif kind == "names" and x.dtype.kind == "U":
        names = list(x)
        how = data.draw(st.sampled_from(["shuffle", "repeat", "unknown"]))
        if how == "shuffle":
            names = data.draw(st.permutations(names))
        elif how == "repeat" and len(names) > 1:
            names[data.draw(st.integers(1, len(names) - 1))] = names[0]
        else:
            names[data.draw(st.integers(0, len(names) - 1))] = "no_such_part"
        arrays[key] = np.array(names)


def knock_clip(good: tuple[Any, dict], data: Any) -> None:
    """A clip written with up to 3 changes to its arrays (or its file's bytes cut or flipped),
    loaded by ``load_motions``. Accepted: the clip holds what the file holds, joints reordered
    into the model's order by their names, quaternions of unit norm, every value finite."""
    from lightning_unilab.motions import load_motions, model_joint_names

    model, base = good
    arrays = dict(base)
    for _ in range(data.draw(st.integers(0, 3))):
        _mutate_clip(arrays, data)
    path = Path(tmp_dir()) / "clip.npz"  # one file rewritten: no directory per input
    np.savez(path, **arrays)
    if data.draw(st.integers(0, 5)) == 0:
        raw = bytearray(path.read_bytes())
        if data.draw(st.booleans()):
            raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
        else:
            raw[data.draw(st.integers(0, len(raw) - 1))] ^= 1 << data.draw(st.integers(0, 7))
        path.write_bytes(bytes(raw))
        arrays = None  # what was read is no longer known here: finite values and sizes only
    (clip,) = load_motions(str(path) if data.draw(st.booleans()) else [path], model)
    joints = model_joint_names(model)
    expect(clip.joint_names == joints and clip.joint_pos.shape[1] == len(joints),
           f"joints {clip.joint_names}")
    for key in ("joint_pos", "joint_vel", "body_pos_w", "body_quat_w", "body_lin_vel_w",
                "body_ang_vel_w"):
        value = getattr(clip, key)
        expect(value.shape[0] == clip.num_frames >= 2 and bool(np.isfinite(value).all()),
               f"{key}: shape {value.shape}, finite {np.isfinite(value).all()}")
    expect(bool(np.allclose(np.linalg.norm(clip.body_quat_w, axis=-1), 1.0)),
           "quaternions not of unit norm")
    if arrays is None:
        return
    order = ([list(arrays["joint_names"]).index(n) for n in joints] if "joint_names" in arrays
             else list(range(len(joints))))
    for key in ("joint_pos", "joint_vel"):
        expect(bool(np.array_equal(getattr(clip, key),
                                   arrays[key][:, order].astype(np.float64))),
               f"{key}: the clip's columns are not the file's, by joint name")
    expect(clip.fps == float(np.asarray(arrays["fps"]).reshape(())),
           f"fps {clip.fps} from {arrays['fps']!r}")
    expect(bool(np.array_equal(clip.body_pos_w, arrays["body_pos_w"].astype(np.float64))),
           "body_pos_w changed")


# -- a ring reader whose writer died ------------------------------------------------------------
def _ring_model(policy: str, slots: int, plan: list[str]) -> list[int]:
    """The rollouts a reader must get, oldest first, after a writer that followed ``plan``
    (commit, or write part of a slot) and then died: the ring's rules, written again."""
    held: list[int | None] = [None] * slots  # the rollout a slot holds, None: free
    writing: set[int] = set()
    for seq, step in enumerate(plan):
        free = [i for i in range(slots) if held[i] is None and i not in writing]
        if free:
            slot = free[0]
        elif policy == "overwrite_oldest" and any(h is not None for h in held):
            slot = min((h, i) for i, h in enumerate(held) if h is not None)[1]
            held[slot] = None
        else:
            break  # the writer would wait for the reader: it dies waiting
        if step == "commit":
            held[slot] = seq
        else:
            writing.add(slot)
            break
    return sorted(h for h in held if h is not None)


def knock_dead_writer(_: Any, data: Any) -> None:
    """A writer process commits some rollouts, maybe writes part of one more, and is killed
    (SIGKILL); the reader then takes every ready slot and waits once more with the check a
    learner makes of its collector. It must get exactly the committed rollouts, whole and in
    order (never the one cut off), then the error that names the dead writer: no hang."""
    import os
    import signal

    from lightning_unilab.runtime.ring import Ring
    from lightning_unilab.runtime.rollout import RolloutSpec

    spec = RolloutSpec(num_envs=data.draw(st.integers(1, 4)), horizon=data.draw(
        st.integers(1, 4)), obs_size=3, critic_size=2, action_size=1)
    slots = data.draw(st.integers(2, 4))
    policy = data.draw(st.sampled_from(["block", "overwrite_oldest"]))
    plan = data.draw(st.lists(st.sampled_from(["commit", "commit", "part"]), max_size=7))
    fields = data.draw(st.integers(0, 3))  # how much of the cut-off slot was written
    with Ring.create(spec, slots, policy) as ring:
        pid = os.fork()
        if pid == 0:  # the writer: never returns
            try:
                for seq, step in enumerate(plan):
                    slot = ring.acquire_write(timeout=0)
                    if slot is None:
                        break
                    arrays = ring.arrays(slot)
                    for name in sorted(arrays)[: None if step == "commit" else fields]:
                        arrays[name][...] = seq
                    if step != "commit":
                        break
                    ring.commit(slot, seq=seq)
            finally:
                os.kill(os.getpid(), signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        expect(os.WIFSIGNALED(status), f"writer status {status}")

        def alive() -> None:
            raise RuntimeError(f"the writer process {pid} was killed by signal "
                               f"{os.WTERMSIG(status)}")

        got = []
        while True:
            slot = ring.acquire_read(timeout=5.0, alive=alive)
            expect(slot is not None, "the reader timed out instead of naming the dead writer")
            seq = ring.header(slot)["seq"]
            whole = all(bool((a == np.asarray(seq).astype(a.dtype)).all())
                        for a in ring.arrays(slot).values())
            expect(whole, f"slot {slot} (rollout {seq}) read before it was written whole")
            got.append(seq)
            ring.release(slot)
            want = _ring_model(policy, slots, plan)
            expect(got == want[: len(got)], f"read {got}, committed {want} ({plan})")


# -- the train command's configs ----------------------------------------------------------------
class CommandRefusal(ValueError):
    """The train command ended with exit code 2; the message is its last line."""


def _train_cli() -> tuple[Any, dict]:
    """The train command's CLI, its parser built once (as ``python -m lightning_unilab.train``
    builds it), and the pendulum recipe."""
    import contextlib
    import io

    import yaml

    from lightning_unilab.learner.appo import APPOModule
    from lightning_unilab.runtime.data import RolloutDataModule
    from lightning_unilab.train import UniLabCLI

    recipe = ROOT / "recipes/unilab/inverted_pendulum.yaml"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        cli = UniLabCLI(APPOModule, RolloutDataModule, run=False, seed_everything_default=0,
                        args=["--config", str(recipe)], save_config_kwargs={"overwrite": True})
    return cli, yaml.safe_load(recipe.read_text())


def _plain(value: Any) -> Any:
    return [_plain(v) for v in value] if isinstance(value, list | tuple) else value


def knock_train_config(good: tuple[Any, dict], data: Any) -> None:
    """The pendulum recipe with up to 3 keys of ``trainer``, ``model`` or ``data`` deleted or
    made wild, given to the train command as ``--config``; parsed and every class built as the
    command builds them (the learner's threads set), then stopped before ``fit``. Refused: exit
    code 2 and one line naming a flag. Accepted: the model and the data module hold the
    config's values."""
    import contextlib
    import io

    import torch
    import yaml

    from lightning_unilab.train import set_learner_threads

    cli, base = good
    doc, _ = mutate_doc(base, data, (1, 3), (data.draw(st.sampled_from(
        ["model", "data", "data", "trainer"])),))
    path = Path(tmp_dir()) / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            cli.parse_arguments(cli.parser, ["--config", str(path), "--trainer.default_root_dir",
                                             str(Path(tmp_dir()) / "runs")])
            cli.before_instantiate_classes()
            cli.instantiate_classes()
            try:
                set_learner_threads(cli)
            except (ValueError, TypeError) as bad:
                cli.argument_error(bad)
    except SystemExit as end:
        lines = err.getvalue().strip().splitlines()
        expect(end.code == 2 and bool(lines) and lines[-1].startswith("error: "),
               f"exit code {end.code}, {lines[-1:]}")
        raise CommandRefusal(lines[-1]) from None
    finally:
        torch.set_num_threads(1)
    for section, built in (("model", cli.model), ("data", cli.datamodule)):
        for key, value in (doc.get(section) or {}).items():
            held = built.hparams.get(key, "(absent)")
            expect(_plain(held) == _plain(value) or isinstance(value, dict),
                   f"{section}.{key}={value!r} held as {held!r}")


# -- a user's task: its MJCF and its spec -------------------------------------------------------
RAIL_XML = """<mujoco>
  <option timestep="{timestep}"/>
  <worldbody>
    <body name="cart">
      <joint name="x" type="{joint}" axis="1 0 0" damping="{damping}"/>
      <geom type="sphere" size="{size}" mass="{mass}"/>
    </body>{extra}
  </worldbody>
  <actuator>{actuators}</actuator>
</mujoco>
"""


def _rail_xml(data: Any) -> str:
    """A point mass on a rail, its numbers valid or wild, with extra bodies or actuators, or
    its text cut or spliced (XML that does not parse)."""
    number = st.one_of(st.floats(0.01, 2.0), st.sampled_from(["nan", "-1", "inf", "0", "x",
                                                               "1e400", ""]))
    fields = {name: mostly(data, st.floats(0.01, 2.0).map(str), number)
              for name in ("timestep", "damping", "size", "mass")}
    fields["timestep"] = mostly(data, st.sampled_from(["0.002", "0.01"]), number)
    fields["joint"] = mostly(data, st.sampled_from(["slide", "hinge"]),
                             st.sampled_from(["ball", "free", "spring", ""]))
    fields["extra"] = "".join(
        f'<body name="b{i}" pos="0 {i + 1} 0"><joint name="j{i}" type="hinge"/>'
        '<geom type="capsule" size="0.05 0.2" mass="1"/></body>'
        for i in range(data.draw(st.integers(0, 2))))
    joints = ["x"] + [f"j{i}" for i in range(fields["extra"].count("<body"))]
    fields["actuators"] = "".join(
        f'<motor joint="{data.draw(st.sampled_from([*joints, "nope"]))}" ctrlrange="-1 1" '
        'ctrllimited="true"/>' for _ in range(mostly(data, st.just(1), st.integers(0, 3))))
    xml = RAIL_XML.format(**fields)
    if data.draw(st.integers(0, 7)) == 0:
        i = data.draw(st.integers(0, len(xml)))
        xml = xml[:i] + data.draw(st.sampled_from(["", "<", "</body>", "<mujoco>", "\x00"]))
    return xml


class RailTask:
    """A user's task (built on first use: ``NumpyTask`` is imported lazily here): the point
    mass of ``xml`` held at 0, its observation ``qpos, qvel`` cut or padded with zeros to the
    spec's size, each action to the actuator of its index (actuators beyond the actions get 0,
    actions beyond the actuators are dropped). It trusts its spec, as a user's does."""

    def __new__(cls, xml: str, spec: Any) -> Any:
        from lightning_unilab.envs.tasks import NumpyTask, Transition

        class Rail(NumpyTask):
            name = "fuzz-rail"

            def model(self):
                import mujoco

                return mujoco.MjModel.from_xml_string(xml)

            @property
            def spec(self):
                return spec

            def reset(self, pool, ids, rng, memory) -> None:
                pool.qpos[ids] = rng.uniform(ids, -0.1, 0.1, pool.qpos.shape[1])

            def act(self, pool, ids, actions, memory) -> None:
                ctrl = np.zeros((len(ids), pool.ctrl.shape[1]))
                k = min(ctrl.shape[1], actions.shape[1])
                ctrl[:, :k] = actions[:, :k]
                pool.ctrl[ids] = ctrl

            def evaluate(self, pool, ids, actions, memory):
                x = pool.qpos[ids, 0]
                return Transition(reward=-np.abs(x), terminated=np.abs(x) > 5.0)

            def observe(self, pool, ids, memory, obs, critic) -> None:
                state = np.concatenate([pool.qpos[ids], pool.qvel[ids]], axis=1)
                padded = np.zeros((len(ids), obs.shape[1]))
                k = min(obs.shape[1], state.shape[1])
                padded[:, :k] = state[:, :k]
                obs[ids] = padded

        return Rail()


def knock_user_task(_: Any, data: Any) -> None:
    """TaskVectorEnv of a user's task whose ``model()`` compiles generated MJCF and whose
    ``spec`` has drawn sizes (the model's, or others), then a reset and 2 steps. Refused: an
    error naming the task; accepted: observations of the spec's size, finite."""
    from lightning_unilab import TaskVectorEnv
    from lightning_unilab.envs.tasks import TaskSpec

    size = st.integers(1, 6)
    action_size = mostly(data, size, st.integers(-1, 0))
    spec = TaskSpec(obs_size=mostly(data, size, st.integers(-1, 0)), action_size=action_size,
                    frame_skip=mostly(data, st.integers(1, 3), st.integers(-1, 0)),
                    max_episode_steps=mostly(data, st.integers(1, 50), st.integers(-1, 0)),
                    action_low=-np.ones(mostly(data, st.just(max(action_size, 0)), size)),
                    action_high=np.ones(max(action_size, 0)))
    env = TaskVectorEnv(RailTask(_rail_xml(data), spec), 2, 1, seed=0)
    try:
        obs, _ = env.reset()
        for _ in range(2):
            actions = np.asarray(data.draw(st.lists(st.floats(-1.0, 1.0), min_size=2 *
                                                    spec.action_size, max_size=2 *
                                                    spec.action_size))).reshape(2, -1)
            obs = env.step(actions)[0]
        expect(obs.shape == (2, spec.obs_size) and bool(np.isfinite(obs).all()),
               f"obs {obs.shape}, finite {np.isfinite(obs).all()}")
    finally:
        env.close()


def imported(*modules: str) -> Callable[[], None]:
    """A setup that imports ``modules`` only: their import time is no input's."""
    import importlib

    return lambda: [importlib.import_module(m) for m in modules] and None


def _doors() -> dict[str, Door]:
    from lightning_omni.spec import OmniSpecError
    from lightning_omni.workload_yaml import WorkloadError
    from lightning_omnilab.safe_load import CorruptCheckpointError, UnsafeCheckpointError
    from lightning_unilab.envs.tasks.ref import TaskBuildError

    env_names = ("actions", "seed", "ids", "initial_state")
    return {d.name: d for d in (
        Door("TaskVectorEnv.step", _env, knock_step, (ValueError, TypeError), env_names),
        # an env id out of range is an IndexError (as numpy's), naming ``ids``
        Door("TaskVectorEnv.reset", _env, knock_reset, (ValueError, TypeError, IndexError),
             env_names),
        Door("TaskVectorEnv(...)", imported("lightning_unilab"), knock_make,
             (ValueError, TypeError, KeyError),
             ("task", "num_envs", "num_threads", "seed", "params", "nonfinite")),
        Door("Ring.create", imported("lightning_unilab.runtime.ring"), knock_ring,
             (ValueError, TypeError),
             ("num_envs", "horizon", "obs_size", "critic_size", "action_size", "num_slots",
              "writer_policy", "shared memory")),
        Door("omni-plan workload", _workload, knock_workload, (WorkloadError,), ()),
        Door("checkpoint file", _checkpoint, knock_checkpoint,
             (UnsafeCheckpointError, CorruptCheckpointError), ("c.ckpt",)),
        Door("PoolVectorEnv", imported("lightning_unilab.envs.gym"), knock_gym,
             (ValueError, TypeError, IndexError),
             ("autoreset", "max_episode_steps", "copy", "record_episode_statistics",
              "render_envs", "render_size", "num_envs", "seed", "reset_mask", "actions")),
        Door("RolloutDataModule(...)", imported("lightning_unilab.runtime.data"),
             knock_data_module,
             (ValueError, TypeError, KeyError),
             ("task", "num_envs", "horizon", "num_slots", "writer_policy", "mode",
              "collector threads", "seed", "zero_copy", "read_newest", "pin_ring", "inline",
              "start_timeout", "rollout_timeout", "task_kwargs", "params", "shared memory")),
        Door("APPOModule(...)", imported("lightning_unilab.learner.appo"), knock_appo,
             (ValueError, TypeError),
             tuple(APPO_ARGS)),
        Door("OmniSpec batch", _omni_spec, knock_omni_batch, (OmniSpecError,),
             ("batch", "embedding", "modalities", "blocks", "head", "loss")),
        Door("APPO batch", _appo_slot, knock_appo_batch, (ValueError,), ("batch",)),
        Door("OmniStrategy(...)", _omni_setup, knock_omni_strategy, (ValueError, TypeError),
             (*_omni_args(), "devices * num_nodes")),
        Door("WeightBoard", imported("lightning_unilab.runtime.weights"), knock_board,
             (ValueError, TypeError),
             ("state_dict", "version", "shared memory")),
        Door("motion clip .npz", _clip, knock_clip, (ValueError,), ("clip.npz",)),
        Door("user task (MJCF, spec)", imported("lightning_unilab.envs.vector_env"),
             knock_user_task,
             (ValueError, TypeError, TaskBuildError), ("task", "Rail", "spec")),
        Door("train --config", _train_cli, knock_train_config, (CommandRefusal,), ("--",)),
        Door("ring after its writer died", imported("lightning_unilab.runtime.ring"),
             knock_dead_writer, (RuntimeError,),
             ("writer process",)),
    )}


DOORS = _doors  # the registry fuzz/campaign.py loads
