"""The LLaVA recipe's command ends a bad argument in one line naming the flag, with exit code 2
and no traceback (``lightning_omnilab.cli_errors``, as the other commands); called from Python,
the constructor's exception reaches the caller."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]
RECIPE = str(REPO / "recipes/omni/llava_tiny.yaml")


def test_a_bad_value_ends_in_one_line_naming_the_flag():
    done = subprocess.run(
        [sys.executable, "-m", "lightning_omni.examples.llava_train", "fit", "--config", RECIPE,
         "--data.image_fraction", "1.5"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2, err[-20:]
    assert err[-1] == "error: --data.image_fraction: expected a fraction in [0, 1], got 1.5", \
        err[-20:]
    assert not any(line.startswith("Traceback") for line in err), err[-20:]


def test_called_from_python_the_constructors_exception_propagates():
    from lightning_omni.examples.llava_train import main

    with pytest.raises(ValueError, match=r"^image_fraction: expected a fraction in \[0, 1\], "
                                         r"got 1\.5$"):
        main(["--config", RECIPE, "--data.image_fraction", "1.5"], run=False)
