"""One rank of ``test_multinode.py``, started by torchrun or with SLURM's variables.

``python multinode_worker.py omni OUT PP DP STEPS BATCH SAMPLES`` fits ``OmniToy`` under
``OmniStrategy(pipeline_parallel=PP, data_parallel=DP)`` with ``Trainer(num_nodes=2,
devices=1)``, as a user's ``train.py`` would, and writes what this rank saw to
``OUT/rank{global_rank}.pt``. ``RankReport`` does the same for a UniLab learner rank started
by ``python -m lightning_unilab.train`` (``--trainer.callbacks+=`` it).
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist


def where(trainer: pl.Trainer) -> dict[str, Any]:
    """The ranks as Lightning and as torch.distributed see them, and who said so."""
    return {"global_rank": trainer.global_rank, "node_rank": trainer.node_rank,
            "local_rank": trainer.local_rank, "world_size": trainer.world_size,
            "dist_rank": dist.get_rank(), "dist_world": dist.get_world_size(),
            "environment": type(trainer.strategy.cluster_environment).__name__}


class GroupAtExit:
    """Writes ``out_dir/rank{rank}.exit``: whether the process group still existed when the
    interpreter began to finalize. Made before the run, so its exit handler runs after those
    the run registers (the library's release of the group)."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir
        self.rank: int | None = None
        atexit.register(self._write)

    def _write(self) -> None:
        if self.rank is not None:
            with open(os.path.join(self.out_dir, f"rank{self.rank}.exit"), "w") as f:
                f.write("up" if dist.is_initialized() else "destroyed")


class RankReport(pl.Callback):
    """A UniLab learner rank: its ranks, its collector's seed, the first rollout's start
    observations and the policy's final parameters, to ``out_dir/rank{global_rank}.pt``."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir
        self.first: dict[str, Any] | None = None
        self.at_exit = GroupAtExit(out_dir)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.first is None:
            self.first = {"seed": trainer.datamodule.collector.config.seed,
                          "first_obs": batch["obs"][0].clone()}

    def on_train_end(self, trainer, pl_module) -> None:
        self.at_exit.rank = trainer.global_rank
        params = torch.cat([p.detach().reshape(-1) for p in pl_module.policy.parameters()])
        torch.save({**where(trainer), **(self.first or {}), "params": params,
                    "steps": trainer.global_step},
                   os.path.join(self.out_dir, f"rank{trainer.global_rank}.pt"))


class Shards(pl.LightningDataModule):
    """The samples in order, each replica its share: the replica and the replica count from
    the strategy (a rank that is wrong reads the wrong samples)."""

    def __init__(self, samples: int, batch: int) -> None:
        super().__init__()
        self.samples, self.batch = samples, batch

    def train_dataloader(self):
        from omni_models import ToyData
        from torch.utils.data import DataLoader, DistributedSampler

        share = self.trainer.strategy.distributed_sampler_kwargs  # num_replicas, rank
        data = ToyData(self.samples)
        return DataLoader(data, batch_size=self.batch // share["num_replicas"],
                          sampler=DistributedSampler(data, shuffle=False, **share))


def omni(out_dir: str, pp: int, dp: int, steps: int, batch: int, samples: int) -> None:
    from omni_models import _Record, make_model

    from lightning_omni import OmniStrategy

    model = make_model(0)
    at_exit = GroupAtExit(out_dir)
    rec = _Record()
    strategy = OmniStrategy(pipeline_parallel=pp, data_parallel=dp)
    trainer = pl.Trainer(accelerator="cpu", num_nodes=2, devices=1, strategy=strategy,
                         max_steps=steps, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         use_distributed_sampler=False, callbacks=[rec])
    trainer.fit(model, datamodule=Shards(samples, batch))
    at_exit.rank = trainer.global_rank
    hosted = strategy.engine.hosted_param_ids()
    torch.save({**where(trainer), "losses": rec.losses,
                "params": {n: p.detach().clone() for n, p in model.named_parameters()
                           if id(p) in hosted}},
               os.path.join(out_dir, f"rank{trainer.global_rank}.pt"))


if __name__ == "__main__":
    torch.set_num_threads(1)
    kind, out, *sizes = sys.argv[1:]
    if kind != "omni":
        raise SystemExit(f"multinode_worker.py: unknown job {kind!r}")
    omni(out, *(int(s) for s in sizes))
