"""The rooms depend one way (docs/architecture.md): envs/ never loads torch or Lightning, and
runtime/ never loads the learner. Checked in a fresh interpreter, whose imports are its own."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_envs_load_no_torch_and_runtime_loads_no_learner() -> None:
    code = textwrap.dedent("""
        import importlib, pkgutil, sys
        import lightning_unilab.envs as envs, lightning_unilab.runtime as runtime

        def modules(package):
            return [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]

        for name in modules(envs):
            importlib.import_module(name)
        heavy = [m for m in ("torch", "lightning") if m in sys.modules]
        assert not heavy, f"envs/ loaded {heavy}"
        for name in modules(runtime):
            importlib.import_module(name)
        learner = [m for m in sys.modules if m.startswith("lightning_unilab.learner")]
        assert not learner, f"runtime/ loaded {learner}"
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
