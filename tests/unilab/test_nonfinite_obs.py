"""NaN and inf in a rollout slot: refused by name (field, step, env) before the learner reads
the slot, so a refused slot leaves the weights, the normalizers and the policy version as
they were."""

from __future__ import annotations

import copy
import math

import lightning.pytorch as pl
import pytest
import torch
from inprocess_rollouts import FixedBatches, one_rollout

from lightning_unilab.learner.appo import APPOModule, check_finite_rollout
from lightning_unilab.learner.policy import ActorCritic
from lightning_unilab.runtime.rollout import RolloutSpec

FLOAT_FIELDS = ("obs", "critic_obs", "actions", "behaviour_logp", "behaviour_mean",
                "behaviour_log_std", "rewards", "final_critic_obs", "last_critic_obs")


@pytest.fixture(scope="module")
def pendulum():
    torch.manual_seed(0)
    policy = ActorCritic(4, 4, 1, actor_hidden=(16,), critic_hidden=(16,))
    spec = RolloutSpec(num_envs=8, horizon=8, obs_size=4, critic_size=4, action_size=1)
    return policy, [one_rollout(policy, num_envs=8, horizon=8, seed=s) for s in (0, 1)], spec


def _with(batch: dict, key: str, index: tuple[int, ...], value: float) -> dict:
    bad = dict(batch, **{key: batch[key].clone()})
    bad[key][index] = value
    return bad


@pytest.mark.parametrize("key", FLOAT_FIELDS)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_each_float_field_is_refused_naming_the_step_and_env(pendulum, key, value) -> None:
    _, (batch, _), _ = pendulum
    check_finite_rollout(batch)  # a collected slot passes
    x = batch[key]
    index = (5,) + (0,) * (x.dim() - 1) if key == "last_critic_obs" else (3, 5) + (0,) * (
        x.dim() - 2)
    bad = _with(batch, key, index, value)
    bad[key][-1] = value  # later rows too: the message names the first
    what = "NaN" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    where = "env 5" if key == "last_critic_obs" else "step 3, env 5"
    with pytest.raises(ValueError, match=rf"^batch\['{key}'\]: NaN or inf in the rollout "
                                         rf"\(slot \d+\): {where} holds {what} \(first at "
                                         rf"index \({', '.join(map(str, index))}\)\)"):
        check_finite_rollout(bad)


def test_flags_are_not_read(pendulum) -> None:
    _, (batch, _), _ = pendulum
    assert not batch["terminated"].is_floating_point()
    check_finite_rollout(dict(batch, terminated=batch["terminated"].clone()))


class _State(pl.Callback):
    """The learner's state after each slot: weights, normalizer buffers, policy version."""

    def __init__(self) -> None:
        self.after: list[dict] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.after.append({"state": copy.deepcopy(module.policy.state_dict()),
                           "version": module.policy_version})


@pytest.mark.parametrize("key", ["obs", "critic_obs", "rewards", "final_critic_obs"])
def test_a_refused_slot_leaves_the_learner_as_the_last_update_left_it(pendulum, key) -> None:
    policy, (good, other), spec = pendulum
    bad = _with(other, key, (2, 1) + (0,) * (other[key].dim() - 2), math.nan)
    module = APPOModule(policy=copy.deepcopy(policy), epochs=1, minibatches=2)
    seen = _State()
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         accelerator="cpu", devices=1, callbacks=[seen])
    with pytest.raises(ValueError, match=rf"^batch\['{key}'\]: NaN or inf .* step 2, env 1 "
                                         "holds NaN"):
        trainer.fit(module, FixedBatches([good, bad], spec))
    assert len(seen.after) == 1 and module.policy_version == seen.after[0]["version"] == 1
    now = module.policy.state_dict()
    for name, value in seen.after[0]["state"].items():  # normalizer statistics included
        assert torch.equal(now[name], value), name
        assert not value.is_floating_point() or torch.isfinite(value).all(), name
