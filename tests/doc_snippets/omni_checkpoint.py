"""Set-up for a page that reads checkpoints/last.ckpt of an OmniStrategy run: quickstart.py as
the quickstart page prints it, and a real sharded checkpoint of its model after one step on a
two-stage pipeline (2 CPU processes), saved the way the quickstart's Checkpoints section says."""

from __future__ import annotations

import sys
from pathlib import Path

import lightning.pytorch as pl
from quickstart_script import write_quickstart
from torch.utils.data import DataLoader

from lightning_omni import OmniStrategy

write_quickstart(Path.cwd())
sys.path.insert(0, str(Path.cwd()))
from quickstart import Captions, MyOmniModel  # noqa: E402  (written just above)

trainer = pl.Trainer(accelerator="cpu", devices=2, max_steps=1, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False,
                     strategy=OmniStrategy(pipeline_parallel=2, num_microbatches=4))
trainer.fit(MyOmniModel(), DataLoader(Captions(), batch_size=16))
trainer.save_checkpoint("checkpoints/last.ckpt")
