"""APPO loss terms by hand, and APPOModule on fixed batches through a real Trainer."""

import math

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from inprocess_rollouts import FixedBatches, one_rollout
from torch.distributions import Normal, kl_divergence

from lightning_unilab.learner import losses
from lightning_unilab.learner.appo import (
    APPOModule,
    adapted_lr,
    denormals_flushed,
    flushes_denormals,
    next_actor_lr,
)
from lightning_unilab.learner.policy import ActorCritic, ValueNormalizer
from lightning_unilab.runtime.rollout import RolloutSpec

# ---------------------------------------------------------------- loss terms by hand


def test_ppo_surrogate_by_hand():
    ratio = torch.tensor([0.5, 1.0, 1.5, 1.1, 0.5])
    adv = torch.tensor([1.0, -2.0, 1.0, -1.0, -1.0])
    loss, frac = losses.ppo_surrogate(ratio, adv, 0.2)
    # min(rA, clip(r)A) = (0.5, -2, 1.2, -1.1, -0.8): the pessimistic side in every case
    assert loss.item() == pytest.approx(2.2 / 5)
    assert frac.item() == pytest.approx(3 / 5)


def test_weighted_surrogate_by_hand():
    ratio = torch.tensor([1.5, 0.5])
    adv = torch.tensor([1.0, -1.0])
    # min terms (1.2, -0.8); weights (0.5, 1): -(0.6 - 0.8) / 2
    loss, frac = losses.ppo_surrogate(ratio, adv, 0.2, torch.tensor([0.5, 1.0]))
    assert loss.item() == pytest.approx(0.1)
    assert frac.item() == pytest.approx(1.0)


def test_off_policy_weights_truncate_pi_prox_over_mu():
    prox, mu = torch.log(torch.tensor([0.2, 0.3])), torch.log(torch.tensor([0.4, 0.2]))
    torch.testing.assert_close(losses.off_policy_weights(prox, mu, 1.0), torch.tensor([0.5, 1.0]))
    torch.testing.assert_close(losses.off_policy_weights(prox, mu, 2.0), torch.tensor([0.5, 1.5]))
    with pytest.raises(ValueError, match="rho_bar"):
        losses.off_policy_weights(prox, mu, 0.0)


def test_policy_ratio_forms():
    logp, mu, target = (torch.log(torch.tensor([x])) for x in (0.3, 0.2, 0.25))
    assert losses.policy_ratio(logp, mu).item() == pytest.approx(1.5)
    assert losses.policy_ratio(logp, mu, target, "impact").item() == pytest.approx(1.2)
    assert losses.policy_ratio(logp, target, mu, "impact").item() == pytest.approx(1.2)
    # decoupled: clipped around the proximal policy, not the behaviour one
    assert losses.policy_ratio(logp, mu, target, "decoupled").item() == pytest.approx(1.2)
    assert losses.policy_ratio(logp, target, mu, "decoupled").item() == pytest.approx(1.5)
    for form in ("impact", "decoupled"):
        with pytest.raises(ValueError, match="target_logp"):
            losses.policy_ratio(logp, mu, None, form)


def test_clipped_value_loss_by_hand():
    values = torch.tensor([1.0, 2.0, 0.0])
    old = torch.tensor([0.5, 2.1, 0.0])
    targets = torch.tensor([2.0, 1.0, 0.05])
    # clipped values (0.7, 2.0, 0.0): errors (1.69, 1.0, .0025) against unclipped (1, 1, .0025)
    assert losses.clipped_value_loss(values, old, targets, 0.2).item() == pytest.approx(2.6925 / 3)
    assert losses.clipped_value_loss(values, old, targets, None).item() == pytest.approx(2.0025 / 3)


def test_entropy_and_kl_by_hand():
    log_std = torch.tensor([[0.0, math.log(2.0)]])
    want = 1 + math.log(2 * math.pi) + math.log(2.0)
    assert losses.gaussian_entropy(log_std).item() == pytest.approx(want)
    assert losses.gaussian_entropy(log_std).item() == pytest.approx(
        Normal(torch.zeros(2), log_std.exp()).entropy().sum().item())
    # KL(N(0,1) || N(1,2^2)) = log 2 + (1 + 1) / 8 - 1/2
    kl = losses.gaussian_kl(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1),
                     torch.full((1, 1), math.log(2.0)))
    assert kl.item() == pytest.approx(math.log(2) + 0.25 - 0.5)
    assert kl.item() == pytest.approx(
        kl_divergence(Normal(0.0, 1.0), Normal(1.0, 2.0)).item())
    # k3 estimator: r = (0.5, 2): ((r - 1) - log r) = (log 2 - .5, 1 - log 2), mean 0.25
    est = losses.approx_kl(torch.log(torch.tensor([0.5, 0.5])),
                           torch.log(torch.tensor([0.25, 1.0])))
    assert est.item() == pytest.approx(0.25)


