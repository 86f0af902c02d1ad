"""What OmniStrategy refuses at setup, each with the reason and the way out.

A run that finishes and is silently not the run the user asked for is the worst outcome, so
every Lightning option whose meaning the pipelined step cannot keep is refused here, before any
step runs (docs/omni/quickstart.md, "Lightning features").
"""

from __future__ import annotations

import dis
import inspect
from collections.abc import Callable

import lightning.pytorch as pl
from lightning.pytorch.plugins.precision import (
    DoublePrecision,
    HalfPrecision,
    MixedPrecision,
    Precision,
)

SUPPORTED_PRECISION = ("32-true", "64-true", "bf16-mixed", "bf16-true", "16-true")
_STEPS = {"training_step": "on_train_batch_end", "validation_step": "on_validation_batch_end",
          "test_step": "on_test_batch_end", "predict_step": "on_predict_batch_end"}
_DOCS = "docs/omni/quickstart.md#lightning-features"


def check_precision(plugin: Precision) -> None:
    """Plugins whose forward context and dtypes the pipelined step honours; fp16 mixed
    precision is refused: its loss scaler would need one inf check over every stage."""
    name = getattr(plugin, "precision", type(plugin).__name__)
    if isinstance(plugin, MixedPrecision) and (plugin.scaler is not None
                                               or name != "bf16-mixed"):
        raise ValueError(f"precision: OmniStrategy supports {SUPPORTED_PRECISION}, got {name!r}: "
                         "fp16 mixed precision scales the loss and skips steps by an inf/NaN "
                         "check that would have to span every pipeline stage; use "
                         "'bf16-mixed' (same speed on hardware with bf16) or '16-true'")
    if type(plugin) not in (Precision, DoublePrecision, HalfPrecision, MixedPrecision):
        raise ValueError(f"precision: OmniStrategy supports {SUPPORTED_PRECISION}, got "
                         f"{type(plugin).__name__} ({name!r})")


def check_trainer(trainer: pl.Trainer, strategy) -> None:
    module = trainer.lightning_module
    if not module.automatic_optimization:
        raise ValueError("OmniStrategy: expected automatic_optimization=True (the pipelined "
                         "step computes gradients itself), got manual optimization")
    if trainer.accumulate_grad_batches != 1:
        raise ValueError("accumulate_grad_batches: expected 1 with OmniStrategy (use "
                         f"num_microbatches), got {trainer.accumulate_grad_batches}")
    if getattr(strategy, "_layer_sync", None) is not None:
        raise ValueError("sync_batchnorm: not supported by OmniStrategy (no stage holds a "
                         "whole replica's activations to synchronize); got sync_batchnorm=True")


def check_module(module: pl.LightningModule) -> None:
    """Refuse hooks that would never run: a custom ``backward``, and ``self.log`` inside the
    ``*_step`` methods the pipelined steps replace."""
    cls = type(module)
    if _overrides(cls, "backward"):
        raise ValueError(f"{cls.__name__}.backward: OmniStrategy runs the backward of each "
                         "pipeline stage itself, so a custom LightningModule.backward would "
                         "never run; remove it (on_before_backward/on_after_backward run)")
    for step, hook in _STEPS.items():
        if not _overrides(cls, step):
            continue
        where = _logs_in(cls, getattr(cls, step), set())
        if where:
            raise ValueError(
                f"{cls.__name__}.{step}: calls self.{where} , which would never run under "
                f"OmniStrategy: the pipelined step runs the parts of configure_omni() in place "
                f"of {step}. Log from {hook}(self, outputs, batch, batch_idx): outputs['loss'] "
                "is the step's global loss (OmniSpec.metrics add more), the same values a "
                f"plain run gives there. See {_DOCS}")


def _overrides(cls: type, name: str) -> bool:
    return getattr(cls, name, None) is not getattr(pl.LightningModule, name, None)


def _logs_in(cls: type, fn: Callable, seen: set) -> str | None:
    """``log`` or ``log_dict`` when ``fn`` (or a method of ``cls`` it calls on self) calls
    ``self.log``/``self.log_dict``."""
    fn = inspect.unwrap(fn)
    code = getattr(fn, "__code__", None)
    if code is None or code in seen:
        return None
    seen.add(code)
    ins = list(dis.get_instructions(code))
    for a, b in zip(ins, ins[1:], strict=False):
        if not (a.opname.startswith("LOAD_FAST") and "self" in str(a.argval)):
            continue
        if b.opname not in ("LOAD_ATTR", "LOAD_METHOD"):
            continue
        if b.argval in ("log", "log_dict"):
            return b.argval
        own = getattr(cls, b.argval, None)
        if callable(own) and not hasattr(pl.LightningModule, b.argval):
            found = _logs_in(cls, own, seen)
            if found:
                return found
    return None
