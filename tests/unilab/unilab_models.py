"""Test models and serial references shared by the unilab tests."""

from __future__ import annotations

import mujoco
import numpy as np

# everything the pool must handle: contacts, a free body, position servos, sensors of every stage,
# a site, a mocap body and two keyframes
ARM_XML = """
<mujoco model="arm">
  <option timestep="0.004"/>
  <worldbody>
    <geom name="floor" type="plane" size="2 2 0.1"/>
    <body name="base" pos="0 0 0.5">
      <joint name="shoulder" type="hinge" axis="0 1 0" damping="0.1"/>
      <geom name="upper" type="capsule" fromto="0 0 0 0.3 0 0" size="0.04"/>
      <body name="fore" pos="0.3 0 0">
        <joint name="elbow" type="hinge" axis="0 1 0" damping="0.1"/>
        <geom name="lower" type="capsule" fromto="0 0 0 0.3 0 0" size="0.035"/>
        <site name="tip" pos="0.3 0 0"/>
      </body>
    </body>
    <body name="box" pos="0.4 0 0.2">
      <freejoint name="box"/>
      <geom name="box" type="box" size="0.05 0.05 0.05"/>
    </body>
    <body name="target" mocap="true" pos="0.5 0 0.5"/>
  </worldbody>
  <actuator>
    <position name="shoulder" joint="shoulder" kp="20" kv="1"/>
    <position name="elbow" joint="elbow" kp="10" kv="0.5"/>
  </actuator>
  <sensor>
    <jointpos name="elbow_pos" joint="elbow"/>
    <jointvel name="elbow_vel" joint="elbow"/>
    <framepos name="tip_pos" objtype="site" objname="tip"/>
    <accelerometer name="tip_acc" site="tip"/>
  </sensor>
  <keyframe>
    <key name="bent" qpos="0.3 -0.6 0.4 0 0.2 1 0 0 0" ctrl="0.3 -0.6"/>
    <key name="up" qpos="-1 0.5 0.4 0 0.5 1 0 0 0" ctrl="-1 0.5"/>
  </keyframe>
</mujoco>
"""

INTEGRATION = mujoco.mjtState.mjSTATE_INTEGRATION


def random_ctrl(model: mujoco.MjModel, n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1.5, 1.5, (n, model.nu))


def serial_steps(model: mujoco.MjModel, row: np.ndarray, nstep: int) -> np.ndarray:
    """The reference: one MjData, mj_setState, nstep mj_step, mj_getState."""
    data = mujoco.MjData(model)
    mujoco.mj_setState(model, data, row, INTEGRATION)
    for _ in range(nstep):
        mujoco.mj_step(model, data)
    out = np.empty_like(row)
    mujoco.mj_getState(model, data, out, INTEGRATION)
    return out


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` as a module (benchmarks are scripts, not a package)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def save_fresh_checkpoint(path, task: str, *, seed: int = 0, hidden: tuple[int, ...] = (16,),
                          fold_steps: int = 0, params: dict | None = None):
    """A freshly initialized APPO policy of ``task`` saved as training saves one (its module's
    state and hyperparameters, the data module's task), at ``path``. ``fold_steps``: first fold
    that many steps of 8 envs under uniform random actions in [-0.3, 0.3] into its observation
    normalizers, so that they are not the identity. ``params``: the task's, as a recipe's
    ``task_kwargs.params`` (saved in the data module's hyperparameters)."""
    import lightning
    import torch

    from lightning_unilab.envs.vector_env import TaskVectorEnv
    from lightning_unilab.learner.appo import APPOModule

    env = TaskVectorEnv(task, 8 if fold_steps else 1, 1, seed=seed, params=params)
    spec = env.spec
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = APPOModule(actor_hidden=hidden, critic_hidden=hidden, obs_size=spec.obs_size,
                            critic_size=spec.critic_size or None, action_size=spec.action_size)
        module.setup("fit")
    if fold_steps:
        rng = np.random.default_rng(seed)
        obs, info = env.reset(seed=seed)
        rows, critic = [obs], [info.get("critic_obs", obs)]
        for _ in range(fold_steps):
            obs, _, _, _, info = env.step(rng.uniform(-0.3, 0.3, (8, spec.action_size)))
            rows.append(obs)
            critic.append(info.get("critic_obs", obs))
        module.policy.update_normalizers(torch.as_tensor(np.concatenate(rows)),
                                         torch.as_tensor(np.concatenate(critic)))
    env.close()
    ckpt = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams),
            "pytorch-lightning_version": lightning.__version__,
            "datamodule_hyper_parameters": {
                "task": task, "task_kwargs": {"params": dict(params)} if params else None}}
    module.on_save_checkpoint(ckpt)
    torch.save(ckpt, path)
    return path
