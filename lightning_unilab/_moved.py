"""The module paths from before the package had rooms, still importable as the new modules.

Code, recipes (``class_path: lightning_unilab.appo.APPOModule``) and checkpoints that pickled an
object by its old module (``lightning_unilab.randomization.G1Randomization``) name modules that
now live in ``envs/``, ``runtime/`` or ``learner/``. Rather than a shim file per old module, a
finder at the front of ``sys.meta_path`` answers an old name by importing the new module and
returning that very object: one module under two names, so classes, isinstance checks and module
state are shared and nothing is executed twice. A moved package (``tasks``) covers its
submodules too (``lightning_unilab.tasks.g1_walk``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

__all__ = ["MOVED", "install", "new_name"]

# old dotted path -> new dotted path; a package's entry also maps its submodules
MOVED: dict[str, str] = {
    f"lightning_unilab.{name}": f"lightning_unilab.{room}.{name}"
    for room, names in {
        "envs": ("assets", "gym", "pool", "randomization", "registration", "render", "tasks",
                 "vector_env"),
        "runtime": ("collector", "data", "device_copy", "ring", "rollout", "shm", "weights"),
        "learner": ("appo", "losses", "policy", "returns"),
    }.items()
    for name in names
}


def new_name(fullname: str) -> str | None:
    """The current path of an old module path (or of a submodule of a moved package), else None."""
    if fullname in MOVED:
        return MOVED[fullname]
    old, _, rest = fullname.rpartition(".")
    while old:
        if old in MOVED:
            return f"{MOVED[old]}.{rest}"
        old, _, head = old.rpartition(".")
        rest = f"{head}.{rest}"
    return None


class _AliasLoader(importlib.abc.Loader):
    """Hands the import system the already imported new module instead of a fresh one."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)
        spec.loader_state = module.__spec__  # the import system overwrites __spec__ next
        return module

    def exec_module(self, module: ModuleType) -> None:
        # already executed under its new name; only give it back its own spec
        module.__spec__ = module.__spec__.loader_state


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Resolves the old paths of :data:`MOVED` to the new modules (see the module docstring)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        new = new_name(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new))


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (idempotent), ahead of the path finders that
    would otherwise load a moved package's submodule a second time under its old name."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
