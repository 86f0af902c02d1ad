"""A CUDA learner's slot hand-off, checked on CPU: a slot goes back to the collector only after
its device copy's event; ordinary devices take Lightning's own transfer."""

import pytest
import torch
from test_data import TASK, Probe, _trainer

import lightning_unilab.runtime.data as data_module
from lightning_unilab.runtime.collector import Collector
from lightning_unilab.runtime.data import RolloutDataModule
from lightning_unilab.runtime.device_copy import copy_to_device


class _Event:
    def __init__(self, log: list, slot: int) -> None:
        self.log, self.slot = log, slot

    def synchronize(self) -> None:
        self.log.append(("copy done", self.slot))


def test_a_slot_goes_back_only_after_its_device_copy(tmp_path, monkeypatch):
    log: list[tuple[str, int]] = []
    dm = RolloutDataModule(TASK, num_envs=8, horizon=8, num_slots=3, pin_ring=False)

    def fake_copy(batch, device):  # what copy_to_device returns for CUDA: tensors and event
        assert device.type == "cuda"
        log.append(("copy started", dm._fetched))
        return dict(batch), _Event(log, dm._fetched)

    monkeypatch.setattr(data_module, "copy_to_device", fake_copy)
    to_cuda = RolloutDataModule.transfer_batch_to_device
    monkeypatch.setattr(dm, "transfer_batch_to_device",
                        lambda b, d, i: to_cuda(dm, b, torch.device("cuda"), i))
    release = Collector.release

    def logged_release(self, slot):
        log.append(("released", slot))
        release(self, slot)

    monkeypatch.setattr(Collector, "release", logged_release)
    _trainer(tmp_path, max_steps=5, enable_checkpointing=False).fit(Probe(), datamodule=dm)
    started = [i for i, (what, _) in enumerate(log) if what == "copy started"]
    assert len(started) == 5
    for i in started:
        slot = log[i][1]
        later = log[i + 1:]
        back = later.index(("released", slot)) if ("released", slot) in later else None
        if back is not None:  # every copied slot handed back waited for its copy first
            assert ("copy done", slot) in later[:back], log
    assert sum(what == "released" for what, _ in log) >= 4
    assert not dm._device_copies  # stop waited for the last ones


def test_cpu_learner_takes_lightnings_transfer():
    batch = {"obs": torch.ones(2, 3), "stats": {"seq": 1}}
    out, done = copy_to_device(batch, torch.device("cpu"))
    assert done is None and out["obs"] is batch["obs"] and out["stats"] == {"seq": 1}
    dm = RolloutDataModule(TASK, num_envs=4, horizon=4)
    moved = dm.transfer_batch_to_device(batch, torch.device("cpu"), 0)
    assert torch.equal(moved["obs"], batch["obs"]) and not dm._device_copies


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="page-locking the ring and publishing from a CUDA module need a GPU "
                           "(benchmarks/device_check_unilab.py runs them on one)")
def test_cuda_pinned_ring_and_publisher():
    import numpy as np

    from lightning_unilab.runtime.device_copy import DevicePublisher, PinnedRegion

    buf = np.zeros(1 << 20, np.uint8)
    region = PinnedRegion(buf)
    assert torch.from_numpy(buf).is_pinned()
    region.close()
    written = {}
    publisher = DevicePublisher(lambda state, v: written.update(v=v, w=state["w"].clone()),
                                torch.device("cuda"))
    publisher.publish({"w": torch.arange(4.0, device="cuda")}, 7)
    publisher.wait()
    assert written["v"] == 7 and torch.equal(written["w"], torch.arange(4.0))
