"""RolloutDataModule under a real Trainer: slots held while in use, lifecycle, checkpoints, DDP."""

import os
import time

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from shm_probe import our_blocks as _shm

from lightning_omnilab import safe_load
from lightning_unilab.learner.policy import ActorCritic
from lightning_unilab.runtime.checkpoint_arrays import unpack
from lightning_unilab.runtime.data import RolloutDataModule

TASK = "InvertedPendulum-v5"


def _checksum(batch) -> float:
    return sum(float(v.double().sum()) for k, v in batch.items() if isinstance(v, torch.Tensor))


class Probe(pl.LightningModule):
    """The data module's contract: a ``policy`` built in setup, one publish per update.

    Each step checks that its zero-copy batch is not overwritten while the step runs (it sleeps
    long enough for the collector to fill other slots) and records what it saw.
    """

    def __init__(self, sleep: float = 0.0, fail_at: int | None = None, obs_size=None,
                 interrupt_at: int | None = None) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.sleep, self.fail_at, self.obs_size = sleep, fail_at, obs_size
        self.interrupt_at = interrupt_at
        self.policy = None
        self.seen: list[dict] = []

    def setup(self, stage: str) -> None:
        if self.policy is None:
            spec = self.trainer.datamodule.env_spec
            self.policy = ActorCritic(self.obs_size or spec.obs_size, spec.critic_size,
                                      spec.action_size, (16,), (16,))

    def configure_optimizers(self):
        return torch.optim.SGD(self.policy.parameters(), lr=1e-3)

    def training_step(self, batch, batch_idx):
        if batch_idx == self.fail_at:
            raise RuntimeError("planted failure in training_step")
        if batch_idx == self.interrupt_at:
            raise KeyboardInterrupt  # what Ctrl+C (SIGINT) raises in the main thread
        before = _checksum(batch)
        time.sleep(self.sleep)
        assert _checksum(batch) == before, "the slot changed under the training step"
        self.seen.append(dict(batch["stats"], shape=tuple(batch["obs"].shape)))
        opt = self.optimizers()
        loss = (-self.policy.distribution(batch["obs"]).log_prob(batch["actions"]).mean()
                + self.policy.value(batch["critic_obs"]).square().mean())
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        self.policy.update_normalizers(batch["obs"], batch["critic_obs"])
        self.trainer.datamodule.publish_policy(self.policy)


def _trainer(tmp_path, **kw):
    kw.setdefault("max_steps", 4)
    return pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=tmp_path, **kw)


def test_async_fit_holds_slots_in_use_and_cleans_up(tmp_path):
    dm = RolloutDataModule(TASK, num_envs=16, horizon=16, num_slots=3)
    probe = Probe(sleep=0.3)
    _trainer(tmp_path, enable_checkpointing=False).fit(probe, datamodule=dm)
    assert [s["shape"] for s in probe.seen] == [(16, 16, 4)] * 4
    assert [s["seq"] for s in probe.seen] == [0, 1, 2, 3]  # oldest first, none lost (block)
    versions = [s["policy_version"] for s in probe.seen]
    assert versions == sorted(versions) and versions[-1] <= 3
    assert dm.collector is None and dm.slots_read >= 4
    assert not _shm()


def test_read_newest_drops_the_slots_that_went_stale(tmp_path):
    dm = RolloutDataModule(TASK, num_envs=16, horizon=16, num_slots=3, read_newest=True)
    probe = Probe(sleep=0.3)  # the collector fills the other slots during each step
    _trainer(tmp_path, enable_checkpointing=False).fit(probe, datamodule=dm)
    seqs = [s["seq"] for s in probe.seen]
    assert seqs == sorted(set(seqs))
    # every rollout was either trained on or dropped, and some were dropped
    assert dm.slots_dropped == seqs[-1] + 1 - len(seqs) > 0
    assert probe.seen[-1]["slots_dropped"] == dm.slots_dropped
    assert not _shm()


def test_sync_fit_trains_on_the_latest_weights(tmp_path):
    dm = RolloutDataModule(TASK, num_envs=16, horizon=8, mode="sync", zero_copy=False,
                           num_slots=2)
    probe = Probe()
    _trainer(tmp_path, max_steps=3, enable_checkpointing=False).fit(probe, datamodule=dm)
    assert [s["policy_version"] for s in probe.seen] == [0, 1, 2]  # lag 0 at every step


