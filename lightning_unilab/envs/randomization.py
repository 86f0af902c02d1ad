"""Reset-time domain randomization as objects a YAML recipe can name and a process can receive.

``TaskVectorEnv(randomization=fn)`` takes a function; the collector process receives its env's
keywords by pickling, and a recipe names its randomization in YAML, so a randomization is an
object holding plain data only (a closure pickles neither into a spawned process nor out of a
YAML file). :class:`G1Randomization` holds the ranges and reads what it needs of the G1 model on
first use, in the process that steps the env. A recipe names any :class:`Randomization` subclass
under the data module's ``randomization``:

    data:
      task: g1-walk-flat
      randomization:
        class_path: lightning_unilab.envs.randomization.G1Randomization
        init_args: {friction: [0.4, 1.0], mass_scale: [0.9, 1.1], kp_scale: [0.9, 1.1]}
"""

from __future__ import annotations

import abc
import inspect
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lightning_omnilab.safe_load import allow, allowed
from lightning_unilab.envs.class_path import import_path, path_of, plain_data

__all__ = ["G1Randomization", "Randomization", "build_randomization", "randomization_config"]

Range = Sequence[float] | None


def _range(name: str, value: Range) -> tuple[float, float] | None:
    if value is None:
        return None
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected [low, high] or None, got {value!r}") from None
    if not (math.isfinite(low) and math.isfinite(high) and 0 <= low <= high):
        raise ValueError(f"{name}: expected finite 0 <= low <= high, got {value!r}")
    return low, high


class Randomization(abc.ABC):
    """What a recipe's ``randomization`` names: picklable, called as ``(rng, env ids) ->
    {pool model field: values for those envs}`` at every episode start of those envs.

    A subclass of a user's (e.g. for a user's task class) works as the project's own: it is
    pickled into the collector process (so it must be importable there: defined at the top of
    a module), and checkpoints keep it as ``{"class_path", "init_args"}`` (its constructor's
    arguments, recorded when it is made; plain data only), which ``evaluate`` rebuilds."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Randomization:
        self = super().__new__(cls)
        # what built it: a checkpoint names a user's subclass by these (randomization_config)
        self._init_call = (args, kwargs)
        return self

    def init_args(self) -> dict[str, Any]:
        """The constructor's arguments this object was made with, by name."""
        args, kwargs = getattr(self, "_init_call", ((), {}))
        try:
            bound = inspect.signature(type(self)).bind(*args, **kwargs)
        except TypeError:  # unpickled: made without the constructor
            return dict(kwargs)
        return dict(bound.arguments)

    @abc.abstractmethod
    def __call__(self, rng: np.random.Generator, ids: np.ndarray) -> dict[str, np.ndarray]:
        """Draws for the envs ``ids``."""


class G1Randomization(Randomization):
    """Per-env, per-episode floor/foot friction, link-mass scale and kp (kd) scale of the G1.

    Args: ``[low, high]`` uniform ranges, or None to leave a field alone. Values are drawn per
    env and per episode and applied through BatchEnvPool.reset; kd scales the position
    actuators' own damping (zero in this G1, whose damping is in dof_damping). The scene's feet
    touch the floor only through explicit contact pairs, whose friction MuJoCo takes from
    ``pair_friction`` and not from the geoms: the friction draw sets both sliding coefficients
    of every pair with the floor, and the geoms' sliding friction for any other contact.
    """

    def __init__(self, friction: Range = (0.4, 1.0), mass_scale: Range = (0.9, 1.1),
                 kp_scale: Range = (0.9, 1.1), kd_scale: Range = None) -> None:
        self.ranges = {"friction": _range("friction", friction),
                       "mass_scale": _range("mass_scale", mass_scale),
                       "kp_scale": _range("kp_scale", kp_scale),
                       "kd_scale": _range("kd_scale", kd_scale)}
        self._model: dict[str, Any] | None = None

    def _model_fields(self) -> dict[str, Any]:
        """What the draws scale, read once from the G1 model (per process: not pickled)."""
        if self._model is None:
            import mujoco

            from lightning_unilab.envs.tasks.g1_walk import G1WalkFlat

            m = G1WalkFlat().model()
            floor = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, "floor")
            self._model = {
                "geom_friction": m.geom_friction.copy(), "pair_friction": m.pair_friction.copy(),
                "floor_pairs": np.flatnonzero((m.pair_geom1 == floor) | (m.pair_geom2 == floor)),
                "body_mass": m.body_mass.copy(), "kp": m.actuator_gainprm[:, 0].copy(),
                "kd": -m.actuator_biasprm[:, 2].copy()}
        return self._model

    def __call__(self, rng: np.random.Generator, ids: np.ndarray) -> dict[str, np.ndarray]:
        m, r = self._model_fields(), self.ranges
        n = len(ids)
        out: dict[str, np.ndarray] = {}
        if r["friction"] is not None:
            mu = rng.uniform(*r["friction"], size=(n, 1))
            f = np.broadcast_to(m["geom_friction"], (n, *m["geom_friction"].shape)).copy()
            f[:, :, 0] = mu
            out["geom_friction"] = f
            if m["floor_pairs"].size:
                pf = np.broadcast_to(m["pair_friction"], (n, *m["pair_friction"].shape)).copy()
                pf[:, m["floor_pairs"], :2] = mu[:, :, None]
                out["pair_friction"] = pf
        if r["mass_scale"] is not None:
            mass = m["body_mass"]
            out["body_mass"] = mass * rng.uniform(*r["mass_scale"], size=(n, len(mass)))
        if r["kp_scale"] is not None:
            out["actuator_kp"] = m["kp"] * rng.uniform(*r["kp_scale"], size=(n, len(m["kp"])))
        if r["kd_scale"] is not None:
            out["actuator_kd"] = m["kd"] * rng.uniform(*r["kd_scale"], size=(n, len(m["kd"])))
        return out

    def __getstate__(self) -> dict[str, Any]:
        # the ranges only (the model's fields are read again where it runs), and "_draw", which
        # the code before the draw moved into this class reads
        return {"ranges": self.ranges, "_draw": None}

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        self.ranges = dict(state["ranges"])
        self._model = None

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={list(v) if v else None}" for k, v in self.ranges.items())
        return f"G1Randomization({args})"


# checkpoints pickle a recipe's randomization (the data module's arguments): allowed in
# weights-only loading, also under its module path before the package had rooms
allow([G1Randomization], old_modules={"lightning_unilab.randomization": __name__})


def randomization_config(randomization: Any) -> Any:
    """What a checkpoint keeps of a data module's randomization: the object itself where
    weights-only loading knows its type (the project's own), else ``{"class_path",
    "init_args"}``, plain data (:func:`build_randomization` makes it again). Refuses (naming the
    class) one that another process could not import or whose arguments are not plain data.
    Anything that is not a Randomization is returned as it is (the data module checks it)."""
    if not isinstance(randomization, Randomization):
        return randomization
    cls = type(randomization)
    if any(t is cls for t, _ in allowed()):
        return randomization
    return {"class_path": path_of(cls, "randomization"),
            "init_args": plain_data(randomization.init_args(),
                                    f"randomization {cls.__qualname__}: init_args")}


def build_randomization(config: Any) -> Any:
    """A randomization from :func:`randomization_config`'s form (anything else as it is)."""
    if not isinstance(config, Mapping) or "class_path" not in config:
        return config
    path = config["class_path"]
    cls = import_path(path, "randomization")
    if not (isinstance(cls, type) and issubclass(cls, Randomization)):
        raise TypeError(f"randomization {path!r}: not a Randomization subclass")
    return cls(**dict(config.get("init_args") or {}))
