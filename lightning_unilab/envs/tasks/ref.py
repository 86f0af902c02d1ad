"""A user's task class where a task name goes: the data module, the collector, recipes, evaluate.

    RolloutDataModule(task=MyTask)                                   # the class
    RolloutDataModule(task="mypkg.tasks.MyTask")                     # its import path
    RolloutDataModule(task={"class_path": "mypkg.tasks.MyTask",      # LightningCLI's form
                            "init_args": {"target": 0.5}})

Every form becomes a :class:`TaskRef`: the class's import path and its constructor's arguments,
plain data only. The collector process builds the task from it (``TaskRef.build``) after
importing the class by name; checkpoints keep ``TaskRef.config()`` (a plain dict, which
weights-only loading reads), and ``evaluate`` rebuilds the task from that. A task class is a
:class:`~lightning_unilab.envs.tasks.NumpyTask` subclass (a task built from reusable terms is one
too). ``TaskRef.check`` finds in the learner's process, before any process starts, what would
fail in the collector: a path that does not import, a class that is not a task, init args that
are not plain data or do not fit the constructor, a class another process cannot import.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lightning_unilab.envs.class_path import import_path, path_of, plain_data
from lightning_unilab.envs.tasks.base import NumpyTask

__all__ = ["TaskBuildError", "TaskRef", "task_config", "task_label", "task_ref"]

_KEYS = ("class_path", "init_args")


class TaskBuildError(RuntimeError):
    """A task class's constructor (or its ``model()`` / ``spec``) raised."""


@dataclass(frozen=True)
class TaskRef:
    """A task class by import path, with its constructor's arguments (plain data)."""

    class_path: str
    init_args: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.class_path, str) or not self.class_path:
            raise TypeError(f"task class_path: expected an import path 'package.module.Class', "
                            f"got {self.class_path!r}")
        if not isinstance(self.init_args, Mapping):
            raise TypeError(f"task {self.class_path}: init_args: expected a mapping of the "
                            f"constructor's arguments, got {type(self.init_args).__name__}")
        args = plain_data(self.init_args, f"task {self.class_path}: init_args")
        object.__setattr__(self, "init_args", args)

    @property
    def name(self) -> str:
        """The class's name, for messages."""
        return self.class_path.replace(":", ".").rpartition(".")[2]

    def __str__(self) -> str:
        return self.class_path

    def config(self) -> dict[str, Any]:
        """``{"class_path": ..., "init_args": {...}}``: what recipes and checkpoints hold."""
        return {"class_path": self.class_path, "init_args": dict(self.init_args)}

    def with_args(self, overrides: Mapping[str, Any]) -> TaskRef:
        """The same class with ``overrides`` over its init args (e.g. an evaluation's
        ``task_params``)."""
        return TaskRef(self.class_path, {**self.init_args, **dict(overrides)})

    def load(self) -> type[NumpyTask]:
        """The class (ImportError, or TypeError for an object that is not a task class)."""
        cls = import_path(self.class_path, "task")
        if not (isinstance(cls, type) and issubclass(cls, NumpyTask)):
            kind = "class" if isinstance(cls, type) else type(cls).__name__
            raise TypeError(f"task {self.class_path!r}: {self.name} is a {kind}, not a task "
                            "class: expected a subclass of lightning_unilab.envs.tasks.NumpyTask")
        return cls

    def _bind(self, cls: type) -> None:
        try:
            signature = inspect.signature(cls)
        except (TypeError, ValueError):  # no signature to check against: the call will tell
            return
        try:
            signature.bind(**self.init_args)
        except TypeError as err:
            raise TypeError(f"task {self.class_path}: init_args {dict(self.init_args)} do not fit "
                            f"{self.name}{signature}: {err}") from None

    def check(self) -> None:
        """What would fail in the collector process, found here: the import, the class, the
        init args against its signature, and that a fresh interpreter can import it."""
        cls = self.load()
        path_of(cls, f"task {self.class_path}")
        self._bind(cls)

    def build(self) -> NumpyTask:
        """An instance: ``Class(**init_args)``; a constructor that raises is reported as
        :class:`TaskBuildError` naming the class (the original error chained)."""
        cls = self.load()
        self._bind(cls)
        try:
            task = cls(**self.init_args)
        except Exception as err:
            raise TaskBuildError(f"task {self.class_path}: {self.name}(**{dict(self.init_args)}) "
                                 f"raised {type(err).__name__}: {err}") from err
        return task


def task_ref(task: Any) -> str | TaskRef:
    """A built-in task name as it is, any other task as a :class:`TaskRef`.

    ``task``: a name of ``lightning_unilab.envs.tasks.task_names()``, an import path
    "pkg.module.Class", a NumpyTask subclass, a mapping ``{"class_path": path or class,
    "init_args": {...}}``, or a TaskRef. Nothing is imported here (``TaskRef.check`` does)."""
    from lightning_unilab.envs import tasks

    if isinstance(task, TaskRef):
        return task
    if isinstance(task, str):
        if task in tasks.task_names():
            return task
        if "." in task.strip(".") or ":" in task:
            return TaskRef(task)
        try:
            tasks.get(task)
        except ValueError as err:
            raise ValueError(f"task: {err}; or a task class by its import path "
                             "'package.module.Class'") from None
        return task
    if isinstance(task, type):
        if not issubclass(task, NumpyTask):
            raise TypeError(f"task: {task.__qualname__} is not a task class: expected a "
                            "subclass of lightning_unilab.envs.tasks.NumpyTask")
        return TaskRef(path_of(task, "task"))
    if isinstance(task, Mapping):
        unknown = sorted(set(map(str, task)) - set(_KEYS))
        if unknown or "class_path" not in task:
            raise ValueError(f"task: a mapping names a task class as {{class_path: "
                             f"'package.module.Class', init_args: {{...}}}}, got keys "
                             f"{sorted(map(str, task))}")
        path = task["class_path"]
        if isinstance(path, type):
            path = task_ref(path).class_path  # type: ignore[union-attr]
        return TaskRef(path, task.get("init_args") or {})
    if isinstance(task, NumpyTask):
        raise TypeError(f"task: got a {type(task).__qualname__} instance; pass its class (and "
                        "its constructor's arguments as init_args): the collector process "
                        "builds the task from the class's import path, and checkpoints name it "
                        "so")
    raise TypeError(f"task: expected a task name, a NumpyTask subclass, an import path or "
                    f"{{class_path, init_args}}, got {type(task).__name__}")


def task_config(task: Any) -> str | dict[str, Any]:
    """``task`` as plain data: a built-in name, or ``{"class_path", "init_args"}``."""
    ref = task_ref(task)
    return ref if isinstance(ref, str) else ref.config()


def task_label(task: Any) -> str:
    """A short name for messages: the task name, or the class path."""
    if isinstance(task, TaskRef):
        return task.class_path
    if isinstance(task, Mapping):
        return str(task.get("class_path"))
    if isinstance(task, type):
        return task.__qualname__
    return str(task)