def test_adapted_lr_rule():
    assert adapted_lr(1e-3, 0.03, 0.01, 1e-5, 1e-2) == pytest.approx(1e-3 / 1.5)
    assert adapted_lr(1e-3, 0.004, 0.01, 1e-5, 1e-2) == pytest.approx(1.5e-3)
    assert adapted_lr(1e-3, 0.01, 0.01, 1e-5, 1e-2) == 1e-3
    assert adapted_lr(1.2e-5, 1.0, 0.01, 1e-5, 1e-2) == 1e-5
    assert adapted_lr(9e-3, 0.0, 0.01, 1e-5, 1e-2) == 1e-2


def test_next_actor_lr_after_a_stopped_update_shrinks_by_the_square_root():
    # stopped at KL 0.04 against 0.01: the step was 2x too long, so half the lr
    assert next_actor_lr(1e-3, 0.0, 0.04, 0.01, 1e-6, 1e-2) == pytest.approx(5e-4)
    # barely over: at least /1.5 (a stop must lower the lr); far over: at most /10
    assert next_actor_lr(1e-3, 0.0, 0.011, 0.01, 1e-6, 1e-2) == pytest.approx(1e-3 / 1.5)
    assert next_actor_lr(1e-3, 0.0, 100.0, 0.01, 1e-6, 1e-2) == pytest.approx(1e-4)
    assert next_actor_lr(2e-6, 0.0, 100.0, 0.01, 1e-6, 1e-2) == 1e-6
    # not stopped: the band rule on the update's KL, whatever the (absent) overshoot
    assert next_actor_lr(1e-3, 0.004, None, 0.01, 1e-6, 1e-2) == pytest.approx(1.5e-3)
    assert next_actor_lr(1e-3, 0.01, None, 0.01, 1e-6, 1e-2) == 1e-3


def test_log_ratios_far_out_stay_finite():
    logp, other = torch.tensor([0.0, 0.0]), torch.tensor([-300.0, 300.0])
    for form in ("behaviour", "impact", "decoupled"):
        assert torch.isfinite(losses.policy_ratio(logp, other, other, form)).all()
    # exp(-600) underflows to 0 without bounds
    weights = losses.off_policy_weights(other, -other, 1.0)
    ratio = losses.policy_ratio(logp, other, other, "decoupled")
    loss, _ = losses.ppo_surrogate(ratio, torch.tensor([-1.0, 0.0]), 0.2, weights)
    assert torch.isfinite(loss)  # was 0 * -inf = NaN: the NaN loss of a collapsed std


def test_value_normalizer_keeps_values_when_its_statistics_move():
    torch.manual_seed(0)
    policy = ActorCritic(3, 3, 1, actor_hidden=(8,), critic_hidden=(8,))
    x = torch.randn(50, 3)
    before = policy.value(x).detach()
    norm = policy.value_normalizer
    norm.update_preserving(policy.critic[-1], 100.0, torch.tensor([50.0]), torch.tensor([400.0]))
    torch.testing.assert_close(policy.value(x), before, atol=1e-4, rtol=1e-5)
    assert norm.mean.item() == 50.0 and norm.std().item() == 20.0
    torch.testing.assert_close(policy.normalized_value(x), (before - 50.0) / 20.0, atol=1e-5,
                               rtol=1e-5)
    norm.update_preserving(policy.critic[-1], 300.0, torch.tensor([-10.0]), torch.tensor([9.0]))
    torch.testing.assert_close(policy.value(x), before, atol=1e-4, rtol=1e-5)
    assert norm.count.item() == 400.0
    assert norm.mean.item() == pytest.approx((100 * 50 - 300 * 10) / 400)


def test_value_normalizer_is_the_identity_until_used():
    norm = ValueNormalizer()
    v = torch.tensor([3.0, -7.5])
    assert torch.equal(norm.normalize(v), v) and torch.equal(norm.denormalize(v), v)


def test_obs_normalizer_clip_and_variance_floor_closed_form():
    # statistics: mean (1, 0), variance (4, 0): the second input never moved
    policy = ActorCritic(2, 2, 1, actor_hidden=(), critic_hidden=())
    policy.obs_normalizer.update_moments(10, torch.tensor([1.0, 0.0]), torch.tensor([4.0, 0.0]))
    x = torch.tensor([[21.0, 0.5]])
    z = policy.obs_normalizer(x)
    assert z.tolist() == [[5.0, 5.0]]  # (21-1)/2 = 10 and 0.5/1e-4 = 5000, both clipped at 5
    floored = ActorCritic(2, 2, 1, actor_hidden=(), critic_hidden=(), obs_clip=None,
                          obs_eps=1e-4)
    floored.obs_normalizer.update_moments(10, torch.tensor([1.0, 0.0]), torch.tensor([4.0, 0.0]))
    z = floored.obs_normalizer(x)[0]
    assert z[0].item() == pytest.approx(20.0 / math.sqrt(4.0 + 1e-4))  # not clipped
    assert z[1].item() == pytest.approx(50.0)  # 0.5 / sqrt(1e-4): the std's floor is 0.01
    assert floored.critic_normalizer.clip is None and floored.critic_normalizer.eps == 1e-4


