"""Train a policy on a BatchEnvPool task from a YAML recipe (LightningCLI).

    python -m lightning_unilab.train --config recipes/unilab/inverted_pendulum.yaml
    unilab-train --config recipes/unilab/inverted_pendulum.yaml --trainer.max_time 00:00:01:00
    unilab-train --config ... --ckpt_path build/runs/.../checkpoints/last.ckpt   # resume

The recipe has LightningCLI's sections: ``trainer`` (logger, callbacks, max_time/max_steps),
``model`` (:class:`~lightning_unilab.learner.appo.APPOModule`) and ``data``
(:class:`~lightning_unilab.runtime.data.RolloutDataModule`). There are no subcommands: the command
fits. ``data.task`` is a task name or a task class of your own, named as LightningCLI names
classes (``task: {class_path: mypkg.tasks.MyTask, init_args: {...}}``; docs/unilab/tasks.md,
"Training your own task class"): the collector process builds it. ``--learner_threads`` sets
the learner's torch threads (default: all of the rank's CPUs in sync mode, where the collector
waits while the learner updates; 1 in async mode, where the collector steps on the other cores
meanwhile). When the run ends the TensorBoard log directory
is printed.

Flags are matched exactly: a typo fails and names the closest flag (argparse would otherwise take
``--data.num_env`` for ``--data.num_envs``). A bad value ends in one line naming its flag, what
was expected and what came (exit code 2), the constructors' checks included
(:mod:`lightning_omnilab.cli_errors`). The terminal shows env steps, time left and the mean
return (:class:`~lightning_unilab.progress_bar.RLProgressBar`, unless ``--trainer.callbacks``
names another progress bar). ``--trainer.default_root_dir`` moves the logger's
``save_dir`` (the recipes fix it, so it would otherwise be ignored). ``max_time`` is a budget for
the whole run: a resumed run gets only what remains of it (Lightning's Timer is checkpointed).
Checkpoints are written atomically with a digest (``AtomicCheckpointIO`` of
``lightning_omnilab.checkpoint_io``, unless ``--trainer.plugins`` names another checkpoint
plugin): docs/reliability.md, "Faults". ``last.ckpt`` is rewritten when training ends
(``LastCheckpointAtEnd``), so it holds the policy the run ended with, the one its
end-of-training evaluation ran.
"""

from __future__ import annotations

import difflib
import logging
import re
import sys
from collections.abc import Iterable, Mapping
from typing import Any, NoReturn

import torch
from jsonargparse import Namespace
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.cli import LightningArgumentParser

from lightning_omnilab.checkpoint_io import use_atomic_checkpoint_io
from lightning_omnilab.cli_errors import ARGUMENT_ERRORS, OneLineErrorParser, OneLineErrorsCLI
from lightning_omnilab.validate import positive_int
from lightning_unilab.last_checkpoint import LastCheckpointAtEnd
from lightning_unilab.learner.appo import APPOModule
from lightning_unilab.progress_bar import RLProgressBar
from lightning_unilab.runtime.data import RolloutDataModule, learner_threads

__all__ = ["UniLabArgumentParser", "UniLabCLI", "did_you_mean", "main",
           "set_learner_threads", "use_atomic_checkpoints", "use_rl_progress_bar"]

log = logging.getLogger(__name__)

_UNRECOGNIZED = "unrecognized arguments:"
# LightningCLI's own flags that this CLI leaves out, and what to use instead
_LEFT_OUT = {
    "--optimizer": "APPOModule builds its own Adam (actor and critic groups): set --model.lr "
                   "and --model.critic_lr",
    "--lr_scheduler": "the actor's lr follows the KL: set --model.adaptive_lr, "
                      "--model.desired_kl, --model.lr_min, --model.lr_max",
}


# jsonargparse's message for an unknown key in a config file or a group's value
_GROUP_KEY = re.compile(r"Group '([\w.]+)' does not accept option '(\w+)'")


def _unknown_flags(message: str) -> list[str]:
    if _UNRECOGNIZED in message:
        tokens = message.split(_UNRECOGNIZED, 1)[1].split()
        return [t.split("=", 1)[0] for t in tokens if t.startswith("--")]
    return [f"--{group}.{key}" for group, key in _GROUP_KEY.findall(message)]


def did_you_mean(message: str, options: Iterable[str],
                 notes: Mapping[str, str] | None = None) -> str:
    """``message`` (argparse's "unrecognized arguments: ...", or jsonargparse's unknown key of a
    config) with the closest valid flag of each unknown one (or its entry in ``notes``), so
    that a typo names its fix instead of only the usage wall."""
    flags = _unknown_flags(message)
    options = [o for o in options if o.startswith("--")]
    notes = notes or {}
    hints = []
    for flag in flags:
        close = difflib.get_close_matches(flag, options, n=1, cutoff=0.7)
        if flag in notes:
            hints.append(f"{flag}: not a flag here, {notes[flag]}")
        elif close:
            hints.append(f"{flag}: did you mean {close[0]}?")
        else:
            hints.append(f"{flag}: no such flag (see --help)")
    return "; ".join([message, *hints])


