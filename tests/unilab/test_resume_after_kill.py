"""A sync RL run SIGKILLed after a checkpoint and resumed goes on exactly as the uninterrupted
run: the same losses after the kill, bit for bit, and the same final weights. The checkpoint
holds the envs' whole state (physics with warm starts, streams, episode bookkeeping, per-env
model fields), the running observations, the action stream and the learner's shuffle stream."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from resume_run import Losses, fit

from lightning_omnilab import safe_load
from lightning_unilab.envs.pool import BatchEnvPool
from lightning_unilab.envs.randomization import G1Randomization
from lightning_unilab.envs.tasks.g1_walk import G1WalkFlat
from lightning_unilab.envs.vector_env import TaskVectorEnv
from lightning_unilab.runtime.checkpoint_arrays import pack, unpack

UPDATES, KILLED_AFTER = 4, 2


@pytest.mark.filterwarnings("ignore:Using ModelCheckpoint with manual optimization")
def test_a_killed_sync_run_resumes_with_the_uninterrupted_runs_losses(tmp_path):
    killed = tmp_path / "killed"
    killed.mkdir()
    worker = Path(__file__).with_name("resume_run.py")
    child = subprocess.run([sys.executable, str(worker), str(killed), str(KILLED_AFTER)],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]

    whole = Losses()
    straight = fit(tmp_path / "whole", UPDATES, [whole])
    assert sorted(whole.by_update) == list(range(1, UPDATES + 1))
    # the killed run's updates, checkpoints saved after each, are the uninterrupted run's
    before = {r["update"]: r["losses"] for r in map(json.loads, open(killed / "losses.jsonl"))}
    assert sorted(before) == list(range(1, KILLED_AFTER + 1))
    assert all(before[u] == whole.by_update[u] for u in before)
    assert "loss/loss" in before[1] and "learner/kl" in before[1]

    after = Losses()
    resumed = fit(killed, UPDATES, [after], ckpt_path=str(killed / "last.ckpt"),
                  save_every_update=True)
    assert sorted(after.by_update) == list(range(KILLED_AFTER + 1, UPDATES + 1))
    for update, losses in after.by_update.items():
        assert losses == whole.by_update[update], update  # floats compared with ==
    for (name, a), b in zip(resumed.state_dict().items(), straight.state_dict().values(),
                            strict=True):
        assert torch.equal(a, b), name
    assert resumed.policy_version == straight.policy_version == UPDATES


def _run(env: TaskVectorEnv, steps: int, seed: int) -> list[np.ndarray]:
    """obs, rewards, flags and per-env friction of ``steps`` steps of random actions."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        actions = rng.uniform(-1, 1, (env.num_envs, env.spec.action_size))
        obs, reward, terminated, truncated, _ = env.step(actions)
        out += [obs, reward, terminated, truncated, env.pool.model_field("geom_friction")]
    return out


def _env(task, threads: int, seed: int) -> TaskVectorEnv:
    env = TaskVectorEnv(task, num_envs=4, num_threads=threads, randomization=G1Randomization(),
                        seed=seed)
    env.reset(seed=seed)
    return env


@pytest.mark.parametrize("task", ["g1-walk-flat", "numpy-twin", "Hopper-v5"])
def test_env_state_round_trips_through_a_checkpoint(task, tmp_path):
    def make(threads, seed):
        if task == "Hopper-v5":
            env = TaskVectorEnv(task, num_envs=4, num_threads=threads, seed=seed)
            env.reset(seed=seed)
            return env
        return _env(G1WalkFlat() if task == "numpy-twin" else task, threads, seed)

    a = make(1, 0)
    limit = a.spec.max_episode_steps
    # env 0 restarts before the save, env 1 after it (new start state and model draws), the
    # others step on in contact: their warm starts matter
    a.episode_steps[:] = [limit - 3, limit - 23, 0, 0]
    _run(a, 20, seed=1)
    path = tmp_path / "env.ckpt"
    safe_load.save({"env": pack(a.get_state())}, path)
    expected = _run(a, 8, seed=2)

    b = make(2, 7)  # another seed, other draws, other thread count: all replaced
    b.set_state(unpack(safe_load.load(path)["env"]))
    got = _run(b, 8, seed=2)
    for i, (x, y) in enumerate(zip(expected, got, strict=True)):
        assert np.array_equal(x, y), i


def test_set_state_refuses_another_envs_state_naming_the_entry():
    env = TaskVectorEnv("InvertedPendulum-v5", num_envs=2)
    env.reset(seed=0)
    state = env.get_state()
    with pytest.raises(ValueError, match=r"state\['task'\]"):
        TaskVectorEnv("HalfCheetah-v5", num_envs=2).set_state(state)
    with pytest.raises(ValueError, match=r"state\['num_envs'\]"):
        TaskVectorEnv("InvertedPendulum-v5", num_envs=3).set_state(state)
    bad = {**state, "episodes": {**state["episodes"], "rng": state["episodes"]["rng"][:1]}}
    with pytest.raises(ValueError, match=r"state\['episodes'\]\['rng'\]"):
        env.set_state(bad)
    bad = {**state, "pool": {**state["pool"], "state": state["pool"]["state"][:, :2]}}
    with pytest.raises(ValueError, match=r"state\['state'\]"):
        env.set_state(bad)


def test_pool_state_holds_outputs_and_randomized_fields(arm_model):
    """What a numpy task may read before its next step (outputs) and per-env model values come
    back too; a field randomized only in the fresh pool goes back to the model's value."""
    a = BatchEnvPool(arm_model, 3, 1, outputs={"sensordata": None}, stage="none")
    a.reset(randomization={"body_mass": np.linspace(1, 2, 3)[:, None] + np.ones(arm_model.nbody)})
    a.step(nstep=3)
    state = a.get_state()
    b = BatchEnvPool(arm_model, 3, 2, outputs={"sensordata": None}, stage="none")
    b.reset(randomization={"dof_damping": np.full((3, arm_model.nv), 0.5)})
    b.set_state(state)
    assert np.array_equal(b.outputs["sensordata"], a.outputs["sensordata"])
    assert np.array_equal(b.model_field("body_mass"), a.model_field("body_mass"))
    assert np.array_equal(b.model_field("dof_damping"), a.model_field("dof_damping"))
    a.step(nstep=5)
    b.step(nstep=5)
    assert np.array_equal(b.state, a.state)
