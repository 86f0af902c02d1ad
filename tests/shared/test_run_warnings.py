"""A short run prints none of the notices a user cannot act on (lightning_omnilab.quiet), and the
one the project could fix at its cause (MuJoCo's settotalmass) is gone without changing a model.

The runs are subprocesses: what a user sees is the process's stdout and stderr, and MuJoCo prints
from C, outside Python's warnings.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import mujoco
import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[2]

# what each notice prints, as the user would see it
NOTICES = {
    "torch LeafSpec deprecation (Lightning's _pytree)": "`isinstance(treespec, LeafSpec)`",
    "ModelCheckpoint advice for manual optimization": "Using ModelCheckpoint with manual",
    "litlogger tip": "litlogger",
    "DeepSpeed found no GPU": "Setting accelerator to CPU",
    "MuJoCo settotalmass deprecation": "settotalmass",
}


def _run(args: list[str], cwd: Path) -> str:
    done = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


def _assert_quiet(output: str) -> None:
    printed = [name for name, text in NOTICES.items() if text in output]
    assert not printed, f"printed {printed}:\n{output[-3000:]}"


def test_gym_models_compile_without_the_settotalmass_warning_and_identically(capfd):
    from lightning_unilab.envs import tasks

    path = tasks.gym_xml("half_cheetah.xml")
    assert "settotalmass" in path.read_text()  # the case this covers still exists
    ours = tasks.load_model("HalfCheetah-v5")
    assert "settotalmass" not in "".join(capfd.readouterr())
    plain = mujoco.MjModel.from_xml_path(str(path))
    for name in dir(plain):
        value = getattr(plain, name)
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(getattr(ours, name), value, err_msg=name)


def test_a_short_unilab_run_prints_none_of_the_notices(tmp_path):
    cfg = yaml.safe_load((ROOT / "recipes/unilab/half_cheetah.yaml").read_text())
    cfg["trainer"]["logger"]["init_args"]["save_dir"] = str(tmp_path)
    for callback in cfg["trainer"]["callbacks"]:
        args = callback.setdefault("init_args", {})
        if callback["class_path"].endswith("ModelCheckpoint"):
            args["every_n_train_steps"] = 1  # Lightning advises at every save
        elif callback["class_path"].endswith("EvaluationRollout"):
            args.update(max_steps=4, video=False)
    cfg["data"].update(num_envs=2, horizon=4)
    config = tmp_path / "quiet.yaml"
    config.write_text(yaml.safe_dump(cfg))
    _assert_quiet(_run(["-m", "lightning_unilab.train", "--config", str(config),
                        "--trainer.limit_train_batches=1", "--trainer.max_epochs=1"], tmp_path))


def test_a_short_omni_fit_prints_none_of_the_notices(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT / "tests/omni")!r})
        from lightning.pytorch import Trainer
        from lightning.pytorch.loggers import TensorBoardLogger
        from omni_models import ToyData, make_model
        from torch.utils.data import DataLoader

        from lightning_omni import OmniStrategy
        from lightning_omni.runtime.ulysses import deepspeed_available

        trainer = Trainer(accelerator="cpu", devices=1, strategy=OmniStrategy(), max_steps=1,
                          logger=TensorBoardLogger({str(tmp_path)!r}),
                          enable_checkpointing=False, enable_progress_bar=False)
        trainer.fit(make_model(0).double(), DataLoader(ToyData(8), batch_size=4))
        assert deepspeed_available()  # what LSSP's Ulysses attention imports on every rank
    """)
    _assert_quiet(_run(["-c", script], tmp_path))
