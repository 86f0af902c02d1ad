"""Sync mode in the learner's process (``runtime.inline``): the process collector's rollouts
and losses, bit for bit, without its process; chosen for a sync run with a CPU learner."""

import lightning.pytorch as pl
import pytest
import torch

from lightning_unilab.learner.appo import APPOModule
from lightning_unilab.runtime.collector import Collector
from lightning_unilab.runtime.data import RolloutDataModule
from lightning_unilab.runtime.inline import InlineCollector

TASK = "InvertedPendulum-v5"


class Record(pl.Callback):
    def __init__(self) -> None:
        self.losses: list[dict[str, float]] = []
        self.params: list[torch.Tensor] = []
        self.batches: list[dict] = []
        self.kinds: set[str] = set()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.kinds.add(type(trainer.datamodule.collector).__name__)
        # the update's logged losses, KL and lr (not its timings)
        self.losses.append({k: float(v) for k, v in trainer.callback_metrics.items()
                            if k.startswith("learner/") and not k.endswith(("_s", "per_s"))})
        self.params = [p.detach().clone() for p in module.policy.parameters()]
        self.batches.append({k: batch[k].clone() for k in ("obs", "actions", "rewards",
                                                           "behaviour_logp")}
                            | {"version": int(batch["stats"]["policy_version"]),
                               "env_steps": int(batch["stats"]["env_steps"])})


def _fit(tmp_path, inline, steps=20, **data):  # optimizer steps: 4 per rollout
    pl.seed_everything(0, verbose=False)
    dm = RolloutDataModule(TASK, num_envs=8, horizon=16, mode="sync", seed=3, inline=inline,
                           **data)
    module = APPOModule(actor_hidden=(16,), critic_hidden=(16,), epochs=2, minibatches=2)
    rec = Record()
    pl.Trainer(accelerator="cpu", max_steps=steps, logger=False, enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False, callbacks=[rec],
               default_root_dir=tmp_path).fit(module, datamodule=dm)
    assert dm.collector is None  # stopped at teardown
    return rec


def test_inline_sync_gives_the_process_collectors_rollouts_and_losses(tmp_path):
    torch.set_num_threads(1)
    inline, process = _fit(tmp_path, None), _fit(tmp_path, False)
    assert inline.kinds == {"InlineCollector"} and process.kinds == {"Collector"}
    assert len(inline.batches) == len(process.batches) > 2
    for i, (a, b) in enumerate(zip(inline.batches, process.batches, strict=True)):
        assert a["version"] == b["version"] == i  # each rollout from the latest weights
        assert a["env_steps"] == b["env_steps"]
        for key in ("obs", "actions", "rewards", "behaviour_logp"):
            assert torch.equal(a[key], b[key]), (i, key)
    assert "learner/kl" in inline.losses[-1] and inline.losses == process.losses
    assert all(torch.equal(a, b) for a, b in zip(inline.params, process.params, strict=True))


def test_inline_is_chosen_for_sync_on_a_cpu_learner_and_refused_for_async():
    dm = RolloutDataModule(TASK, num_envs=4, horizon=4, mode="sync")
    assert dm._collects_inline(learner_on_cpu=True)
    assert not dm._collects_inline(learner_on_cpu=False)  # a GPU learner: the process
    assert not RolloutDataModule(TASK, mode="sync", inline=False)._collects_inline(True)
    assert not RolloutDataModule(TASK, mode="async")._collects_inline(True)
    auto = RolloutDataModule(TASK, mode="auto", inline=True)
    auto.choose_mode(learner_on_cpu=False)  # auto on an accelerator: async
    with pytest.raises(ValueError, match="inline: collecting in the learner's process needs"):
        auto._collects_inline(False)
    with pytest.raises(ValueError, match="inline: .* got mode 'async'"):
        RolloutDataModule(TASK, mode="async", inline=True)
    with pytest.raises(TypeError, match="inline: expected True, False or None"):
        RolloutDataModule(TASK, mode="sync", inline="yes")


def test_inline_collector_refuses_async_and_collects_on_request():
    from lightning_unilab.learner.policy import ActorCritic
    from lightning_unilab.runtime.collector import CollectorConfig

    dm = RolloutDataModule(TASK, num_envs=4, horizon=5, mode="sync")
    spec = dm.rollout_spec
    policy = ActorCritic(spec.obs_size, spec.critic_size, spec.action_size, (8,), (8,))
    with pytest.raises(ValueError, match="mode: the inline collector"):
        InlineCollector(CollectorConfig(TASK, 4, 5, mode="async"), policy, spec)
    col = InlineCollector(dm.config, policy, spec)
    with pytest.raises(RuntimeError, match="not started"):
        col.acquire()
    col.start()
    try:
        assert col.acquire(timeout=0.0) == (None, 0.0)  # nothing waits: collected on request
        slots = [col.acquire()[0] for _ in range(3)]
        assert slots == [0, 1, 0]
        assert int(col.ring.arrays(0)["seq"]) == 2 and int(col.ring.arrays(1)["seq"]) == 1
        assert col.publish(policy) == 1 and int(col.ring.arrays(col.acquire()[0])
                                                ["policy_version"]) == 1
    finally:
        col.stop()
        col.stop()  # idempotent
    assert not col.running
    assert issubclass(Collector, object)  # the process collector stays importable beside it
