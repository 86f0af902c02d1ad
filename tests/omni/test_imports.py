"""The planner is pure in its imports too: ``omni-plan`` and ``lightning_omni.plan`` never load
torch or Lightning, while ``import lightning_omni`` still registers ``strategy="omni"``.

Each check runs in a fresh interpreter: this test process has imported torch long ago.
"""

import subprocess
import sys
import textwrap

import pytest

_HEAVY = ("torch", "lightning", "lightning.pytorch", "deepspeed")


def _run(code: str) -> subprocess.CompletedProcess:
    prologue = f"import sys\nHEAVY = {_HEAVY!r}\n"
    return subprocess.run([sys.executable, "-c", prologue + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=120)


def _assert_ok(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 0, done.stderr[-3000:]


def test_every_plan_module_and_the_workload_reader_import_without_torch():
    _assert_ok(_run("""
        import importlib, pkgutil
        import lightning_omni.plan as plan
        names = [f"lightning_omni.plan.{m.name}" for m in pkgutil.iter_modules(plan.__path__)]
        assert "lightning_omni.plan.run" in names, names
        for name in [*names, "lightning_omni.workload_yaml", "lightning_omnilab.validate"]:
            importlib.import_module(name)
        loaded = [m for m in HEAVY if m in sys.modules]
        assert not loaded, f"importing the planner loaded {loaded}"
    """))


def test_omni_plan_help_does_not_import_torch():
    done = _run("""
        from lightning_omni.cli import main
        try:
            main(["--help"])
        except SystemExit as stop:
            assert stop.code == 0, stop.code
        loaded = [m for m in HEAVY if m in sys.modules]
        assert not loaded, f"omni-plan --help loaded {loaded}"
    """)
    _assert_ok(done)
    assert "usage: omni-plan" in done.stdout


def test_import_lightning_omni_before_lightning_still_registers_the_strategy_name():
    # (Lightning imported first: test_strategy.py's test_registered_as_omni)
    _assert_ok(_run("""
        import lightning_omni
        assert "torch" not in sys.modules  # registration waits for Lightning
        import lightning.pytorch as pl
        trainer = pl.Trainer(accelerator="cpu", devices=1, strategy="omni", logger=False)
        from lightning_omni import OmniStrategy
        assert isinstance(trainer.strategy, OmniStrategy), trainer.strategy
        assert trainer.strategy.pipeline_parallel == 1
    """))


def test_lazy_names_are_the_real_objects():
    import lightning_omni
    from lightning_omni.spec import OmniSpec
    from lightning_omni.strategy import OmniStrategy

    assert lightning_omni.OmniStrategy is OmniStrategy
    assert lightning_omni.OmniSpec is OmniSpec
    assert {"OmniStrategy", "OmniSpec"} <= set(dir(lightning_omni))
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        lightning_omni.Nope  # noqa: B018


def test_the_spec_imports_nothing_from_the_runtime():
    """``OmniSpec`` (and its TP plan's checks, ``tp_plan``) stand below the runtime: validating
    a spec with a TP plan loads no ``lightning_omni.runtime`` module."""
    _assert_ok(_run("""
        from torch import nn
        from torch.distributed.tensor.parallel import ColwiseParallel
        from lightning_omni.spec import OmniSpec
        spec = OmniSpec(modalities=[], embedding=nn.Embedding(4, 2), blocks=[nn.Linear(2, 2)],
                        head=nn.Linear(2, 4), loss=lambda logits, batch: (0, 1),
                        tp_plan={"head": {"": ColwiseParallel()}})
        spec.validate(1)
        runtime = [m for m in sys.modules if m.startswith("lightning_omni.runtime")]
        assert not runtime, f"the spec loaded {runtime}"
    """))
