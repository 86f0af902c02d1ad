"""Silence, one by one, the notices our runs trigger in other libraries and no user can act on.

Each function drops exactly one message (a regex on its text, plus its warning category or its
logger) and says why the project cannot remove the cause. The modules that trigger a notice call
the function at import, so the filter exists in every process that runs them (Lightning relaunches
the script on each rank) and nothing else anyone else warns about is hidden. Where the project
could fix a cause, it does so instead (e.g. ``lightning_unilab.envs.tasks`` compiles gymnasium's
``settotalmass`` models itself).
"""

from __future__ import annotations

import logging
import re
import warnings


class _DropMessages(logging.Filter):
    """A logging filter that drops records whose message matches ``pattern``."""

    def __init__(self, pattern: str) -> None:
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


def _drop_log_messages(logger_name: str, pattern: str) -> None:
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, _DropMessages) and f.pattern.pattern == pattern
               for f in logger.filters):
        logger.addFilter(_DropMessages(pattern))


def ignore_leafspec_deprecation() -> None:
    """Lightning 2.6's own ``_pytree`` calls the ``LeafSpec`` check torch deprecated; every fit
    warns about Lightning's code, not ours (fixed by upgrading Lightning, not by its users)."""
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                            category=FutureWarning,
                            module=r"lightning\.pytorch\.utilities\._pytree")


def ignore_manual_optimization_checkpoint_advice() -> None:
    """Lightning's ModelCheckpoint asks manually optimized modules to keep ``saved_models`` and a
    ``layer`` attribute to checkpoint the state before the step. APPO checkpoints the state after
    its update on purpose (that is the policy the collector runs), so the advice does not apply."""
    warnings.filterwarnings(
        "ignore", message=r"Using ModelCheckpoint with manual optimization and "
        r"every_n_train_steps, but no pre-optimization state was saved", category=UserWarning)


def drop_litlogger_tip() -> None:
    """The ``💡 Tip`` advertising litlogger on every Trainer: an advertisement, not a notice.
    (Lightning logs rank-zero messages to the logger of whichever of its two rank_zero modules
    was imported last.)"""
    for logger_name in ("lightning.pytorch.utilities.rank_zero",
                        "lightning.fabric.utilities.rank_zero"):
        _drop_log_messages(logger_name, r"try installing \[litlogger\]")


def drop_deepspeed_cpu_accelerator_notice() -> None:
    """Importing DeepSpeed (for its Ulysses attention) on a CPU machine logs a WARNING that it
    found no GPU; a CPU run is what the user asked for."""
    _drop_log_messages("DeepSpeed", r"Setting accelerator to CPU\. If you have GPU or other "
                                    r"accelerator, we were unable to detect it\.")
