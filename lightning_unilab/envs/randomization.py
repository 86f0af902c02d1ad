"""Reset-time domain randomization as objects a YAML recipe can name and a process can receive.

``TaskVectorEnv(randomization=fn)`` takes a function; the collector process receives its env's
keywords by pickling, and ``lightning_unilab.envs.tasks.g1_walk.randomization()`` returns a closure,
which pickles neither into a spawned process nor out of a YAML file. :class:`G1Randomization`
holds only the ranges and builds that function on first use in the process that steps the env.
A recipe names any :class:`Randomization` subclass under the data module's ``randomization``:

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
from collections.abc import Callable, Mapping, Sequence
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
    """Per-env, per-episode friction, link-mass scale and kp (kd) scale of the G1.

    Args: ``[low, high]`` uniform ranges, or None to leave a field alone; see
    ``lightning_unilab.envs.tasks.g1_walk.randomization`` for what each draws.
    """

    def __init__(self, friction: Range = (0.4, 1.0), mass_scale: Range = (0.9, 1.1),
                 kp_scale: Range = (0.9, 1.1), kd_scale: Range = None) -> None:
        self.ranges = {"friction": _range("friction", friction),
                       "mass_scale": _range("mass_scale", mass_scale),
                       "kp_scale": _range("kp_scale", kp_scale),
                       "kd_scale": _range("kd_scale", kd_scale)}
        self._draw: Callable[..., dict[str, np.ndarray]] | None = None

    def __call__(self, rng: np.random.Generator, ids: np.ndarray) -> dict[str, np.ndarray]:
        if self._draw is None:
            from lightning_unilab.envs.tasks.g1_walk import randomization

            self._draw = randomization(**self.ranges)
        return self._draw(rng, ids)

    def __getstate__(self) -> dict[str, Any]:
        return {"ranges": self.ranges, "_draw": None}  # the closure is rebuilt where it runs

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
