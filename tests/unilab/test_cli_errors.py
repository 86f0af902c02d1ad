"""A bad argument of a command ends in one line naming the flag, what was expected and what
came, with exit code 2 and no traceback: a constructor's ValueError raised while the CLI builds
the classes, a value of the wrong type, an unknown key; both halves' LightningCLIs (the UniLab
train command, the Omni multimodal recipe) share it (``lightning_omnilab.cli_errors``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_omnilab.cli_errors import constructor_error, one_line

REPO = Path(__file__).resolve().parents[2]
RECIPE = str(REPO / "recipes/unilab/inverted_pendulum.yaml")


def _run(*args: str) -> tuple[int, list[str]]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=600, env=env)
    return done.returncode, done.stderr.strip().splitlines()


@pytest.mark.parametrize(("flag", "value", "last"), [
    ("--data.num_envs", "-3", "error: --data.num_envs: expected an int >= 1, got -3"),
    ("--model.lr", "abc", "error: --model.lr: expected a float, got 'abc'"),
])
def test_the_train_command_ends_a_bad_value_in_one_line(flag, value, last):
    code, err = _run("lightning_unilab.train", "--config", RECIPE, flag, value)
    assert code == 2, err[-20:]
    assert err[-1] == last, err[-20:]
    assert not any(line.startswith("Traceback") for line in err), err[-20:]


def test_the_omni_recipe_ends_a_constructor_error_in_one_line():
    code, err = _run("lightning_omni.examples.multimodal_train", "fit", "--config",
                     str(REPO / "recipes/omni/multimodal_single.yaml"),
                     "--data.epochs_per_stage", "0")
    assert code == 2, err[-20:]
    assert err[-1] == "error: --data.epochs_per_stage: expected an int >= 1, got 0", err[-20:]
    assert not any(line.startswith("Traceback") for line in err), err[-20:]


def test_an_unknown_key_ends_in_one_line_naming_the_closest_flag(capsys):
    from lightning_unilab.train import main

    with pytest.raises(SystemExit) as exit_:
        main(["--config", RECIPE, "--data.num_envz", "3"])
    assert exit_.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == ("error: unrecognized arguments: --data.num_envz 3; --data.num_envz: did you "
                    "mean --data.num_envs?"), last


def test_called_from_python_the_constructors_exception_propagates():
    from lightning_unilab.train import main

    with pytest.raises(ValueError, match=r"^num_envs: expected an int >= 1, got -3$"):
        main(["--config", RECIPE, "--data.num_envs", "-3"])


# jsonargparse's messages as it writes them (jsonargparse/_typehints.py, _core.py)
@pytest.mark.parametrize(("message", "line"), [
    ('Parser key "model.lr":\n  Expected a <class \'float\'>. Got value: abc',
     "--model.lr: expected a float, got 'abc'"),
    ('Parser key "learner_threads":\n  Does not validate against any of the Union subtypes\n'
     "  Subtypes: [<class 'int'>, <class 'NoneType'>]\n  Errors:\n"
     "    - Expected a <class 'int'>\n    - Expected a <class 'NoneType'>\n"
     "  Given value type: <class 'str'>\n  Given value: x",
     "--learner_threads: expected an int or None, got 'x'"),
    ('Parser key "data.mode": \'fast\' not among choices (\'auto\', \'sync\')',
     "--data.mode: 'fast' not among choices ('auto', 'sync')"),
    ("unrecognized arguments: --x 1", "unrecognized arguments: --x 1"),
])
def test_one_line_names_the_flag_what_was_expected_and_what_came(message, line):
    assert one_line(message) == line


def test_a_constructor_error_is_named_by_its_groups_flag():
    from lightning.pytorch import Trainer

    from lightning_unilab.learner.appo import APPOModule
    from lightning_unilab.runtime.data import RolloutDataModule

    groups = {"model": APPOModule, "data": RolloutDataModule, "trainer": Trainer}
    with pytest.raises(ValueError) as err:
        RolloutDataModule(num_envs=-3)  # raised two calls down (CollectorConfig.check)
    assert constructor_error(err.value, groups) == \
        "--data.num_envs: expected an int >= 1, got -3"
    with pytest.raises(ValueError) as err:
        APPOModule(gamma=2.0)
    assert constructor_error(err.value, groups).startswith("--model.gamma: expected ")
    bad = ValueError("learner_threads: expected an int >= 1, got 0")
    assert constructor_error(bad, groups, ["--learner_threads"]) == \
        "--learner_threads: expected an int >= 1, got 0"
    assert constructor_error(ValueError("two\n lines"), groups) == "two lines"
