"""``ReleaseAtExit``: a run that ended cleanly destroys the process group before the interpreter
finalizes; a failed one leaves it (a peer may be inside a collective the destroy would wait for).
Each case is a fresh interpreter, so its exit handlers really run."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import atexit, sys
    import torch.distributed as dist
    from lightning_omnilab.process_group import ReleaseAtExit

    # registered first, so it runs after the release: what the interpreter finalizes with
    atexit.register(lambda: print("group", "up" if dist.is_initialized() else "destroyed"))
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    release = ReleaseAtExit()
    {steps}
""")


@pytest.mark.parametrize("steps,expected", [
    ("release.arm()", "destroyed"),
    ("release.arm(); release.arm()", "destroyed"),  # armed twice: still one clean release
    ("release.arm(); release.failed()", "up"),
    ("pass", "up"),  # never armed
])
def test_group_at_exit(steps, expected):
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(steps=steps)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["group", expected]
