"""A user's task class, defined here and registered nowhere, trains end to end: through the
collector process and the ring with APPOModule in async and sync mode, from Python and from a
recipe (``task: {class_path, init_args}``), its named terms reach the logs and the evaluation
plot, its checkpoint is evaluated; and the tasks that cannot be imported, built or named by
another process are refused in this process, naming the class and what is missing."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import sys
from pathlib import Path

import mujoco
import numpy as np
import pytest
import torch

from lightning_unilab.envs.randomization import Randomization
from lightning_unilab.envs.tasks import NumpyTask, TaskSpec, Transition

HERE = __name__  # the module path the collector process imports the classes by
POINT_XML = """
<mujoco model="point">
  <option timestep="0.02"/>
  <worldbody>
    <body name="mass">
      <joint name="x" type="slide" axis="1 0 0" damping="1"/>
      <geom type="sphere" size="0.05" mass="1"/>
    </body>
  </worldbody>
  <actuator><motor joint="x" ctrlrange="-1 1" ctrllimited="true"/></actuator>
</mujoco>
"""
TERMS = ("x", "x_command", "reward_tracking", "reward_ctrl")


class PointMass(NumpyTask):
    """Hold a point mass on a rail at a commanded position (resampled every resample_steps)."""

    name = "point-mass"

    def __init__(self, ctrl_cost: float = 0.1, episode_steps: int = 40,
                 resample_steps: int = 10, command_range: float = 0.5) -> None:
        self.ctrl_cost, self.command_range = ctrl_cost, command_range
        self.episode_steps, self.resample_steps = int(episode_steps), int(resample_steps)

    def model(self) -> mujoco.MjModel:
        return mujoco.MjModel.from_xml_string(POINT_XML)

    @property
    def spec(self) -> TaskSpec:
        return TaskSpec(obs_size=3, action_size=1, frame_skip=2,
                        max_episode_steps=self.episode_steps, memory_size=1,
                        resample_steps=self.resample_steps, info_names=TERMS,
                        action_low=-np.ones(1), action_high=np.ones(1))

    def reset(self, pool, ids, rng, memory) -> None:
        pool.qpos[ids] = rng.uniform(ids, -0.5, 0.5, 1)

    def resample(self, ids, rng, memory) -> None:
        memory[ids, 0] = rng.uniform(ids, -self.command_range, self.command_range, 1)[:, 0]

    def act(self, pool, ids, actions, memory) -> None:
        pool.ctrl[ids] = np.clip(actions, -1.0, 1.0)

    def evaluate(self, pool, ids, actions, memory) -> Transition:
        x, command = pool.qpos[ids, 0], memory[ids, 0]
        tracking = -np.abs(x - command)
        ctrl = -self.ctrl_cost * np.square(actions).sum(axis=1)
        return Transition(reward=tracking + ctrl, terminated=np.abs(x) > 2.0,
                          info={"x": x, "x_command": command, "reward_tracking": tracking,
                                "reward_ctrl": ctrl})

    def observe(self, pool, ids, memory, obs, critic) -> None:
        obs[ids] = np.stack([pool.qpos[ids, 0], pool.qvel[ids, 0], memory[ids, 0]], axis=1)


class RailDamping(Randomization):
    """The rail's damping per env and episode: a user's randomization for a user's task."""

    def __init__(self, damping: tuple[float, float] = (0.5, 1.5)) -> None:
        self.damping = (float(damping[0]), float(damping[1]))

    def __call__(self, rng, ids):
        return {"dof_damping": rng.uniform(*self.damping, size=(len(ids), 1))}


class BrokenTask(PointMass):
    def __init__(self, **kwargs) -> None:
        raise FileNotFoundError("point.xml is not here")


class NotATask:
    pass


def _module(**kw):
    from lightning_unilab.learner.appo import APPOModule

    return APPOModule(actor_hidden=(16,), critic_hidden=(16,), epochs=1, minibatches=1, **kw)


def _csv_metrics(path: Path) -> dict[str, list[float]]:
    with open(path) as f:
        rows = list(csv.DictReader(f))
    return {k: [float(r[k]) for r in rows if r.get(k)] for k in rows[0]}


def _evaluate(ckpt: Path, out: Path, capsys, *extra: str) -> dict:
    from lightning_unilab.evaluate import _main

    _main(["checkpoint", str(ckpt), "--out", str(out), "--no-video", *extra])
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