def test_resume_continues_counters_and_versions(tmp_path):
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)  # saved when fit ends
    dm = RolloutDataModule(TASK, num_envs=16, horizon=16)
    first = Probe()
    _trainer(tmp_path, max_steps=2, callbacks=[ckpt]).fit(first, datamodule=dm)
    saved = dm.state_dict()
    assert saved["policy_version"] == 2 and saved["counters"]["seq"] >= 2
    dm2 = RolloutDataModule(TASK, num_envs=16, horizon=16)
    second = Probe()
    trainer = _trainer(tmp_path, max_steps=4, callbacks=[ModelCheckpoint(dirpath=tmp_path)])
    trainer.fit(second, datamodule=dm2, ckpt_path=str(tmp_path / "last.ckpt"))
    first_after = second.seen[0]
    # the collector's counters went on from its saved state, which may be ahead of the
    # learner's by the rollouts in the ring that the learner had not read
    (collection,) = safe_load.load(tmp_path / "last.ckpt")["RolloutDataModule"]["collections"]
    collected = unpack(collection)["rollout"]
    assert 0 <= collected["seq"] - saved["counters"]["seq"] <= dm.num_slots
    assert first_after["seq"] == collected["seq"]
    assert first_after["env_steps"] == collected["env_steps"] + 16 * 16
    assert first_after["policy_version"] == 2  # the resumed weights keep their version
    assert second.policy.obs_normalizer.count.item() == 4 * 16 * 16  # normalizer resumed


def test_errors_stop_the_collector(tmp_path):
    dm = RolloutDataModule(TASK, num_envs=8, horizon=8)
    with pytest.raises(RuntimeError, match="planted failure"):
        _trainer(tmp_path, enable_checkpointing=False).fit(Probe(fail_at=1), datamodule=dm)
    assert dm.collector is None and not _shm()
    # Ctrl+C: Lightning shuts down gracefully and exits; the collector is gone before that
    with pytest.raises(SystemExit):
        _trainer(tmp_path, enable_checkpointing=False).fit(Probe(interrupt_at=1), datamodule=dm)
    assert dm.collector is None and not _shm()
    # a network of the wrong size is refused before the collector starts
    with pytest.raises(ValueError, match="policy.obs_size: the network takes 5"):
        _trainer(tmp_path, enable_checkpointing=False).fit(Probe(obs_size=5), datamodule=dm)
    assert not _shm()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(num_envs=0), "num_envs"),
        (dict(horizon=0), "horizon"),
        (dict(collector_threads=1024), "collector threads"),
        (dict(task="NoSuchTask-v0"), "task"),
        (dict(num_slots=1), "num_slots"),
        (dict(mode="lockstep"), "mode"),
        (dict(zero_copy="no"), "zero_copy"),  # found by the fuzz door: bool("no") was True
        (dict(start_timeout=-1), "start_timeout"),
    ],
)
def test_impossible_configs_fail_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RolloutDataModule(**{"task": TASK, **kwargs})


def test_slot_larger_than_free_shared_memory_fails_in_setup(monkeypatch):
    import lightning_unilab.runtime.ring as ring

    monkeypatch.setattr(ring, "free_shm_bytes", lambda: 1 << 20)
    dm = RolloutDataModule(TASK, num_envs=4096, horizon=64)
    with pytest.raises(ValueError, match="shared memory.*lower num_envs, horizon or num_slots"):
        dm.setup("fit")


class RankProbe(Probe):
    def on_train_end(self) -> None:
        params = torch.cat([p.detach().reshape(-1) for p in self.policy.parameters()])
        torch.save({"first_obs": self.first_obs, "params": params},
                   os.path.join(self.out, f"rank{self.global_rank}.pt"))

    def training_step(self, batch, batch_idx):
        if batch_idx == 0:
            self.first_obs = batch["obs"][0].clone()
        return super().training_step(batch, batch_idx)


def test_ddp_ranks_run_their_own_collectors(tmp_path):
    """2 CPU ranks on gloo: different seeds per rank, gradients averaged (same weights)."""
    orphans_before = _shm(orphans=True)
    torch.manual_seed(0)
    dm = RolloutDataModule(TASK, num_envs=8, horizon=8, seed=5)
    probe = RankProbe()
    probe.out = str(tmp_path)
    trainer = _trainer(tmp_path, max_steps=2, devices=2, strategy="ddp_spawn",
                       enable_checkpointing=False)
    trainer.fit(probe, datamodule=dm)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert not torch.equal(r0["first_obs"], r1["first_obs"])  # seeds 5 and 6
    torch.testing.assert_close(r0["params"], r1["params"])
    assert not _shm(orphans=True) - orphans_before


