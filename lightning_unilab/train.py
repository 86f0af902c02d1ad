"""Train a policy on a BatchEnvPool task from a YAML recipe (LightningCLI).

    python -m lightning_unilab.train --config recipes/unilab/inverted_pendulum.yaml
    unilab-train --config recipes/unilab/inverted_pendulum.yaml --trainer.max_time 00:00:01:00
    unilab-train --config ... --ckpt_path build/runs/.../checkpoints/last.ckpt   # resume

The recipe has LightningCLI's sections: ``trainer`` (logger, callbacks, max_time/max_steps),
``model`` (:class:`~lightning_unilab.appo.APPOModule`) and ``data``
(:class:`~lightning_unilab.data.RolloutDataModule`). There are no subcommands: the command fits.
``--learner_threads`` sets the learner's torch threads (default 1: with one collector thread,
the two processes use one core each). When the run ends the TensorBoard log directory is printed.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from lightning_unilab.appo import APPOModule
from lightning_unilab.data import RolloutDataModule

__all__ = ["UniLabCLI", "main"]


class UniLabCLI(LightningCLI):
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument("--ckpt_path", type=str | None, default=None,
                            help="checkpoint to resume from")
        parser.add_argument("--learner_threads", type=int, default=1,
                            help="torch threads of the learner process")


def _log_dir(trainer: Any) -> str | None:
    logger = trainer.logger
    return getattr(logger, "log_dir", None) if logger is not None else None


def main(args: list[str] | None = None) -> UniLabCLI:
    cli = UniLabCLI(APPOModule, RolloutDataModule, run=False, seed_everything_default=0,
                    save_config_kwargs={"overwrite": True}, args=args)
    threads = cli.config["learner_threads"]
    if threads < 1:
        raise ValueError(f"learner_threads: expected an int >= 1, got {threads}")
    torch.set_num_threads(threads)
    trainer = cli.trainer
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
