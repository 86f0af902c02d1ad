"""WarmStart: a new run starts from a checkpoint's policy, normalizers included; a resume or a
policy of another shape is not overwritten."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lightning_omnilab import safe_load
from lightning_unilab.learner.appo import APPOModule
from lightning_unilab.learner.policy import ActorCritic
from lightning_unilab.warm_start import WarmStart


def _module(seed: int, hidden: int = 16) -> APPOModule:
    torch.manual_seed(seed)
    policy = ActorCritic(5, 7, 2, (hidden,), (hidden,))
    with torch.no_grad():  # normalizer statistics differ too
        policy.obs_normalizer.mean.fill_(float(seed))
    return APPOModule(policy=policy)


def _checkpoint(module: APPOModule, path) -> str:
    safe_load.save({"state_dict": module.state_dict()}, path)
    return str(path)


def test_the_policy_and_its_normalizers_come_from_the_checkpoint(tmp_path):
    source, target = _module(1), _module(2)
    WarmStart(_checkpoint(source, tmp_path / "a.ckpt")).on_fit_start(
        SimpleNamespace(ckpt_path=None), target)
    want, got = source.policy.state_dict(), target.policy.state_dict()
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)


def test_a_resumed_run_keeps_the_policy_it_resumes(tmp_path):
    source, target = _module(1), _module(2)
    before = {k: v.clone() for k, v in target.policy.state_dict().items()}
    WarmStart(_checkpoint(source, tmp_path / "a.ckpt")).on_fit_start(
        SimpleNamespace(ckpt_path="last.ckpt"), target)
    assert all(torch.equal(before[k], v) for k, v in target.policy.state_dict().items())


def test_another_network_or_path_is_named(tmp_path):
    path = _checkpoint(_module(1, hidden=16), tmp_path / "a.ckpt")
    with pytest.raises(ValueError, match=r"a\.ckpt: policy\.actor\.0\.weight: shape \(16, 5\), "
                                         r"this run's is \(32, 5\)"):
        WarmStart(path).on_fit_start(SimpleNamespace(ckpt_path=None), _module(2, hidden=32))
    with pytest.raises(FileNotFoundError, match=r"checkpoint: no file at '.*missing\.ckpt'"):
        WarmStart(tmp_path / "missing.ckpt")