class UniLabArgumentParser(OneLineErrorParser):
    """LightningCLI's parser without prefix matching, with a did-you-mean for typos, its
    errors on one line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # else --trainer.max_tim is taken as max_time
        super().__init__(*args, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        # argparse keeps its flags only in this mapping (no public accessor)
        super().error(did_you_mean(message, self._option_string_actions, _LEFT_OUT), ex)


def _logger_configs(logger: Any) -> list[Namespace]:
    if isinstance(logger, Namespace):
        return [logger]
    if isinstance(logger, list):
        return [c for c in logger if isinstance(c, Namespace)]
    return []


class UniLabCLI(OneLineErrorsCLI):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("parser_class", UniLabArgumentParser)
        # the policy is built in setup(), so LightningCLI's --optimizer would get no parameters:
        # APPOModule configures its own two-group Adam
        kwargs.setdefault("auto_configure_optimizers", False)
        kwargs.setdefault("parser_kwargs", {"description": __doc__})
        super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument("--ckpt_path", type=str | None, default=None,
                            help="checkpoint to resume from; max_time counts the time already "
                                 "trained, so the resumed run gets only what remains of it")
        parser.add_argument("--learner_threads", type=int | None, default=None,
                            help="torch threads of the learner process (default: the rank's "
                                 "CPUs in sync mode, where the collector waits during the "
                                 "update; 1 in async mode)")

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        """Lightning's trainer, with :class:`RLProgressBar` in place of Lightning's default
        bar unless the command named a progress bar (``--trainer.callbacks``) or none."""
        named = self.config_init["trainer"].get("callbacks")  # before Lightning adds its own
        named = named if isinstance(named, list) else [named]
        chosen = any(isinstance(cb, ProgressBar) for cb in named)
        trainer = super().instantiate_trainer(**kwargs)
        use_rl_progress_bar(trainer, chosen)
        return trainer

    def before_instantiate_classes(self) -> None:
        """``trainer.default_root_dir`` wins over the recipe's logger ``save_dir``: the logs and
        checkpoints (under the logger's directory) go where the user asked."""
        trainer = self.config["trainer"]
        root = trainer.get("default_root_dir")
        if root is None:
            return
        for logger in _logger_configs(trainer.get("logger")):
            init_args = logger.get("init_args")
            if init_args is not None and "save_dir" in init_args:
                init_args["save_dir"] = root


def _log_dir(trainer: Any) -> str | None:
    logger = trainer.logger
    return getattr(logger, "log_dir", None) if logger is not None else None


def set_learner_threads(cli: UniLabCLI) -> int:
    """The learner's torch threads: ``--learner_threads``, or ``learner_threads``' default for
    the data module's mode and the trainer's accelerator; returns the count set."""
    threads = cli.config["learner_threads"]
    if threads is None:
        on_cpu = isinstance(cli.trainer.accelerator, CPUAccelerator)
        mode = cli.datamodule.choose_mode(on_cpu)
        threads = learner_threads(mode, cli.trainer.num_devices, on_cpu)
    threads = positive_int("learner_threads", threads)
    torch.set_num_threads(threads)
    log.info("learner: %d torch threads", threads)
    return threads


def use_rl_progress_bar(trainer: Any, chosen: bool) -> bool:
    """Replace the progress bar Lightning added by default with :class:`RLProgressBar` (env
    steps, time left, return: an endless epoch's batch count says nothing); a bar the user
    ``chosen`` is kept, and a run without one stays without. Returns whether it was replaced."""
    default = trainer.progress_bar_callback
    if chosen or default is None:
        return False
    trainer.callbacks[trainer.callbacks.index(default)] = RLProgressBar()
    return True


def use_atomic_checkpoints(trainer: Any) -> bool:
    """Give the trainer's strategy ``AtomicCheckpointIO`` where it has Lightning's default
    ``TorchCheckpointIO``: a run killed during a save keeps its last complete checkpoint, a full
    disk says so and keeps it, and each checkpoint carries its digest. A checkpoint plugin the
    user chose (``--trainer.plugins``) is kept. Returns whether it was set."""
    return use_atomic_checkpoint_io(trainer.strategy)


def main(args: list[str] | None = None) -> UniLabCLI:
    """The command. From the command line (``args`` None) a bad argument value ends in one
    line naming its flag and exit code 2; called with ``args``, the constructor's exception
    propagates to the caller."""
    cli = UniLabCLI(APPOModule, RolloutDataModule, run=False, seed_everything_default=0,
                    save_config_kwargs={"overwrite": True}, args=args,
                    exit_on_argument_error=args is None)
    try:
        set_learner_threads(cli)
    except ARGUMENT_ERRORS as err:
        cli.argument_error(err)
    trainer = cli.trainer
    use_atomic_checkpoints(trainer)
    if not any(isinstance(cb, LastCheckpointAtEnd) for cb in trainer.callbacks):
        trainer.callbacks.append(LastCheckpointAtEnd())  # last.ckpt = the policy trained
    try:
        trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=cli.config["ckpt_path"])
    finally:
        log_dir = _log_dir(trainer)
        if log_dir is not None and trainer.is_global_zero:
            print(f"\nTensorBoard logs: {log_dir}\n  open them with: tensorboard --logdir "
                  f"{log_dir}  (then browse to http://localhost:6006)", file=sys.stderr)
    return cli


if __name__ == "__main__":
    main()
