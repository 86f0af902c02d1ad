"""Set-up for a page that reads build/runs/g1_walk_flat/version_0/checkpoints/last.ckpt: the
G1 recipe's own run (recipes/unilab/g1_walk_flat.yaml through lightning_unilab.train, its logger
and ModelCheckpoint) cut to one small update: 8 environments, 8 steps, one epoch, no evaluation
episode. The checkpoint is the one the recipe writes, at its path, with the recipe's network."""

from __future__ import annotations

from pathlib import Path

import yaml

from lightning_unilab.train import main

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "unilab" / "g1_walk_flat.yaml"

recipe = yaml.safe_load(RECIPE.read_text(encoding="utf-8"))
trainer = recipe["trainer"]
trainer.update(max_time=None, max_steps=1, enable_progress_bar=False)
trainer["callbacks"] = [c for c in trainer["callbacks"]
                        if c["class_path"].endswith(".ModelCheckpoint")]
recipe["model"].update(epochs=1, minibatches=1)
recipe["data"].update(num_envs=8, horizon=8, mode="sync", num_slots=2)
Path("g1_walk_flat_one_update.yaml").write_text(yaml.safe_dump(recipe), encoding="utf-8")
main(["--config", "g1_walk_flat_one_update.yaml"])
