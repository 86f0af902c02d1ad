"""Learning smoke test: synchronous PPO through Trainer + RolloutDataModule balances the pendulum.

Sync mode makes the run deterministic for a seed (the collector waits for every update), so
"reaches the return within N updates" is a property of the code, not of the machine's load.
"""

import math

import lightning.pytorch as pl
import torch

from lightning_unilab.learner.appo import APPOModule
from lightning_unilab.runtime.data import RolloutDataModule

TARGET_RETURN = 500.0  # of 1000 possible; the run usually gets there in 25-40 updates
MAX_UPDATES = 80


class _Watch(pl.Callback):
    def __init__(self) -> None:
        self.returns: list[float] = []
        self.lags: list[float] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        ret = batch["stats"]["episode_return_mean"]
        self.returns.append(ret)
        self.lags.append(float(trainer.callback_metrics["learner/policy_lag"]))
        if math.isfinite(ret) and ret >= TARGET_RETURN:
            trainer.should_stop = True


def test_sync_ppo_learns_inverted_pendulum(tmp_path):
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    dm = RolloutDataModule("InvertedPendulum-v5", num_envs=32, horizon=32, mode="sync", seed=0)
    module = APPOModule(actor_hidden=(64, 64), critic_hidden=(64, 64), entropy_coef=0.0,
                        epochs=5, minibatches=2)
    watch = _Watch()
    steps_per_update = module.hparams.epochs * module.hparams.minibatches
    trainer = pl.Trainer(max_steps=MAX_UPDATES * steps_per_update, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[watch],
                         default_root_dir=tmp_path)
    trainer.fit(module, dm)
    best = max((r for r in watch.returns if math.isfinite(r)), default=float("nan"))
    assert best >= TARGET_RETURN, (
        f"mean episode return {best:.1f} after {len(watch.returns)} updates; returns "
        f"{[round(r) for r in watch.returns if math.isfinite(r)]}")
    assert watch.lags and max(watch.lags) == 0.0  # sync: every slot from the latest weights
    # one optimizer step per minibatch: Lightning's global_step counts them
    assert trainer.global_step == len(watch.returns) * steps_per_update