@pytest.mark.parametrize(("name", "value"), [("obs_clip", 0.0), ("obs_eps", -1e-8),
                                             ("obs_clip", "5")])
def test_obs_normalizer_arguments_checked(name, value):
    with pytest.raises((ValueError, TypeError), match=name):
        APPOModule(**{name: value})


def test_module_builds_its_policy_with_the_normalizer_settings():
    module = APPOModule(actor_hidden=(4,), critic_hidden=(4,), obs_size=3, action_size=1,
                        obs_clip=None, obs_eps=1e-4)
    module.setup("fit")
    assert module.policy.obs_normalizer.clip is None
    assert module.policy.critic_normalizer.eps == 1e-4


@pytest.mark.parametrize("flush", [True, False])
@pytest.mark.parametrize("fails", [False, True])
def test_each_update_flushes_denormals_and_the_thread_gets_its_mode_back(pendulum_batch, flush,
                                                                         fails):
    policy, batch, spec = pendulum_batch
    module = APPOModule(policy=_copy(policy), flush_denormal=flush, **SMALL)
    modes: list[bool] = []
    loss_terms = module.loss_terms

    def recording(slot, idx=None):
        modes.append(flushes_denormals())
        if fails and len(modes) == 2:
            raise RuntimeError("planted")
        return loss_terms(slot, idx)

    module.loss_terms = recording
    torch.set_flush_denormal(False)
    try:
        if fails:
            with pytest.raises(RuntimeError, match="planted"):
                _fit(module, FixedBatches([batch], spec))
        else:
            _fit(module, FixedBatches([batch], spec))
        after = flushes_denormals()
    finally:
        torch.set_flush_denormal(False)
    assert modes and set(modes) == {flush}  # every minibatch of the update
    assert not after  # the mode the fit found, also when the update raised


def test_denormals_flushed_scopes_the_mode_to_its_block():
    denormal = torch.tensor([1e-40])  # below float32's smallest normal, 1.2e-38
    for outer in (False, True):
        torch.set_flush_denormal(outer)
        try:
            with denormals_flushed():
                assert (denormal * 1.0).item() == 0.0
            assert flushes_denormals() is outer
            with denormals_flushed(enabled=False):
                assert flushes_denormals() is outer
            with pytest.raises(KeyError), denormals_flushed():
                raise KeyError("inside")
            assert flushes_denormals() is outer
        finally:
            torch.set_flush_denormal(False)
    assert (denormal * 1.0).item() != 0.0
    with pytest.raises(ValueError, match="flush_denormal"):
        APPOModule(flush_denormal="yes")


# ---------------------------------------------------------------- the module's targets


def _linear_critic_policy() -> ActorCritic:
    """V(x) = x[0] exactly: a linear critic, no normalization."""
    policy = ActorCritic(2, 2, 1, actor_hidden=(), critic_hidden=(), normalize_obs=False)
    with torch.no_grad():
        policy.critic[0].weight.copy_(torch.tensor([[1.0, 0.0]]))
        policy.critic[0].bias.zero_()
    return policy


def _hand_batch(policy: ActorCritic, terminated0: bool) -> dict:
    """T=2, N=1; V(s_0)=1, V(s_1)=2, V(last)=4; step 0 ends (V(final)=10), rewards 1."""
    obs = torch.tensor([[[0.3, -0.2]], [[0.1, 0.4]]])
    actions = torch.tensor([[[0.5]], [[-0.1]]])
    dist = policy.distribution(obs)
    return {
        "obs": obs,
        "critic_obs": torch.tensor([[[1.0, 0.0]], [[2.0, 0.0]]]),
        "actions": actions,
        "behaviour_logp": dist.log_prob(actions).sum(-1).detach(),  # on-policy: rho = 1
        "behaviour_mean": dist.mean.detach(),
        "behaviour_log_std": dist.stddev.log().detach(),
        "rewards": torch.tensor([[1.0], [1.0]]),
        "terminated": torch.tensor([[terminated0], [False]]),
        "truncated": torch.tensor([[not terminated0], [False]]),
        "final_critic_obs": torch.tensor([[[10.0, 0.0]], [[99.0, 0.0]]]),
        "last_critic_obs": torch.tensor([[4.0, 0.0]]),
        "stats": {"policy_version": 0},
    }


