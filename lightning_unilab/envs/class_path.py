"""A user's class named by its import path, the way a recipe, a checkpoint and a process name it.

A task class (or a randomization) written by a user travels as ``{"class_path":
"pkg.module.Class", "init_args": {...}}``, LightningCLI's form, never as a pickled class: the
collector is a fresh interpreter (forkserver or spawn) that imports the class by that path and
builds the object itself, and a checkpoint holds only plain data
(:mod:`lightning_omnilab.safe_load`), so that ``evaluate`` can rebuild the task from it. These
helpers give the path of a class, refusing classes no other process could import (defined inside
a function, or in an interactive session), import a path back (naming what is missing when that
fails), and check that init args are plain data.

(``pkgutil.resolve_name`` imports such paths too, but it reads a module that fails to import as
a missing attribute of its package, and names neither.)
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["import_path", "path_of", "plain_data"]

log = logging.getLogger(__name__)

_PLAIN = "plain data (numbers, strings, booleans, None, and lists and dicts of them)"


def path_of(cls: type, what: str) -> str:
    """``"module.QualName"`` of ``cls``, importable by that path in a fresh interpreter.

    Refused (TypeError naming the class): a class defined inside a function, or in a session
    without a file (a notebook, ``python -c``): another process cannot import it by name."""
    name = getattr(cls, "__qualname__", None) or repr(cls)
    module = getattr(cls, "__module__", None)
    if "<locals>" in name:
        raise TypeError(f"{what}: {name} is defined inside a function; the collector process "
                        "imports the class by its path, so define it at the top level of a module")
    if module == "__main__":
        main = sys.modules.get("__main__")
        spec = getattr(main, "__spec__", None)
        if spec is not None and spec.name and spec.name != "__main__":  # `python -m pkg.mod`
            module = spec.name
        elif getattr(main, "__file__", None) is None:
            raise TypeError(f"{what}: {name} is defined in an interactive session (its module "
                            "__main__ has no file), which the collector process cannot import; "
                            "define it in a module (a .py file on sys.path) and import it")
        else:
            log.warning("%s: %s is defined in the script being run (module __main__): the "
                        "collector process re-imports the script, but a checkpoint names it "
                        "'__main__.%s', which `evaluate` cannot import; define it in a module "
                        "to evaluate its checkpoints", what, name, name)
    if not module:
        raise TypeError(f"{what}: {name} has no module to import it from")
    path = f"{module}:{name}" if "." in name else f"{module}.{name}"  # nested: module:Outer.Inner
    _check_findable(path, what)
    return path


def _check_findable(path: str, what: str) -> None:
    """The top-level package of ``path`` can be found by a fresh interpreter with this
    process's ``sys.path`` (what forkserver and spawn give a child), not only through
    ``sys.modules`` (a module built in memory, or loaded from a file by location)."""
    top = path.partition(".")[0]
    if top == "__main__" or top in sys.builtin_module_names:
        return
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        try:
            if find is not None and find(top, None) is not None:
                return
        except (ImportError, ValueError, AttributeError):  # a finder that cannot tell
            continue
    raise TypeError(f"{what}: {path!r}: its module {top!r} is loaded here but cannot be found "
                    "on sys.path, so the collector process (a fresh interpreter) could not "
                    "import it; put its directory on sys.path (or PYTHONPATH) or install its "
                    "package")


def import_path(path: str, what: str) -> Any:
    """The object at ``path``: "pkg.module.Name", or "pkg.module:Outer.Inner" for a nested
    name. ImportError naming the path and what is missing (the module, a module it imports, or
    the name in it), or what importing the module raised."""
    if not isinstance(path, str) or not ("." in path.strip(".") or ":" in path):
        raise ValueError(f"{what}: expected an import path 'package.module.ClassName', got "
                         f"{path!r}")
    module, _, qualname = path.partition(":") if ":" in path else path.rpartition(".")
    try:
        obj = importlib.import_module(module)
    except ModuleNotFoundError as err:
        missing = err.name or "?"
        own = module == missing or module.startswith(f"{missing}.")
        raise ImportError(f"{what}: cannot import {path!r}: no module named {missing!r}"
                          f"{'' if own else f' (imported by {module!r})'}; is its directory on "
                          "sys.path (PYTHONPATH) or its package installed?") from err
    except Exception as err:  # the module's own code failed while it was imported
        raise ImportError(f"{what}: cannot import {path!r}: importing module {module!r} "
                          f"raised {type(err).__name__}: {err}") from err
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ImportError(f"{what}: cannot import {path!r}: module {module!r} has no "
                              f"attribute {qualname!r}") from None
    return obj


def plain_data(value: Any, what: str) -> Any:
    """``value`` as plain data (numpy scalars become Python numbers, tuples lists), or
    TypeError naming the first part that is not: only plain data goes into checkpoints."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(
            value, "ndim", None) == 0:
        return plain_data(value.item(), what)
    if isinstance(value, list | tuple):
        return [plain_data(v, f"{what}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        out = {}
        for key, v in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{what}: keys must be strings, got {key!r}")
            out[key] = plain_data(v, f"{what}[{key!r}]")
        return out
    raise TypeError(f"{what}: expected {_PLAIN}, got a {type(value).__name__} ({value!r:.80}); "
                    "checkpoints keep only plain data, so pass what builds it instead")
