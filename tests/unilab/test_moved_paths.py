"""The module paths from before the package had rooms still import, as the very new modules:
one module object under two names, so classes, isinstance checks, pickles that name the old
module and recipes' old ``class_path`` strings all keep working."""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lightning_unilab._moved import MOVED, new_name

ROOT = Path(__file__).resolve().parents[2]
RECIPE = str(ROOT / "recipes" / "unilab" / "inverted_pendulum.yaml")


@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_old_path_imports_as_the_new_module(old: str) -> None:
    new = importlib.import_module(MOVED[old])
    assert importlib.import_module(old) is new
    assert sys.modules[old] is new
    assert new.__name__ == new.__spec__.name == MOVED[old], "the module keeps its own name"
    package, _, attr = old.rpartition(".")
    assert getattr(importlib.import_module(package), attr) is new  # lightning_unilab.tasks


def test_no_old_module_file_is_left_at_the_top_level() -> None:
    top = ROOT / "lightning_unilab"
    for old in MOVED:
        name = old.rpartition(".")[2]
        assert not (top / f"{name}.py").exists(), old
        assert not (top / name / "__init__.py").exists(), old


def test_an_old_path_class_is_the_new_class() -> None:
    from lightning_unilab.appo import APPOModule as OldAPPO
    from lightning_unilab.randomization import G1Randomization as OldRandomization

    from lightning_unilab.envs.randomization import G1Randomization, Randomization
    from lightning_unilab.learner.appo import APPOModule

    assert OldAPPO is APPOModule
    assert OldRandomization is G1Randomization
    assert isinstance(OldRandomization(), Randomization)


def test_submodules_of_a_moved_package_resolve_too() -> None:
    import lightning_unilab.tasks.g1_walk as old_g1_walk
    from lightning_unilab.tasks.base import NumpyTask

    import lightning_unilab.envs.tasks.g1_walk as g1_walk

    assert old_g1_walk is g1_walk
    assert NumpyTask is importlib.import_module("lightning_unilab.envs.tasks.base").NumpyTask
    assert new_name("lightning_unilab.tasks.g1_walk") == "lightning_unilab.envs.tasks.g1_walk"
    assert new_name("lightning_unilab.train") is None  # the commands did not move
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("lightning_unilab.tasks.no_such_task")


def test_a_pickle_that_names_the_old_module_loads() -> None:
    # what a checkpoint saved before the rooms holds: the data module's Randomization object
    from lightning_unilab.envs.randomization import G1Randomization

    data = pickle.dumps(G1Randomization(friction=(0.5, 0.9)), protocol=2)
    old = data.replace(b"lightning_unilab.envs.randomization", b"lightning_unilab.randomization")
    assert old != data
    loaded = pickle.loads(old)
    assert type(loaded) is G1Randomization and loaded.ranges["friction"] == (0.5, 0.9)


def test_a_recipe_class_path_with_an_old_module_resolves() -> None:
    from lightning_unilab.envs.randomization import G1Randomization
    from lightning_unilab.learner.appo import APPOModule
    from lightning_unilab.runtime.data import RolloutDataModule
    from lightning_unilab.train import UniLabCLI

    old = '{"class_path": "lightning_unilab.randomization.G1Randomization"}'
    cli = UniLabCLI(APPOModule, RolloutDataModule, run=False,
                    args=["--config", RECIPE, "--data.randomization", old])
    assert type(cli.datamodule.config.task_kwargs["randomization"]) is G1Randomization


def test_an_old_path_imported_first_in_a_fresh_process_loads_each_module_once() -> None:
    code = textwrap.dedent("""
        import sys
        from lightning_unilab.tasks.g1_walk import G1WalkFlat
        import lightning_unilab.envs.tasks.g1_walk as g1_walk
        assert G1WalkFlat is g1_walk.G1WalkFlat
        files = [m.__file__ for m in set(sys.modules.values())
                 if getattr(m, "__file__", None) and "lightning_unilab" in m.__file__]
        assert len(files) == len(set(files)), sorted(files)
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