@pytest.mark.parametrize("terminated0, want0", [(False, 1 + 0.5 * 10.0), (True, 1.0)])
def test_prepare_bootstraps_truncation_not_termination(terminated0, want0):
    policy = _linear_critic_policy()
    module = APPOModule(policy=policy, gamma=0.5, gae_lambda=1.0, normalize_advantages=False)
    slot = module.prepare(_hand_batch(policy, terminated0))
    # step 1: r + gamma V(last) = 1 + 0.5 * 4; step 0 ends: truncated -> + gamma V(final)
    torch.testing.assert_close(slot.returns, torch.tensor([want0, 3.0]))
    torch.testing.assert_close(slot.advantages, torch.tensor([want0 - 1.0, 1.0]))
    torch.testing.assert_close(slot.old_values, torch.tensor([1.0, 2.0]))
    assert slot.behaviour_kl == pytest.approx(0.0, abs=1e-7)



def test_gae_estimator_ignores_the_lag_in_targets_not_in_the_surrogate():
    """advantage_estimator="gae": a lagged slot gets the on-policy hand values (above); its
    surrogate still carries the decoupled weights min(1, pi_prox / mu)."""
    policy = _linear_critic_policy()
    batch = _hand_batch(policy, terminated0=False)
    lagged = batch | {"behaviour_logp": batch["behaviour_logp"] + 0.7}  # pi / mu = e^-0.7
    modules = {estimator: APPOModule(policy=policy, gamma=0.5, gae_lambda=1.0,
                                     normalize_advantages=False, advantage_estimator=estimator)
               for estimator in ("gae", "vtrace", "auto")}
    slots = {estimator: module.prepare(lagged) for estimator, module in modules.items()}
    torch.testing.assert_close(slots["gae"].returns, torch.tensor([6.0, 3.0]))
    torch.testing.assert_close(slots["gae"].advantages, torch.tensor([5.0, 1.0]))
    # V-trace scales each TD error by rho = e^-0.7: v_1 = 2 + rho * 1, v_0 = 1 + rho * 5
    rho = torch.tensor(-0.7).exp()
    torch.testing.assert_close(slots["vtrace"].returns, torch.stack([1 + 5 * rho, 2 + rho]))
    with torch.no_grad():
        terms = modules["gae"].loss_terms(slots["gae"])
    assert terms["policy_loss"].item() == pytest.approx(-(rho * 6.0 / 2).item(), rel=1e-5)
    # "auto": V-trace for a slot of the current weights (lag 0 here), GAE for an older one
    torch.testing.assert_close(slots["auto"].returns, slots["vtrace"].returns)
    modules["auto"].policy_version = 1  # the slot is now one update old
    torch.testing.assert_close(modules["auto"].prepare(lagged).returns, slots["gae"].returns)

# ---------------------------------------------------------------- updates through a Trainer

SMALL = {"actor_hidden": (32, 32), "critic_hidden": (32, 32), "epochs": 2, "minibatches": 2}


def _fit(module: APPOModule, dm: FixedBatches, **kwargs) -> pl.Trainer:
    kwargs.setdefault("logger", False)
    trainer = pl.Trainer(max_epochs=1, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         accelerator="cpu", devices=1, **kwargs)
    trainer.fit(module, dm)
    return trainer


@pytest.fixture(scope="module")
def pendulum_batch():
    torch.manual_seed(0)
    policy = ActorCritic(4, 4, 1, actor_hidden=(32, 32), critic_hidden=(32, 32))
    batch = one_rollout(policy, num_envs=16, horizon=16)
    spec = RolloutSpec(num_envs=16, horizon=16, obs_size=4, critic_size=4, action_size=1)
    return policy, batch, spec


def test_one_update_changes_parameters_and_lowers_the_loss(pendulum_batch):
    policy, batch, spec = pendulum_batch
    torch.manual_seed(1)
    # no trust region: whether it undoes the actor's steps depends on the minibatch order
    module = APPOModule(policy=_copy(policy), lr=3e-3, adaptive_lr=False, kl_stop=None, **SMALL)
    before_params = [p.detach().clone() for p in module.policy.parameters()]
    slot = module.prepare(batch)
    with torch.no_grad():
        before = module.loss_terms(slot)
    dm = FixedBatches([batch], spec)
    _fit(module, dm)
    with torch.no_grad():
        after = module.loss_terms(slot)
    assert after["loss"] < before["loss"]
    assert after["value_loss"] < before["value_loss"]
    changed = [not torch.equal(a, b) for a, b in zip(before_params, module.policy.parameters(),
                                                     strict=True)]
    assert all(changed)
    assert module.policy_version == 1 and dm.published == [1]
    # the slot's observations are now in the normalizer's statistics
    assert module.policy.obs_normalizer.count.item() == 16 * 16
    torch.testing.assert_close(module.policy.obs_normalizer.mean,
                               batch["obs"].reshape(-1, 4).double().mean(0))