# ---------------------------------------------------------------------------- end to end


def test_async_from_python_logs_the_terms_and_its_checkpoint_evaluates(tmp_path, capsys):
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lightning_omnilab import safe_load
    from lightning_unilab.evaluate import EvaluationRollout
    from lightning_unilab.runtime.data import RolloutDataModule

    args = {"ctrl_cost": 0.05, "episode_steps": 6}
    dm = RolloutDataModule({"class_path": f"{HERE}.PointMass", "init_args": args},
                           num_envs=8, horizon=8, num_slots=2, mode="async",
                           collector_threads=1, randomization=RailDamping((0.8, 1.2)))
    evaluation = EvaluationRollout(video=False, max_steps=30)
    trainer = pl.Trainer(accelerator="cpu", max_steps=4, log_every_n_steps=1,
                         enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path,
                         logger=pl.loggers.CSVLogger(tmp_path, name="run", version=0),
                         callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True),
                                    evaluation])
    threads = torch.get_num_threads()
    try:
        trainer.fit(_module(), datamodule=dm)
    finally:
        torch.set_num_threads(threads)
    assert dm.collector is None  # stopped at teardown
    # the task's named terms, as the built-in tasks' (step_info/<name> per rollout)
    metrics = _csv_metrics(tmp_path / "run" / "version_0" / "metrics.csv")
    for term in TERMS:
        values = metrics[f"step_info/{term}"]
        assert values and all(math.isfinite(v) for v in values), term
    assert max(metrics["step_info/reward_ctrl"]) <= 0
    # the collector built the class with its init args: episodes of episode_steps (no falls)
    assert set(metrics["rollout/episode_length"]) == {6.0}
    # loggers and checkpoints hold the task and the randomization as plain data
    hparams = (tmp_path / "run" / "version_0" / "hparams.yaml").read_text()
    assert f"class_path: {HERE}.PointMass" in hparams and f"{HERE}.RailDamping" in hparams
    ckpt = tmp_path / "ckpt" / "last.ckpt"
    saved = safe_load.load(ckpt)["datamodule_hyper_parameters"]  # weights only
    assert saved["task"] == {"class_path": f"{HERE}.PointMass", "init_args": args}
    assert saved["randomization"] == {"class_path": f"{HERE}.RailDamping",
                                      "init_args": {"damping": [0.8, 1.2]}}
    # the end-of-training evaluation ran on the class, plotted its terms against the command
    summary = evaluation.summary
    assert summary["task"] == "point-mass" and set(summary["terms"]) == set(TERMS)
    assert summary["length"] == 6
    assert Path(summary["plot"]).is_file()
    # and the checkpoint replays it: same task, init args, settings -> the same episode
    printed = _evaluate(ckpt, tmp_path / "eval", capsys)
    replay = json.loads((tmp_path / "eval" / "episode.json").read_text())
    assert (printed["return"], printed["length"]) == (summary["return"], summary["length"])
    assert replay["rewards"] == summary["rewards"] and set(replay["terms"]) == set(TERMS)
    assert (tmp_path / "eval" / "episode.png").is_file()
    # evaluation task_params go over the class's init args
    assert _evaluate(ckpt, tmp_path / "eval2", capsys,
                     "--param", "episode_steps=5")["length"] == 5

    # a checkpoint whose class is not importable here: refused naming it
    from lightning_unilab.evaluate import _main

    state = safe_load.load(ckpt)
    state["datamodule_hyper_parameters"]["task"]["class_path"] = "gone_pkg.tasks.PointMass"
    moved = tmp_path / "moved.ckpt"
    safe_load.save(state, moved)
    with pytest.raises(SystemExit) as exit_:
        _main(["checkpoint", str(moved), "--out", str(tmp_path / "eval3"), "--no-video"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "cannot import 'gone_pkg.tasks.PointMass': no module named 'gone_pkg'" in err


def test_sync_from_a_recipe_with_class_path_and_init_args(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from lightning_omnilab import safe_load
    from lightning_unilab.envs.tasks.ref import TaskRef
    from lightning_unilab.evaluate import (
        EvaluationRollout,
        checkpoint_evaluation,
        evaluate_policy,
    )
    from lightning_unilab.learner.appo import APPOModule
    from lightning_unilab.train import main

    recipe = tmp_path / "point_mass.yaml"
    recipe.write_text(f"""
seed_everything: 0
trainer:
  accelerator: cpu
  devices: 1
  max_steps: 3
  log_every_n_steps: 1
  enable_progress_bar: false
  logger:
    class_path: lightning.pytorch.loggers.TensorBoardLogger
    init_args: {{save_dir: {tmp_path}, name: point_mass}}
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {{save_last: true}}
    - class_path: lightning_unilab.evaluate.EvaluationRollout
      init_args: {{video: false, task_params: {{episode_steps: 12}}}}
model:
  actor_hidden: [16]
  critic_hidden: [16]
  epochs: 1
  minibatches: 1
data:
  task:
    class_path: {HERE}.PointMass
    init_args: {{ctrl_cost: 0.2, episode_steps: 5}}
  num_envs: 8
  horizon: 8
  num_slots: 2
  mode: sync
""")
    threads = torch.get_num_threads()
    try:
        cli = main(["--config", str(recipe)])
    finally:
        torch.set_num_threads(threads)
    config = cli.datamodule.config
    assert config.mode == "sync"
    assert config.task == TaskRef(f"{HERE}.PointMass", {"ctrl_cost": 0.2, "episode_steps": 5})
    log_dir = Path(cli.trainer.log_dir)
    events = EventAccumulator(str(log_dir)).Reload()
    tags = set(events.Tags()["scalars"])
    assert {f"step_info/{term}" for term in TERMS} <= tags and "eval/return" in tags
    # the collector built the class with its init args: episodes of episode_steps
    assert {e.value for e in events.Scalars("rollout/episode_length")} == {5.0}
    summary = next(c for c in cli.trainer.callbacks if isinstance(c, EvaluationRollout)).summary
    assert summary["length"] == 12  # the recipe's evaluation task_params over the init args

    # evaluated with the public functions, as `evaluate checkpoint` does
    ckpt = log_dir / "checkpoints" / "last.ckpt"
    run = checkpoint_evaluation(safe_load.load(ckpt))
    assert run.task == {"class_path": f"{HERE}.PointMass",
                        "init_args": {"ctrl_cost": 0.2, "episode_steps": 5}}
    with safe_load.project_types():
        module = APPOModule.load_from_checkpoint(ckpt, map_location="cpu", weights_only=True)
    replay = evaluate_policy(module.policy, run.task, tmp_path / "eval", run.task_kwargs,
                             seed=run.seed, max_steps=run.max_steps, video=False)
    assert replay["rewards"] == summary["rewards"]


def test_a_spawned_collector_imports_the_class_by_its_path_too(monkeypatch):
    """forkserver is the default start; where there is none (or a forked learner cannot use
    it) the collector is spawned: a fresh interpreter with this process's sys.path either way."""
    import multiprocessing as mp

    from lightning_unilab.learner.policy import ActorCritic
    from lightning_unilab.runtime import collector as collector_module
    from lightning_unilab.runtime.collector import Collector, CollectorConfig
    from lightning_unilab.runtime.rollout import as_tensors

    monkeypatch.setattr(collector_module, "_context", lambda: mp.get_context("spawn"))
    config = CollectorConfig({"class_path": PointMass, "init_args": {"episode_steps": 3}}, 4, 6)
    collector = Collector(config, ActorCritic(3, 3, 1, (8,), (8,)), num_slots=2)
    try:
        collector.start()
        slot, _ = collector.acquire(timeout=120)
        stats = as_tensors(collector.ring.arrays(slot), 0.0, collector.spec.info_names)["stats"]
        collector.release(slot)
    finally:
        collector.stop()
    assert stats["episode_length_mean"] == 3.0 and set(stats["step_info"]) == set(TERMS)


# ---------------------------------------------------------------------------- the forms


def test_every_form_names_the_same_class_and_keeps_plain_data():
    from lightning_unilab.envs.tasks.ref import TaskRef, task_config, task_ref
    from lightning_unilab.runtime.data import RolloutDataModule

    path = f"{HERE}.PointMass"
    for form in (PointMass, path, {"class_path": PointMass}, {"class_path": path},
                 TaskRef(path)):
        assert task_ref(form) == TaskRef(path, {}), form
    assert task_ref("Ant-v5") == "Ant-v5"
    assert task_config({"class_path": path, "init_args": {"ctrl_cost": np.float64(0.5)}}) == {
        "class_path": path, "init_args": {"ctrl_cost": 0.5}}
    assert type(task_config({"class_path": path,
                             "init_args": {"ctrl_cost": np.float64(0.5)}})["init_args"]
                ["ctrl_cost"]) is float  # numpy scalars would not load weights-only
    dm = RolloutDataModule(PointMass, num_envs=4, horizon=4)
    assert dm.hparams["task"] == {"class_path": path, "init_args": {}}
    assert (dm.env_spec.obs_size, dm.env_spec.action_size) == (3, 1)
    assert dm.rollout_spec.info_names == TERMS


def test_the_terms_reach_the_env_info_and_bad_ones_are_named():
    from lightning_unilab.envs.vector_env import TaskVectorEnv

    env = TaskVectorEnv({"class_path": f"{HERE}.PointMass", "init_args": {"ctrl_cost": 1.0}},
                        3, 1)
    try:
        assert env.name == "point-mass" and env.task_ref.init_args == {"ctrl_cost": 1.0}
        env.reset(seed=0)
        _, reward, _, _, info = env.step(np.full((3, 1), 0.5))
        np.testing.assert_allclose(info["reward_tracking"] + info["reward_ctrl"], reward)
        np.testing.assert_allclose(info["reward_ctrl"], -0.25)
    finally:
        env.close()

    class WrongTerms(PointMass):
        def evaluate(self, pool, ids, actions, memory):
            return Transition(reward=np.zeros(len(ids)), terminated=np.zeros(len(ids), bool),
                              info={"x": np.zeros(len(ids))})

    env = TaskVectorEnv(WrongTerms(), 2, 1)
    try:
        env.reset()
        with pytest.raises(ValueError, match=r"task point-mass: Transition.info has keys \['x'\]"):
            env.step(np.zeros((2, 1)))
    finally:
        env.close()


def test_a_users_randomization_comes_back_from_its_checkpoint_form():
    from lightning_unilab.envs.randomization import randomization_config
    from lightning_unilab.evaluate import EvaluationRollout, checkpoint_evaluation

    config = randomization_config(RailDamping(damping=(0.7, 0.9)))
    assert config == {"class_path": f"{HERE}.RailDamping", "init_args": {"damping": [0.7, 0.9]}}
    checkpoint = {"datamodule_hyper_parameters": {"task": {"class_path": f"{HERE}.PointMass"},
                                                  "randomization": config},
                  "callbacks": {"EvaluationRollout": EvaluationRollout(randomize=True)
                                .state_dict()}}
    rebuilt = checkpoint_evaluation(checkpoint).task_kwargs["randomization"]
    assert type(rebuilt) is RailDamping and rebuilt.damping == (0.7, 0.9)


# ---------------------------------------------------------------------------- clear errors


def test_a_path_that_does_not_import_is_named_with_what_is_missing():
    from lightning_unilab.runtime.data import RolloutDataModule

    with pytest.raises(ImportError, match=r"cannot import 'no_such_pkg\.tasks\.Walker': no "
                                          r"module named 'no_such_pkg'"):
        RolloutDataModule("no_such_pkg.tasks.Walker")
    with pytest.raises(ImportError, match=rf"cannot import '{HERE}\.Walker': module '{HERE}' "
                                          r"has no attribute 'Walker'"):
        RolloutDataModule({"class_path": f"{HERE}.Walker"})
    with pytest.raises(ValueError, match=r"unknown task 'Ant-v6'; did you mean 'Ant-v5'.*or a "
                                         r"task class by its import path"):
        RolloutDataModule("Ant-v6")


def test_a_class_that_is_not_a_task_is_named():
    from lightning_unilab.runtime.data import RolloutDataModule

    with pytest.raises(TypeError, match=rf"'{HERE}\.NotATask': NotATask is a class, not a task "
                                        r"class: expected a subclass of .*NumpyTask"):
        RolloutDataModule(f"{HERE}.NotATask")
    with pytest.raises(TypeError, match=r"task: NotATask is not a task class"):
        RolloutDataModule(NotATask)
    with pytest.raises(TypeError, match=r"got a PointMass instance; pass its class"):
        RolloutDataModule(PointMass())


def test_a_constructor_that_raises_is_named_before_any_process_starts():
    from lightning_unilab.envs.tasks.ref import TaskBuildError
    from lightning_unilab.runtime.data import RolloutDataModule

    dm = RolloutDataModule({"class_path": f"{HERE}.BrokenTask", "init_args": {"ctrl_cost": 1}})
    with pytest.raises(TaskBuildError, match=rf"task {HERE}\.BrokenTask: BrokenTask\(\*\*\{{"
                                             r"'ctrl_cost': 1\}\) raised FileNotFoundError: "
                                             r"point.xml is not here"):
        dm.setup("fit")  # what Trainer.fit runs before train_dataloader starts the collector
    assert dm.collector is None


def test_init_args_that_do_not_fit_or_are_not_plain_data_are_named():
    from lightning_unilab.runtime.data import RolloutDataModule

    with pytest.raises(TypeError, match=r"PointMass: init_args \{'ctrl_cots': 1\} do not fit "
                                        r"PointMass\(ctrl_cost.*unexpected keyword"):
        RolloutDataModule({"class_path": f"{HERE}.PointMass", "init_args": {"ctrl_cots": 1}})
    with pytest.raises(TypeError, match=r"PointMass: init_args\['target'\]: expected plain "
                                        r"data .* got a ndarray"):
        RolloutDataModule({"class_path": f"{HERE}.PointMass",
                           "init_args": {"target": np.zeros(2)}})
    with pytest.raises(ValueError, match=r"task: a mapping names a task class as .*got keys "
                                         r"\['class_path', 'ctrl_cost'\]"):
        RolloutDataModule({"class_path": f"{HERE}.PointMass", "ctrl_cost": 1})


def test_classes_another_process_cannot_import_are_refused_here(tmp_path):
    import importlib.util

    from lightning_unilab.runtime.data import RolloutDataModule

    class LocalTask(PointMass):
        pass

    with pytest.raises(TypeError, match=r"LocalTask is defined inside a function"):
        RolloutDataModule(LocalTask)
    # a module loaded from a file by location: here in sys.modules, on no path of a fresh process
    (tmp_path / "hidden_tasks.py").write_text(
        f"from {HERE} import PointMass\n\nclass Hidden(PointMass):\n    pass\n")
    spec = importlib.util.spec_from_file_location("hidden_tasks", tmp_path / "hidden_tasks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["hidden_tasks"] = module
    try:
        spec.loader.exec_module(module)
        with pytest.raises(TypeError, match=r"'hidden_tasks.Hidden': its module 'hidden_tasks' is "
                                            r"loaded here but cannot be found on sys.path"):
            RolloutDataModule(module.Hidden)
    finally:
        del sys.modules["hidden_tasks"]
    with pytest.raises(TypeError, match=r"randomization: .*LocalDamping is defined inside a "
                                        r"function"):
        class LocalDamping(RailDamping):
            pass

        RolloutDataModule(PointMass, randomization=LocalDamping())


class BadSpecTask(PointMass):
    """PointMass with one spec field replaced."""

    def __init__(self, **field: object) -> None:
        super().__init__()
        self.field = field

    @property
    def spec(self) -> TaskSpec:
        return dataclasses.replace(PointMass.spec.fget(self), **self.field)


@pytest.mark.parametrize("field,match", [
    ({"frame_skip": -1}, r"spec\.frame_skip: expected an int >= 1, got -1"),
    ({"obs_size": -1}, r"spec\.obs_size: expected an int >= 1, got -1"),
    ({"max_episode_steps": -3}, r"spec\.max_episode_steps: expected an int >= 0 \(0: none\)"),
    ({"action_low": -np.ones(2)}, r"spec\.action_low: expected 1 finite numbers"),
    ({"action_high": np.array([np.nan])}, r"spec\.action_high: expected 1 finite numbers"),
    ({"action_low": np.ones(1)}, r"spec\.action_low: expected below action_high"),
    ({"max_speed": -1.0}, r"spec\.max_speed: expected a number >= 0"),
])
def test_a_spec_that_breaks_the_rules_is_named_by_its_field(field, match):
    from lightning_unilab import TaskVectorEnv

    with pytest.raises(ValueError, match=rf"^task BadSpecTask: {match}"):
        TaskVectorEnv(BadSpecTask(**field), 2, 1, seed=0)