def test_collector_threads_default_to_the_cores_the_mode_leaves_free():
    from lightning_unilab.runtime.collector import available_cpus
    from lightning_unilab.runtime.data import _auto_threads

    cpus = available_cpus()
    assert RolloutDataModule("InvertedPendulum-v5", mode="sync").config.threads == cpus
    # async with a CPU learner (the default here): the learner shares a core with the pool
    assert RolloutDataModule("InvertedPendulum-v5").config.threads == cpus
    # a GPU learner keeps one core for launching its kernels; ranks split the node first
    assert _auto_threads("async", 1, learner_on_cpu=False) == max(1, cpus - 1)
    assert _auto_threads("sync", 2, learner_on_cpu=False) == max(1, cpus // 2)
    assert RolloutDataModule("InvertedPendulum-v5", collector_threads=1,
                             mode="sync").config.threads == 1


def test_learner_threads_take_the_cores_only_where_the_collector_waits(monkeypatch):
    import lightning_unilab.runtime.data as data

    monkeypatch.setattr(data, "available_cpus", lambda: 8)
    assert data.learner_threads("sync") == 8
    assert data.learner_threads("sync", local_ranks=2) == 4  # each rank its share
    assert data.learner_threads("sync", local_ranks=16) == 1
    assert data.learner_threads("async") == 1
    assert data.learner_threads("sync", learner_on_cpu=False) == 1  # a GPU learner
    with pytest.raises(ValueError, match="mode"):
        data.learner_threads("both")


def test_auto_mode_is_sync_on_a_cpu_learner_and_async_on_an_accelerator():
    import lightning_unilab.runtime.data as data

    assert data.resolve_mode("auto", learner_on_cpu=True) == "sync"
    assert data.resolve_mode("auto", learner_on_cpu=False) == "async"
    for given in ("sync", "async"):  # a mode the user names is kept on either device
        assert data.resolve_mode(given, learner_on_cpu=True) == given
        assert data.resolve_mode(given, learner_on_cpu=False) == given
    with pytest.raises(ValueError, match="mode.*'auto'"):
        data.resolve_mode("fast")
    with pytest.raises(ValueError, match="mode"):
        RolloutDataModule(TASK, mode="fast")
    dm = RolloutDataModule(TASK, mode="auto")
    assert dm.config.mode == "sync"  # until the Trainer's device is known
    assert dm.choose_mode(learner_on_cpu=False) == "async" and dm.config.mode == "async"
    assert dm.choose_mode(learner_on_cpu=True) == "sync" and dm.config.mode == "sync"
    fixed = RolloutDataModule(TASK, mode="async")
    assert fixed.choose_mode(learner_on_cpu=True) == "async"


def test_auto_mode_runs_sync_under_a_cpu_trainer(tmp_path):
    dm = RolloutDataModule(TASK, num_envs=4, horizon=8, mode="auto", num_slots=2)
    probe = Probe()
    trainer = pl.Trainer(max_steps=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path)
    trainer.fit(probe, datamodule=dm)
    assert dm.config.mode == "sync"
    # sync: every slot was collected with the weights published just before it
    assert [s["policy_version"] for s in probe.seen] == list(range(len(probe.seen)))


def test_a_distributed_fit_releases_its_group_at_exit_under_a_users_module(monkeypatch):
    """A user's own LightningModule with this data module under DDP: the data module's
    teardown (called after a fit that did not raise) arms the group's release; one process
    arms nothing."""
    import lightning_unilab.runtime.data as data

    armed = []
    monkeypatch.setattr(data.ReleaseAtExit, "arm", lambda self: armed.append(self))
    dm = RolloutDataModule(TASK, num_envs=4, horizon=4)
    monkeypatch.setattr(data.dist, "is_initialized", lambda: False)
    dm.teardown("fit")
    assert armed == []
    monkeypatch.setattr(data.dist, "is_initialized", lambda: True)
    dm.teardown("fit")
    assert len(armed) == 1