@pytest.mark.parametrize("reshuffle", [True, False])
def test_minibatch_partition_per_epoch_or_per_update(pendulum_batch, reshuffle):
    policy, batch, spec = pendulum_batch
    module = APPOModule(policy=_copy(policy), reshuffle_each_epoch=reshuffle, kl_stop=None,
                        **{**SMALL, "epochs": 3, "minibatches": 4})
    seen: list[frozenset[int]] = []
    loss_terms = module.loss_terms

    def recording(slot, idx=None):
        if idx is not None:
            seen.append(frozenset(idx.tolist()))
        return loss_terms(slot, idx)

    module.loss_terms = recording
    _fit(module, FixedBatches([batch], spec))
    assert len(seen) == 12 and all(len(mb) == 16 * 16 // 4 for mb in seen)
    epochs = [seen[i:i + 4] for i in (0, 4, 8)]
    for parts in epochs:  # each pass covers the slot once
        assert frozenset().union(*parts) == frozenset(range(256))
    same = epochs[0] == epochs[1] == epochs[2]
    assert same is not reshuffle


def _copy(policy: ActorCritic) -> ActorCritic:
    import copy
    return copy.deepcopy(policy)


class _Params(pl.Callback):
    """Parameters after each training batch."""

    def __init__(self) -> None:
        self.after: list[list[torch.Tensor]] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.after.append([p.detach().clone() for p in module.policy.parameters()])


def test_max_policy_lag_skips_stale_slots(pendulum_batch):
    policy, batch, spec = pendulum_batch
    # three slots all made by version 0: lags 0, 1, 2 as the learner advances
    module = APPOModule(policy=_copy(policy), max_policy_lag=1, **SMALL)
    dm = FixedBatches([batch, batch, batch], spec)
    params = _Params()
    _fit(module, dm, callbacks=[params])
    assert module.skipped_slots == 1
    assert module.policy_version == 2 and dm.published == [1, 2]
    assert all(torch.equal(a, b) for a, b in zip(params.after[1], params.after[2], strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(params.after[0], params.after[1],
                                                     strict=True))


def _lagged(policy: ActorCritic, batch: dict) -> dict:
    """The batch as if a policy with moved actor weights had acted (a lagged slot)."""
    behaviour = _copy(policy)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in behaviour.actor.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
        dist = behaviour.distribution(batch["obs"])
    return batch | {"behaviour_logp": dist.log_prob(batch["actions"]).sum(-1),
                    "behaviour_mean": dist.mean, "behaviour_log_std": dist.stddev.log()}


def test_decoupled_ratio_clips_around_the_pre_update_policy(pendulum_batch):
    policy, batch, _ = pendulum_batch
    lagged = _lagged(policy, batch)
    terms = {}
    for form in ("decoupled", "behaviour"):
        module = APPOModule(policy=_copy(policy), ratio_form=form, **SMALL)
        slot = module.prepare(lagged)
        with torch.no_grad():
            terms[form] = module.loss_terms(slot)
    # before any step pi = pi_prox: nothing is clipped, and the surrogate is -mean(w A)
    assert terms["decoupled"]["clip_fraction"].item() == 0.0
    w = (slot.target_logp - slot.behaviour_logp).exp().clamp(max=1.0)
    assert terms["decoupled"]["policy_loss"].item() == pytest.approx(
        -(w * slot.advantages).mean().item(), rel=1e-5)
    assert terms["behaviour"]["clip_fraction"].item() > 0.3


def test_ratio_forms_agree_on_policy(pendulum_batch):
    policy, batch, _ = pendulum_batch
    values = []
    for form in ("decoupled", "behaviour", "impact"):
        module = APPOModule(policy=_copy(policy), ratio_form=form, **SMALL)
        with torch.no_grad():
            values.append(module.loss_terms(module.prepare(batch))["loss"].item())
    assert values[0] == pytest.approx(values[1], rel=1e-5)
    assert values[0] == pytest.approx(values[2], rel=1e-5)


def test_adaptive_lr_moves_the_actor_group_only(pendulum_batch):
    policy, batch, spec = pendulum_batch
    module = APPOModule(policy=_copy(policy), lr=0.05, critic_lr=2e-3, desired_kl=1e-4,
                        **SMALL)
    _fit(module, FixedBatches([batch], spec))
    actor, critic = module._optimizer().param_groups
    assert actor["lr"] < 0.05  # a huge step overshoots the KL target: the actor's lr falls
    assert critic["lr"] == 2e-3
    ids = [id(p) for g in (actor, critic) for p in g["params"]]
    assert sorted(ids) == sorted(id(p) for p in module.policy.parameters())
    assert id(module.policy.log_std) in {id(p) for p in actor["params"]}


def test_per_minibatch_lr_moves_before_each_step_after_the_first(pendulum_batch):
    """rsl_rl's rule: each minibatch's KL moves the lr for its own step; the update's first
    minibatch (KL 0) leaves it. 2 epochs x 2 minibatches of huge steps: three falls by 1.5."""
    policy, batch, spec = pendulum_batch
    seen: list[float] = []

    class Spy(APPOModule):
        def _set_lr(self, lr: float) -> None:
            seen.append(lr)
            super()._set_lr(lr)

    module = Spy(policy=_copy(policy), lr=0.05, desired_kl=1e-4, kl_stop=None,
                 adapt_lr_every="minibatch", **SMALL)
    trainer = _fit(module, FixedBatches([batch], spec))
    assert seen == pytest.approx([0.05 / 1.5, 0.05 / 1.5**2, 0.05 / 1.5**3])
    assert module._lr() == pytest.approx(0.05 / 1.5**3)
    assert trainer.callback_metrics["learner/actor_steps"].item() == 4.0
    with pytest.raises(ValueError, match="adapt_lr_every"):
        APPOModule(adapt_lr_every="epoch")


def test_trust_region_undoes_the_step_that_crosses_it(pendulum_batch):
    policy, batch, spec = pendulum_batch
    module = APPOModule(policy=_copy(policy), lr=0.05, desired_kl=1e-4, kl_stop=2.0, **SMALL)
    critic_before = [p.detach().clone() for p in module.policy.critic.parameters()]
    trainer = _fit(module, FixedBatches([batch], spec))
    logged = trainer.callback_metrics
    # a huge lr leaves the region at the first step: undone, the actor is where it started
    assert logged["learner/kl_stopped"].item() == 1.0
    assert logged["learner/actor_steps"].item() == 0.0
    assert logged["learner/kl"].item() <= 2e-4
    for a, b in zip(module.policy.actor.parameters(), policy.actor.parameters(), strict=True):
        assert torch.equal(a, b)
    # ... while the critic trained on, and the next update gets a much smaller lr
    assert not all(torch.equal(a, b) for a, b in zip(module.policy.critic.parameters(),
                                                     critic_before, strict=True))
    assert module._lr() < 0.05 / 1.5


def test_trust_region_keeps_the_steps_inside_it(pendulum_batch):
    policy, batch, spec = pendulum_batch
    module = APPOModule(policy=_copy(policy), lr=3e-3, desired_kl=0.01, kl_stop=2.0,
                        adaptive_lr=False, epochs=8, minibatches=4,
                        actor_hidden=(32, 32), critic_hidden=(32, 32))
    trainer = _fit(module, FixedBatches([batch], spec))
    logged = trainer.callback_metrics
    steps = logged["learner/actor_steps"].item()
    assert 0 < steps < 32 and logged["learner/kl_stopped"].item() == 1.0
    # the pre-update policy: the starting weights under the statistics the update used
    start = _copy(policy)
    start.obs_normalizer.load_state_dict(module.policy.obs_normalizer.state_dict())
    with torch.no_grad():
        old, new = start.distribution(batch["obs"]), module.policy.distribution(batch["obs"])
        kl = losses.gaussian_kl(old.mean, old.stddev.log(), new.mean, new.stddev.log())
    assert kl.item() == pytest.approx(logged["learner/kl"].item(), rel=1e-4)
    assert kl.item() <= 0.02
    assert module._lr() == 3e-3  # adaptive_lr off: the region still holds, the lr stays


def test_value_loss_is_in_the_critics_units(pendulum_batch):
    policy, batch, _ = pendulum_batch
    module = APPOModule(policy=_copy(policy), value_clip=None)
    slot = module.prepare(batch)
    norm = module.policy.value_normalizer
    norm.update_preserving(module.policy.critic[-1], slot.size, slot.returns.double().mean()[None],
                           slot.returns.double().var(unbiased=False)[None])
    with torch.no_grad():
        terms = module.loss_terms(slot)
        z = module.policy.normalized_value(slot.critic_obs)
    want = (z - (slot.returns - norm.mean.float()) / norm.std().float()).square().mean()
    torch.testing.assert_close(terms["value_loss"], want)
    assert norm.std().item() > 2.0  # the raw MSE would be std^2 times larger


def test_target_network_follows_the_policy(pendulum_batch):
    policy, batch, spec = pendulum_batch
    module = APPOModule(policy=_copy(policy), target_network=True, target_tau=0.5,
                        ratio_form="impact", **SMALL)
    start = [p.detach().clone() for p in policy.parameters()]
    _fit(module, FixedBatches([batch], spec))
    target = module._target[0]
    for t, p, s in zip(target.parameters(), module.policy.parameters(), start, strict=True):
        torch.testing.assert_close(t, 0.5 * (p + s))
    assert not any(t.requires_grad for t in target.parameters())


def test_task_size_mismatch_names_both(pendulum_batch):
    _, batch, spec = pendulum_batch
    module = APPOModule(obs_size=5, **SMALL)
    with pytest.raises(ValueError, match=r"obs_size: the module was given 5 .* has 4"):
        _fit(module, FixedBatches([batch], spec))


def test_bad_hyperparameters_name_the_argument():
    with pytest.raises(ValueError, match="gae_lambda"):
        APPOModule(gae_lambda=1.5)
    with pytest.raises(ValueError, match="ratio_form"):
        APPOModule(ratio_form="ppo")
    with pytest.raises(ValueError, match="advantage_estimator"):
        APPOModule(advantage_estimator="retrace")
    with pytest.raises(ValueError, match="max_policy_lag"):
        APPOModule(max_policy_lag=-1)
    with pytest.raises(ValueError, match="minibatches"):
        APPOModule(minibatches=0)
    # found by the fuzz door: these failed in setup, naming nothing
    with pytest.raises(TypeError, match="actor_hidden: expected a list of layer widths"):
        APPOModule(actor_hidden=None)
    with pytest.raises(ValueError, match="critic_hidden: expected an int >= 1"):
        APPOModule(critic_hidden=(8, -2))
    with pytest.raises(ValueError, match="activation"):
        APPOModule(activation="gelu?")


def test_hyperparameters_follow_the_shared_rules():
    """The shared validators: a bool is not a count, a numpy integer is, bounds are named."""
    with pytest.raises(TypeError, match=r"^epochs: expected an int >= 1, got True$"):
        APPOModule(epochs=True)
    with pytest.raises(TypeError, match=r"^max_policy_lag: expected an int >= 0 or None"):
        APPOModule(max_policy_lag=1.0)
    with pytest.raises(ValueError, match=r"^lr_max: expected a number >= 0.001, got 0.0001$"):
        APPOModule(lr=1e-4, lr_min=1e-3, lr_max=1e-4)
    assert APPOModule(epochs=np.int64(2), max_policy_lag=0).hparams.max_policy_lag == 0


def test_checkpoint_keeps_version_and_normalizer(pendulum_batch, tmp_path):
    policy, batch, spec = pendulum_batch
    module = APPOModule(policy=_copy(policy), **SMALL)
    trainer = _fit(module, FixedBatches([batch, batch], spec))
    path = tmp_path / "appo.ckpt"
    trainer.save_checkpoint(path)
    loaded = APPOModule.load_from_checkpoint(path)
    assert loaded.policy_version == 2
    torch.testing.assert_close(loaded.policy.obs_normalizer.mean,
                               module.policy.obs_normalizer.mean)
    assert loaded.policy.obs_normalizer.count.item() == 2 * 16 * 16
    for a, b in zip(loaded.policy.parameters(), module.policy.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_loss_is_surrogate_plus_value_minus_entropy_bonus(pendulum_batch):
    policy, batch, _ = pendulum_batch
    module = APPOModule(policy=_copy(policy), value_loss_coef=0.7, entropy_coef=0.3)
    terms = module.loss_terms(module.prepare(batch))
    want = terms["policy_loss"] + 0.7 * terms["value_loss"] - 0.3 * terms["entropy"]
    torch.testing.assert_close(terms["loss"], want)
    # the bonus pulls the log std up: its gradient on log_std is -0.3 per action dim
    module.policy.zero_grad()
    (-0.3 * terms["entropy"]).backward()
    torch.testing.assert_close(module.policy.log_std.grad, torch.tensor([-0.3]))


def test_scalar_std_parameter_closed_form(pendulum_batch):
    policy, batch, spec = pendulum_batch
    module = APPOModule(actor_hidden=(4,), critic_hidden=(4,), obs_size=4, action_size=1,
                        init_log_std=math.log(0.5), std_param="scalar", entropy_coef=0.3)
    module.setup("fit")
    noise = module.policy.noise_parameter()
    assert not hasattr(module.policy, "log_std") and noise is module.policy.std
    torch.testing.assert_close(noise.detach(), torch.tensor([0.5]))
    dist = module.policy.distribution(torch.zeros(3, 4))
    torch.testing.assert_close(dist.stddev, torch.full((3, 1), 0.5))
    terms = module.loss_terms(module.prepare(batch))
    module.policy.zero_grad()
    (-0.3 * terms["entropy"]).backward()
    # d(-0.3 * log std)/d std = -0.3 / std = -0.6 at std 0.5
    torch.testing.assert_close(noise.grad, torch.tensor([-0.6]))
    with torch.no_grad():
        noise.fill_(-1.0)  # a step through 0: the floor acts, no NaN
    assert torch.isfinite(module.policy.distribution(torch.zeros(1, 4)).stddev).all()
    with torch.no_grad():
        noise.fill_(0.5)
    _fit(module, FixedBatches([batch], spec))  # the optimizer trains it with the actor
    assert noise.item() != 0.5 and math.isfinite(noise.item())
    assert id(noise) in {id(p) for p in module._optimizer().param_groups[0]["params"]}
    with pytest.raises(ValueError, match="std_param"):
        APPOModule(std_param="exp")


class _CheckRanksAgree(pl.Callback):
    """After fit, on every rank: the same weights, lr and observation statistics, and those
    statistics are those of both ranks' slots together."""

    def on_train_end(self, trainer, module):
        strategy = trainer.strategy
        flat = torch.cat([p.detach().reshape(-1) for p in module.policy.parameters()])
        norm = module.policy.obs_normalizer
        mine = torch.cat([flat, norm.mean.float(), norm.var.float(),
                          torch.tensor([module._lr()])])
        every = strategy.all_gather(mine)
        assert every.shape[0] == 2
        torch.testing.assert_close(every[0], every[1], rtol=0, atol=0)
        obs = strategy.all_gather(self.obs).reshape(-1, norm.mean.numel()).double()
        torch.testing.assert_close(norm.mean, obs.mean(0))
        torch.testing.assert_close(norm.var, obs.var(0, unbiased=False))
        assert norm.count.item() == obs.shape[0]

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.obs = batch["obs"].clone()


def test_two_ddp_learners_stay_identical(pendulum_batch):
    policy, batch, spec = pendulum_batch
    other = one_rollout(policy, num_envs=16, horizon=16, seed=7)  # rank 1 sees other data
    module = APPOModule(policy=_copy(policy), **SMALL)
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         accelerator="cpu", devices=2, strategy="ddp_spawn",
                         callbacks=[_CheckRanksAgree()])
    trainer.fit(module, FixedBatches([batch, other], spec))


def test_non_finite_rollout_is_an_error_not_a_silent_nan(pendulum_batch):
    policy, batch, _ = pendulum_batch
    module = APPOModule(policy=_copy(policy))
    bad = dict(batch, rewards=batch["rewards"].clone())
    bad["rewards"][3, 2] = float("nan")
    with pytest.raises(ValueError, match=r"batch\['rewards'\]: NaN or inf"):
        module.prepare(bad)


@pytest.mark.parametrize("every", [1, 2])
def test_untracked_metrics_reach_the_logger_at_lightnings_steps(pendulum_batch, tmp_path, every):
    """Metrics outside ``TRACKED_METRICS`` skip ``self.log`` but land in the logger at the
    very steps (and only on the ``log_every_n_steps`` steps) of the tracked ones."""
    import csv

    from lightning_unilab.learner.appo import TRACKED_METRICS

    policy, batch, spec = pendulum_batch
    module = APPOModule(policy=_copy(policy), **SMALL)
    logger = pl.loggers.CSVLogger(tmp_path, name="run", version=0)
    trainer = _fit(module, FixedBatches([batch] * 4, spec), logger=logger,
                   log_every_n_steps=every)
    with open(tmp_path / "run" / "version_0" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    steps = {k: sorted({int(r["step"]) for r in rows if r.get(k)}) for k in rows[0]}
    assert "learner/update_s" not in TRACKED_METRICS and "learner/kl" in TRACKED_METRICS
    assert steps["learner/update_s"] == steps["learner/kl"] != []
    assert len(steps["learner/kl"]) == 4 // every
    assert "learner/update_s" not in trainer.callback_metrics  # not tracked by Lightning
    assert "learner/kl" in trainer.callback_metrics


def test_default_trace_weights_keep_their_mean_on_lagged_data():
    """Samples drawn from the collector's policy mu, weighed for the learner's pi: the weights
    pi/mu average 1 (E_mu[pi/mu] = 1); capped at 1 they average 1 - TV(mu, pi), so every trace
    of lagged data shrinks. The default c_bar keeps the mean (docs/unilab/appo.md)."""
    torch.manual_seed(0)
    std, shift = 0.2, 0.1  # pi's mean one half std from mu's: about one update of lag
    mu, pi = Normal(0.0, std), Normal(shift, std)
    actions = mu.sample((200_000,))
    ratio = (pi.log_prob(actions) - mu.log_prob(actions)).exp()
    c_bar = APPOModule().hparams.c_bar
    assert ratio.clamp(max=c_bar).mean().item() == pytest.approx(1.0, abs=0.01)
    # capped at 1: 1 - TV, TV = 2 Phi(shift / (2 std)) - 1 for two Gaussians of one std
    tv = 2 * Normal(0.0, 1.0).cdf(torch.tensor(shift / (2 * std))).item() - 1
    assert ratio.clamp(max=1.0).mean().item() == pytest.approx(1 - tv, abs=0.01)


def test_a_distributed_fit_releases_its_group_at_exit(monkeypatch):
    """Under any Trainer, a DDP fit that ended cleanly destroys its gloo group before the
    interpreter finalizes (a gloo thread killed mid-destructor aborts a rank that succeeded);
    a single-process fit arms nothing."""
    import lightning_unilab.learner.appo as appo

    armed = []
    monkeypatch.setattr(appo.ReleaseAtExit, "arm", lambda self: armed.append(self))
    module = APPOModule()
    monkeypatch.setattr(appo.dist, "is_initialized", lambda: False)
    module.on_fit_end()
    assert armed == []
    monkeypatch.setattr(appo.dist, "is_initialized", lambda: True)
    module.on_fit_end()
    assert len(armed) == 1
