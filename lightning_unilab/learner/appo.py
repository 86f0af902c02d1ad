"""APPOModule: asynchronous PPO as a LightningModule (manual optimization).

One ``training_step`` is one rollout slot from the data module ([T, N] time-major, see
:mod:`lightning_unilab.runtime.rollout`): targets and advantages, then ``epochs x minibatches``
PPO-clip steps, then the observation statistics and the new weights go to the collector. The
same code runs synchronous PPO (the collector waits for each new version, so the data is
on-policy but for one normalizer update, and V-trace corrects that) and asynchronous APPO (the
collector runs ahead on slightly older weights: GAE targets on the data as collected, and the
decoupled surrogate's weights correct the policy gradient). The losses, term by term, are in
docs/unilab/appo.md.

Manual optimization because one batch takes many optimizer steps with an adaptive learning rate
between them, which Lightning's automatic loop (one step per batch) does not express.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from torch import Tensor
from torchmetrics.aggregation import RunningMean

from lightning_omnilab import quiet
from lightning_omnilab.process_group import ReleaseAtExit
from lightning_omnilab.validate import (
    non_negative_int,
    number,
    one_of,
    positive_int,
    positive_number,
    probability,
)
from lightning_unilab.last_checkpoint import refuse_ignored_time_interval
from lightning_unilab.learner.logger_writes import write_to_loggers
from lightning_unilab.learner.losses import (
    RATIO_FORMS,
    approx_kl,
    clipped_value_loss,
    gaussian_entropy,
    gaussian_kl,
    off_policy_weights,
    policy_ratio,
    ppo_surrogate,
)
from lightning_unilab.learner.policy import (
    STD_PARAMS,
    ActorCritic,
    check_activation,
    hidden_sizes,
)
from lightning_unilab.learner.returns import bootstrap_truncated, episode_discounts, gae, vtrace

__all__ = ["APPOModule", "PreparedSlot", "adapted_lr", "next_actor_lr"]

# the ModelCheckpoint advice for manually optimized modules: APPO's own (lightning_omnilab.quiet)
quiet.ignore_manual_optimization_checkpoint_advice()

_BATCH_KEYS = ("obs", "critic_obs", "actions", "behaviour_logp", "behaviour_mean",
               "behaviour_log_std", "rewards", "terminated", "truncated", "final_critic_obs",
               "last_critic_obs")


def _check_fields(batch: dict[str, Any]) -> None:
    """Every field of the rollout format is present."""
    for key in _BATCH_KEYS:
        if key not in batch:
            raise KeyError(f"batch: missing field {key!r} (expected the fields of "
                           "lightning_unilab.runtime.rollout)")


def check_finite_rollout(batch: dict[str, Any]) -> None:
    """Refuse NaN or inf in a floating-point field of a rollout slot (time-major ``[T, N,
    ...]``, ``last_critic_obs`` ``[N, ...]``), naming the field, the step and the env of the
    first bad value: one reaching the update would make the loss, the normalizers and then
    the weights NaN. One ``isfinite`` pass per field."""
    for key in _BATCH_KEYS:
        x = batch[key]
        if not x.is_floating_point() or bool(torch.isfinite(x).all()):
            continue
        first = tuple(int(v) for v in torch.nonzero(~torch.isfinite(x))[0])
        value = float(x[first])
        what = "NaN" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        where = (f"env {first[0]}" if key == "last_critic_obs"
                 else f"step {first[0]}, env {first[1]}")
        raise ValueError(
            f"batch[{key!r}]: NaN or inf in the rollout (slot "
            f"{batch.get('stats', {}).get('seq', '?')}): {where} holds {what} (first at index "
            f"{first}); the task or the collector produced non-finite values. No update was made")


# when the adaptive lr moves: once per update on its KL, or before each minibatch's step
ADAPT_LR_EVERY = ("update", "minibatch")
ADVANTAGE_ESTIMATORS = ("auto", "vtrace", "gae")
_TERMS = ("loss", "policy_loss", "value_loss", "entropy", "kl", "approx_kl", "clip_fraction")
# the metrics Lightning tracks (trainer.callback_metrics: checkpoint monitors, early stopping,
# the progress bar); every other metric of a step goes straight to the loggers at the same
# step, since each ``self.log`` call costs a fraction of a millisecond
# (docs/unilab/runtime.md, "Where an update cycle's time goes")
TRACKED_METRICS = frozenset({
    "rollout/return", "rollout/episode_length", "learner/policy_lag", "learner/skipped_slots",
    "learner/lr", "learner/kl", "learner/actor_steps", "learner/kl_stopped",
    "learner/policy_version", "loss/loss"})


@dataclass
class PreparedSlot:
    """One slot flattened to B = T*N samples, with everything the minibatch losses need."""

    obs: Tensor  # [B, obs]
    critic_obs: Tensor  # [B, critic]
    actions: Tensor  # [B, act]
    behaviour_logp: Tensor  # [B]
    target_logp: Tensor  # [B] log-prob under the target (pre-update or target-network) policy
    old_mean: Tensor  # [B, act] pre-update policy: the KL reference of the adaptive lr
    old_log_std: Tensor  # [B, act]
    old_values: Tensor  # [B] values the targets were computed with (value clipping)
    returns: Tensor  # [B] value targets (V-trace or GAE)
    advantages: Tensor  # [B] (normalized if asked)
    behaviour_kl: float  # KL(behaviour || pre-update policy): how off-policy the slot is
    is_weight_mean: float = 1.0  # mean of min(rho_bar, pi_target / mu): 1 on-policy

    @property
    def size(self) -> int:
        return self.obs.shape[0]


def adapted_lr(lr: float, kl: float, desired_kl: float, lr_min: float, lr_max: float) -> float:
    """rsl_rl's KL-target schedule: /1.5 above 2x the target, x1.5 below half, kept in bounds."""
    if kl > 2.0 * desired_kl:
        return max(lr_min, lr / 1.5)
    if kl < 0.5 * desired_kl:
        return min(lr_max, lr * 1.5)
    return lr


def next_actor_lr(lr: float, kl: float, overshoot: float | None, desired_kl: float,
                  lr_min: float, lr_max: float) -> float:
    """The actor's lr for the next update, from this update's KL.

    An update stopped by the trust region (``overshoot``: the KL that crossed it) shrinks the
    lr by sqrt(desired / overshoot) (KL grows about as the square of the step), between 1/10
    and 1/1.5; otherwise rsl_rl's band rule on the update's KL (:func:`adapted_lr`).
    """
    if overshoot is not None:
        factor = min(1.0 / 1.5, max(0.1, math.sqrt(desired_kl / overshoot)))
        return max(lr_min, lr * factor)
    return adapted_lr(lr, kl, desired_kl, lr_min, lr_max)


def flushes_denormals() -> bool:
    """Whether this thread's CPU mode treats denormal floats as 0 (torch has no getter)."""
    return torch.tensor([1e-40]).item() == 0.0


@contextmanager
def denormals_flushed(enabled: bool = True) -> Iterator[None]:
    """This thread treats denormal floats as 0 inside the block and gets its mode back after,
    also when the block raises: the mode is the thread's, and a user's process outlives a fit."""
    if not enabled:
        yield
        return
    before = flushes_denormals()
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(before)


class APPOModule(pl.LightningModule):
    """Actor-critic trained with PPO-clip, one rollout slot per step.

    Args:
        actor_hidden: hidden layer sizes of the actor MLP of the :class:`ActorCritic` built in
            ``setup`` from the data module's ``env_spec``.
        critic_hidden: hidden layer sizes of its critic MLP.
        activation: its hidden activation (e.g. "elu").
        init_log_std: the log of its initial action std.
        normalize_obs: z-score its observations under running statistics.
        std_param: the action std trained as its log ("log") or as itself ("scalar", rsl_rl's).
        obs_clip: the clip of its observation normalizers' z-scores (None: none; rsl_rl does
            not clip).
        obs_eps: the variance floor of its observation normalizers (rsl_rl divides by
            std + 0.01, about ``obs_eps`` 1e-4).
        obs_size: optional; if given it must match the task's observation size.
        critic_size: optional; if given it must match the task's critic observation size.
        action_size: optional; if given it must match the task's action size.
        policy: a ready :class:`ActorCritic` to train instead of building one.
        gamma: discount.
        gae_lambda: the lambda of V-trace (GAE when on-policy).
        rho_bar: V-trace clip of the IS weights in the TD errors.
        c_bar: V-trace clip of the IS weights in the traces. It defaults to 100 (the traces
            keep their IS weights): at 1, every sample
            the learner's policy favours less than the collector's shortens the trace and none
            lengthens it, so lagged data gets nearly one-step advantages (docs/unilab/appo.md,
            "Stale data").
        advantage_estimator: "vtrace" (targets and advantages corrected by the IS weights
            above), "gae" (GAE(lambda) on the slot as collected, as PPO treats its data) or
            "auto": V-trace for a slot the current weights collected (sync mode: off-policy by
            one normalizer update, weights near 1), GAE for a slot one or more updates old,
            where the weights' variance costs more than the bias they remove
            (docs/unilab/appo.md, "Stale data"). The surrogate corrects for the lag either way
            (``ratio_form``).
        clip_ratio: PPO clip epsilon.
        ratio_form: "decoupled" (pi / pi_prox clipped, weighted by
            min(rho_bar, pi_prox / mu); pi_prox: the pre-update or target policy), "behaviour"
            (pi / mu) or "impact" (pi / max(mu, pi_target)). All three equal PPO on-policy.
        value_clip: clip of the value change in the value loss (None: plain MSE), in the
            critic's units: z-scores of the targets when ``normalize_values``.
        normalize_values: the critic predicts its targets as a z-score under running statistics
            of the V-trace targets (rescaled so that values are kept when they move).
        value_loss_coef: weight of the value loss.
        entropy_coef: weight of the entropy bonus.
        lr: Adam learning rate (the start value when adaptive).
        adaptive_lr: rsl_rl-style
            schedule on ``desired_kl``: lr /= 1.5 when KL > 2 * target, lr *= 1.5 when
            KL < target / 2, kept in [lr_min, lr_max]; KL of the pre-update policy to the current.
            The KL is that of the whole update (pre-update policy to updated, over the slot) and
            the lr moves once per update. It moves the actor's lr only; the critic trains at
            ``critic_lr``.
        adapt_lr_every: "update" (above) or "minibatch": rsl_rl's rule, where each minibatch's
            KL (pre-update policy to the current one, on that minibatch, before its step) moves
            the lr for that step; ``desired_kl`` is then a per-minibatch target.
        desired_kl: the KL target of the adaptive learning rate.
        lr_min: the adaptive learning rate's floor.
        lr_max: the adaptive learning rate's ceiling.
        critic_lr: the critic's learning rate (default: ``lr``).
        kl_stop: trust region of one update: once the KL of the pre-update policy to the current
            one passes ``kl_stop * desired_kl`` the actor step that crossed it is undone and the
            rest of the update trains the critic only (None: off).
        epochs: passes over the slot.
        minibatches: minibatches per pass.
        reshuffle_each_epoch: draw a new minibatch partition for every pass (False: one
            partition for all passes, as rsl_rl does).
        max_grad_norm: global gradient-norm clip (None: off).
        max_policy_lag: skip slots whose weights are more than this many updates old (None: off).
        target_network: keep an IMPACT target policy (updated every ``target_update_interval``
            slots by Polyak averaging with ``target_tau``); off: the target is the pre-update
            policy of each slot.
        target_update_interval: slots between target policy updates.
        target_tau: the Polyak weight of the new policy in a target update (1: a copy).
        normalize_advantages: z-score advantages over the slot.
        flush_denormal: each update treats floats below 1.2e-38 as 0
            (``torch.set_flush_denormal``, a per-thread CPU mode, restored when the step ends or
            raises): on CPU denormal activations made one G1 update 2.9x slower after 2 h of
            training (docs/unilab/results.md, g1-walk-flat). False
            leaves the thread's mode as it is.
    """

    def __init__(
        self,
        actor_hidden: Sequence[int] = (512, 256, 128),
        critic_hidden: Sequence[int] = (512, 256, 128),
        activation: str = "elu",
        init_log_std: float = 0.0,
        normalize_obs: bool = True,
        obs_clip: float | None = 5.0,
        obs_eps: float = 1e-8,
        std_param: str = "log",
        obs_size: int | None = None,
        critic_size: int | None = None,
        action_size: int | None = None,
        policy: ActorCritic | None = None,
        gamma: float = 0.99,
        gae_lambda: float = 0.95,
        rho_bar: float = 1.0,
        c_bar: float = 100.0,
        advantage_estimator: str = "auto",
        clip_ratio: float = 0.2,
        ratio_form: str = "decoupled",
        value_clip: float | None = 0.2,
        normalize_values: bool = True,
        value_loss_coef: float = 1.0,
        entropy_coef: float = 0.01,
        lr: float = 1e-3,
        adaptive_lr: bool = True,
        adapt_lr_every: str = "update",
        desired_kl: float = 0.01,
        lr_min: float = 1e-6,
        lr_max: float = 1e-2,
        critic_lr: float | None = None,
        kl_stop: float | None = 2.0,
        epochs: int = 5,
        minibatches: int = 4,
        reshuffle_each_epoch: bool = True,
        max_grad_norm: float | None = 1.0,
        max_policy_lag: int | None = None,
        target_network: bool = False,
        target_update_interval: int = 1,
        target_tau: float = 1.0,
        normalize_advantages: bool = True,
        flush_denormal: bool = True,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["policy"])
        hidden_sizes("actor_hidden", actor_hidden)
        hidden_sizes("critic_hidden", critic_hidden)
        check_activation(activation)
        positive_number("obs_clip", obs_clip, none_ok=True)
        positive_number("obs_eps", obs_eps)
        one_of("std_param", std_param, STD_PARAMS)
        probability("gamma", gamma)
        probability("gae_lambda", gae_lambda)
        positive_number("rho_bar", rho_bar)
        positive_number("c_bar", c_bar)
        one_of("advantage_estimator", advantage_estimator, ADVANTAGE_ESTIMATORS)
        number("clip_ratio", clip_ratio, low=0, high=1, low_open=True)
        one_of("ratio_form", ratio_form, RATIO_FORMS)
        positive_number("value_clip", value_clip, none_ok=True)
        number("value_loss_coef", value_loss_coef, low=0)
        number("entropy_coef", entropy_coef, low=0)
        positive_number("lr", lr)
        positive_number("critic_lr", critic_lr, none_ok=True)
        number("kl_stop", kl_stop, low=1, low_open=True, none_ok=True)
        if adaptive_lr or kl_stop is not None:
            positive_number("desired_kl", desired_kl)
        one_of("adapt_lr_every", adapt_lr_every, ADAPT_LR_EVERY)
        if adaptive_lr:
            positive_number("lr_min", lr_min)
            number("lr_max", lr_max, low=lr_min)
        positive_int("epochs", epochs)
        positive_int("minibatches", minibatches)
        one_of("reshuffle_each_epoch", reshuffle_each_epoch, (True, False))
        positive_number("max_grad_norm", max_grad_norm, none_ok=True)
        non_negative_int("max_policy_lag", max_policy_lag, none_ok=True)
        positive_int("target_update_interval", target_update_interval)
        one_of("flush_denormal", flush_denormal, (True, False))
        number("target_tau", target_tau, low=0, high=1, low_open=True)
        for name, value in (("obs_size", obs_size), ("critic_size", critic_size),
                            ("action_size", action_size)):
            positive_int(name, value, none_ok=True)
        if policy is not None and not isinstance(policy, ActorCritic):
            raise TypeError(f"policy: expected an ActorCritic or None, got "
                            f"{type(policy).__name__}")
        self.automatic_optimization = False
        self.policy: ActorCritic | None = policy
        self.policy_version = 0  # updates done (= versions published after the first)
        self.skipped_slots = 0
        # kept out of the module tree: not trained, not in DDP's parameters, saved by hand
        self._target: list[ActorCritic] = []
        # minibatch order: a stream of its own, saved in checkpoints, so that a resumed run
        # shuffles as the uninterrupted one (the global stream is advanced by anything);
        # seeded in setup from the global seed (seed_everything). Made there, not here: a
        # Generator does not survive ddp_spawn's pickling of the module
        self._shuffle: torch.Generator | None = None
        self.return_mean = RunningMean(window=10, sync_on_compute=False)
        self.length_mean = RunningMean(window=10, sync_on_compute=False)

    # ------------------------------------------------------------------ setup

    def setup(self, stage: str) -> None:
        if self._trainer is not None:
            refuse_ignored_time_interval(self._trainer, self)
        self._shuffle = torch.Generator().manual_seed(torch.initial_seed())
        sizes = self._task_sizes()
        if self.policy is None:
            if sizes is None:
                sizes = self._explicit_sizes()
            self.policy = self._build_policy(sizes)
        elif sizes is not None:
            have = (self.policy.obs_size, self.policy.critic_size, self.policy.action_size)
            if have != sizes:
                raise ValueError(f"policy: its (obs, critic, action) sizes {have} do not match "
                                 f"the task's {sizes}")

    def _build_policy(self, sizes: tuple[int, ...]) -> ActorCritic:
        hp = self.hparams
        return ActorCritic(*sizes, actor_hidden=tuple(hp.actor_hidden),
                           critic_hidden=tuple(hp.critic_hidden), activation=hp.activation,
                           init_log_std=hp.init_log_std, normalize_obs=hp.normalize_obs,
                           obs_clip=hp.obs_clip, obs_eps=hp.obs_eps, std_param=hp.std_param)

    def _explicit_sizes(self) -> tuple[int, int, int]:
        hp = self.hparams
        if hp.obs_size is None or hp.action_size is None:
            raise ValueError("obs_size, action_size: no data module with an env_spec to take them "
                             "from; pass them (and critic_size if it differs) or a policy")
        return hp.obs_size, hp.critic_size or hp.obs_size, hp.action_size

    def _task_sizes(self) -> tuple[int, int, int] | None:
        """(obs, critic, action) sizes of the data module's task, checked against explicit ones."""
        trainer = self._trainer
        dm = getattr(trainer, "datamodule", None) if trainer is not None else None
        spec = getattr(dm, "env_spec", None)
        if spec is None:
            return None
        task = (int(spec.obs_size), int(spec.critic_size or spec.obs_size),
                int(spec.action_size))
        hp = self.hparams
        given = (hp.obs_size, hp.critic_size, hp.action_size)
        for name, want, got in zip(("obs_size", "critic_size", "action_size"), task, given,
                                   strict=True):
            if got is not None and got != want:
                raise ValueError(f"{name}: the module was given {got} but the task "
                                 f"({getattr(dm, 'task', type(dm).__name__)}) has {want}; "
                                 f"drop {name} or set it to {want}")
        return task

    def configure_optimizers(self) -> torch.optim.Optimizer:
        assert self.policy is not None, "setup() builds the policy"
        # two groups: the adaptive lr is a trust region on the policy, so it moves the actor's
        # lr only; tying the critic to it starves the value fit when a small action std keeps
        # the actor's lr near lr_min, and the advantages go stale as returns grow
        hp, policy = self.hparams, self.policy
        return torch.optim.Adam([
            {"params": [*policy.actor.parameters(), policy.noise_parameter()], "lr": hp.lr},
            {"params": list(policy.critic.parameters()),
             "lr": hp.critic_lr if hp.critic_lr is not None else hp.lr},
        ])

    # ------------------------------------------------------------------ the update

    @torch.no_grad()
    def prepare(self, batch: dict[str, Any]) -> PreparedSlot:
        """V-trace targets and advantages of one slot under the current weights, flattened;
        a slot holding NaN or inf is refused (``check_finite_rollout``)."""
        _check_fields(batch)
        check_finite_rollout(batch)
        return self._prepare(batch)

    @torch.no_grad()
    def _prepare(self, batch: dict[str, Any]) -> PreparedSlot:
        policy = self._policy
        hp = self.hparams
        obs, critic_obs = batch["obs"], batch["critic_obs"]
        t, n = batch["rewards"].shape
        if obs.shape[-1] != policy.obs_size or critic_obs.shape[-1] != policy.critic_size:
            raise ValueError(f"batch: obs/critic sizes {obs.shape[-1]}/{critic_obs.shape[-1]} "
                             f"do not match the policy's {policy.obs_size}/"
                             f"{policy.critic_size}")
        values = policy.value(critic_obs)
        last_values = policy.value(batch["last_critic_obs"])
        # V(final) is needed only where an episode was cut short: evaluate just those rows
        cut = batch["truncated"].bool() & ~batch["terminated"].bool()
        final_values = torch.zeros_like(values)
        if cut.any():
            final_values[cut] = policy.value(batch["final_critic_obs"][cut])
        dist = policy.distribution(obs)
        actions = batch["actions"]
        logp_now = dist.log_prob(actions).sum(-1)
        target = self._target[0] if self._target else None
        target_logp = (target.distribution(obs).log_prob(actions).sum(-1) if target is not None
                       else logp_now)
        behaviour_logp = batch["behaviour_logp"]
        rewards = bootstrap_truncated(batch["rewards"].float(), batch["terminated"],
                                      batch["truncated"], final_values, hp.gamma)
        discounts = episode_discounts(batch["terminated"], batch["truncated"], hp.gamma)
        lag = self.policy_version - int(batch.get("stats", {}).get("policy_version",
                                                                   self.policy_version))
        estimator = hp.advantage_estimator
        if estimator == "auto":
            estimator = "gae" if lag > 0 else "vtrace"
        if estimator == "gae":
            returns, adv = gae(values, last_values, rewards, discounts, hp.gae_lambda)
        else:
            returns, adv = vtrace(values, last_values, rewards, discounts,
                                  target_logp - behaviour_logp, lam=hp.gae_lambda,
                                  rho_bar=hp.rho_bar, c_bar=hp.c_bar)
        if hp.normalize_advantages:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        old_log_std = dist.stddev.log()
        behaviour_kl = gaussian_kl(batch["behaviour_mean"], batch["behaviour_log_std"],
                                   dist.mean, old_log_std)
        b = t * n
        return PreparedSlot(
            obs=obs.reshape(b, -1), critic_obs=critic_obs.reshape(b, -1),
            actions=actions.reshape(b, -1), behaviour_logp=behaviour_logp.reshape(b),
            target_logp=target_logp.reshape(b), old_mean=dist.mean.reshape(b, -1),
            old_log_std=old_log_std.reshape(b, -1), old_values=values.reshape(b),
            returns=returns.reshape(b), advantages=adv.reshape(b),
            behaviour_kl=float(behaviour_kl),
            is_weight_mean=float(off_policy_weights(target_logp, behaviour_logp,
                                                    hp.rho_bar).mean()))

    def loss_terms(self, slot: PreparedSlot, idx: Tensor | None = None) -> dict[str, Tensor]:
        """The loss and its terms on the samples ``idx`` of ``slot`` (all if None)."""
        hp = self.hparams
        policy = self._policy

        def pick(x: Tensor) -> Tensor:
            return x if idx is None else x[idx]

        obs, actions = pick(slot.obs), pick(slot.actions)
        dist = policy.distribution(obs)
        logp = dist.log_prob(actions).sum(-1)
        ratio = policy_ratio(logp, pick(slot.behaviour_logp), pick(slot.target_logp),
                             hp.ratio_form)
        weights = (off_policy_weights(pick(slot.target_logp), pick(slot.behaviour_logp),
                                      hp.rho_bar) if hp.ratio_form == "decoupled" else None)
        pg_loss, clip_frac = ppo_surrogate(ratio, pick(slot.advantages), hp.clip_ratio, weights)
        # the critic's own units: z-scores under the value statistics (identity when off)
        scale = policy.value_normalizer
        values = policy.normalized_value(pick(slot.critic_obs))
        v_loss = clipped_value_loss(values, scale.normalize(pick(slot.old_values)),
                                    scale.normalize(pick(slot.returns)), hp.value_clip)
        log_std = policy.action_log_std().expand_as(dist.mean)
        entropy = gaussian_entropy(log_std)
        loss = pg_loss + hp.value_loss_coef * v_loss - hp.entropy_coef * entropy
        with torch.no_grad():
            kl = gaussian_kl(pick(slot.old_mean), pick(slot.old_log_std), dist.mean, log_std)
            # behaviour-to-current: the sample estimator needs actions drawn from the reference
            a_kl = approx_kl(pick(slot.behaviour_logp), logp)
        return {"loss": loss, "policy_loss": pg_loss, "value_loss": v_loss, "entropy": entropy,
                "kl": kl, "approx_kl": a_kl, "clip_fraction": clip_frac}

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        _check_fields(batch)
        self._refuse_nonfinite(batch)  # before anything reads the slot or changes state
        stats = batch.get("stats", {})
        self._log_rollout(stats)
        version = int(stats.get("policy_version", self.policy_version))
        lag = self.policy_version - version
        self._emit({"learner/policy_lag": float(lag)})
        if self.hparams.max_policy_lag is not None:
            worst = self._reduce(torch.tensor(float(lag)), dist.ReduceOp.MAX)
            if worst > self.hparams.max_policy_lag:  # every rank skips together
                self.skipped_slots += 1
                self._emit({"learner/skipped_slots": float(self.skipped_slots)})
                return
        start = time.perf_counter()
        # the slot's statistics go in before the update, so the first update already sees
        # normalized inputs (raw ones made its KL explode and the adaptive lr collapse); the
        # pre-update policy is evaluated under the same statistics, and the off-policy weights
        # absorb the behaviour policy's older ones
        obs_moments = self._moments(batch["obs"])
        critic_moments = self._moments(batch["critic_obs"])
        if self._policy.normalize_obs:
            self._policy.obs_normalizer.update_moments(*obs_moments)
            self._policy.critic_normalizer.update_moments(*critic_moments)
        with denormals_flushed(self.hparams.flush_denormal):
            slot = self._prepare(batch)  # checked above, on every rank
            if self.hparams.normalize_values:
                self._policy.value_normalizer.update_preserving(
                    self._policy.critic[-1], *self._moments(slot.returns[:, None]))
            update = self._update(slot)
        self.policy_version += 1
        self._refresh_target()
        update_s = time.perf_counter() - start
        self._publish()
        self._emit({
            "learner/update_s": update_s,
            "learner/samples_per_s": slot.size / update_s,
            "learner/behaviour_kl": slot.behaviour_kl,
            "learner/is_weight_mean": slot.is_weight_mean,
            "learner/lr": self._lr(),
            "learner/policy_version": float(self.policy_version),
            "learner/skipped_slots": float(self.skipped_slots),
            **update,
        })

    def _update(self, slot: PreparedSlot) -> dict[str, float]:
        """epochs x minibatches steps; then the actor's lr for the next update from this one's
        KL. Returns the update's metrics for the log."""
        hp = self.hparams
        opt = self.optimizers()
        size = slot.size
        if size < hp.minibatches:
            raise ValueError(f"minibatches: {hp.minibatches} is more than the {size} samples of "
                             "a slot (T*N)")
        mb = size // hp.minibatches
        actor = self._optimizer().param_groups[0]["params"]
        guard = hp.kl_stop * hp.desired_kl if hp.kl_stop is not None else None
        start = [p.detach().clone() for p in actor] if guard is not None else []
        before: list[Tensor] | None = None  # the actor before its latest step
        overshoot: float | None = None  # the KL that stopped the actor
        actor_steps = 0
        per_minibatch = hp.adaptive_lr and hp.adapt_lr_every == "minibatch"
        history: list[Tensor] = []
        perm = None
        for _ in range(hp.epochs):
            if perm is None or hp.reshuffle_each_epoch:
                perm = torch.randperm(size, generator=self._shuffler()).to(slot.obs.device)
            for i in range(hp.minibatches):
                terms = self.loss_terms(slot, perm[i * mb:(i + 1) * mb])
                if guard is not None and overshoot is None and before is not None:
                    kl = self._mean_over_ranks(terms["kl"])
                    if kl > guard:  # the last actor step left the trust region: undo it
                        self._restore(actor, before)
                        overshoot, actor_steps = kl, actor_steps - 1
                        terms = self.loss_terms(slot, perm[i * mb:(i + 1) * mb])
                opt.zero_grad()
                self.manual_backward(terms["loss"])
                if overshoot is not None:  # the critic goes on alone; Adam skips grad-less
                    for p in actor:
                        p.grad = None
                if hp.max_grad_norm is not None:
                    self.clip_gradients(opt, gradient_clip_val=hp.max_grad_norm,
                                        gradient_clip_algorithm="norm")
                if not torch.isfinite(terms["loss"]):
                    bad = {k: float(v) for k, v in terms.items()}
                    raise FloatingPointError(f"APPO loss is not finite ({bad}) at update "
                                             f"{self.policy_version}; no step taken. Lower lr "
                                             "or check the task's observations and rewards")
                if overshoot is None:  # this step moves the actor
                    if per_minibatch:  # a zero KL (the update's first step) says nothing
                        mb_kl = self._mean_over_ranks(terms["kl"])
                        if mb_kl > 0.0:
                            self._set_lr(adapted_lr(self._lr(), mb_kl, hp.desired_kl,
                                                    hp.lr_min, hp.lr_max))
                    actor_steps += 1
                    if guard is not None:
                        before = [p.detach().clone() for p in actor]
                opt.step()
                history.append(torch.stack([terms[k].detach() for k in _TERMS]))
        kl = self._update_kl(slot)
        if guard is not None and kl > guard:  # the same check on the whole slot
            if overshoot is None and before is not None:  # the last step back
                overshoot = kl
                self._restore(actor, before)
                actor_steps, kl = actor_steps - 1, self._update_kl(slot)
            if kl > guard:  # the minibatch estimates missed it: back to the update's start
                overshoot = kl if overshoot is None else overshoot
                self._restore(actor, start)
                actor_steps, kl = 0, self._update_kl(slot)
        if hp.adaptive_lr and not per_minibatch:
            self._set_lr(next_actor_lr(self._lr(), kl, overshoot, hp.desired_kl, hp.lr_min,
                                       hp.lr_max))
        means = torch.stack(history).mean(0).tolist()
        logs = {f"loss/{k}" if "loss" in k or k == "entropy" else f"learner/{k}": v
                for k, v in zip(_TERMS, means, strict=True) if k != "kl"}
        return {**logs, "learner/kl": kl, "learner/actor_steps": float(actor_steps),
                "learner/kl_stopped": float(overshoot is not None)}

    @torch.no_grad()
    def _update_kl(self, slot: PreparedSlot) -> float:
        """KL(pre-update policy || current) over the whole slot, averaged over the ranks."""
        dist = self._policy.distribution(slot.obs)
        kl = gaussian_kl(slot.old_mean, slot.old_log_std, dist.mean, dist.stddev.log())
        return self._mean_over_ranks(kl)

    @staticmethod
    @torch.no_grad()
    def _restore(params: list[Tensor], values: list[Tensor]) -> None:
        for p, v in zip(params, values, strict=True):
            p.copy_(v)

    def _mean_over_ranks(self, x: Tensor) -> float:
        return float(self._reduce(x.detach().clone(), dist.ReduceOp.SUM)) / self._world_size()

    def _set_lr(self, lr: float) -> None:
        self._optimizer().param_groups[0]["lr"] = lr  # the actor's group

    # ------------------------------------------------------------------ helpers

    def _shuffler(self) -> torch.Generator:
        """The minibatch stream (seeded from the global seed where setup() did not run)."""
        if self._shuffle is None:
            self._shuffle = torch.Generator().manual_seed(torch.initial_seed())
        return self._shuffle

    @property
    def _policy(self) -> ActorCritic:
        if self.policy is None:
            raise RuntimeError("APPOModule: no policy yet; it is built in setup() from the data "
                               "module's env_spec (or pass policy=... / the sizes)")
        return self.policy

    def _optimizer(self) -> torch.optim.Optimizer:
        opt = self.optimizers()
        return opt.optimizer if hasattr(opt, "optimizer") else opt

    def _lr(self) -> float:
        return float(self._optimizer().param_groups[0]["lr"])

    def _world_size(self) -> int:
        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1

    def _refuse_nonfinite(self, batch: dict[str, Any]) -> None:
        """``check_finite_rollout`` on every learner process together: each learner reads
        its own slot, so one all-reduce of the refusing rank tells every rank to raise
        (none waits in the update's collectives for one that stopped)."""
        try:
            check_finite_rollout(batch)
            refusal = None
        except ValueError as err:
            refusal = err
        if self._world_size() > 1:
            rank = torch.tensor(-1 if refusal is None else dist.get_rank(),
                                device=batch["obs"].device)
            first = int(self._reduce(rank, dist.ReduceOp.MAX))
            if first >= 0 and refusal is None:
                raise ValueError(f"batch: learner rank {first}'s rollout holds NaN or inf (its "
                                 "error names the field, step and env); no update was made on "
                                 "any rank")
        if refusal is not None:
            raise refusal

    def _reduce(self, x: Tensor, op: Any) -> Tensor:
        """All-reduce across learner processes (identity in one process)."""
        if self._world_size() > 1:
            dist.all_reduce(x, op=op)
        return x

    def _moments(self, x: Tensor) -> tuple[float, Tensor, Tensor]:
        """(count, mean, biased var) of rows of x over all learner processes, in float64."""
        x = x.reshape(-1, x.shape[-1]).to(torch.float64)
        n = torch.tensor(float(x.shape[0]), dtype=torch.float64, device=x.device)
        local_mean = x.mean(0)
        if self._world_size() == 1:
            return float(n), local_mean, x.var(0, unbiased=False)
        total = self._reduce(n.clone(), dist.ReduceOp.SUM)
        mean = self._reduce(local_mean * n, dist.ReduceOp.SUM) / total
        m2 = (x - mean).square().sum(0)
        var = self._reduce(m2, dist.ReduceOp.SUM) / total
        return float(total), mean, var

    def _refresh_target(self) -> None:
        hp = self.hparams
        if not hp.target_network:
            return
        if not self._target:
            self._target.append(copy.deepcopy(self._policy).requires_grad_(False))
            return
        if self.policy_version % hp.target_update_interval:
            return
        target = self._target[0]
        with torch.no_grad():
            for tp, p in zip(target.parameters(), self._policy.parameters(), strict=True):
                tp.lerp_(p, hp.target_tau)
            for tb, b in zip(target.buffers(), self._policy.buffers(), strict=True):
                tb.copy_(b)

    def _datamodule(self) -> Any:
        trainer = self._trainer
        return getattr(trainer, "datamodule", None) if trainer is not None else None

    def _publish(self) -> None:
        publish = getattr(self._datamodule(), "publish_policy", None)
        if callable(publish):
            version = publish(self._policy)
            # the data module numbers versions (it re-publishes once on resume): follow it so
            # that lag = our version - the slot's version stays the number of updates between
            if isinstance(version, int) and not isinstance(version, bool):
                self.policy_version = version

    def on_train_start(self) -> None:
        if self.hparams.target_network and not self._target:
            self._target.append(copy.deepcopy(self._policy).requires_grad_(False))
        version = getattr(self._datamodule(), "policy_version", None)
        if isinstance(version, int) and not isinstance(version, bool):
            self.policy_version = max(self.policy_version, version)

    def on_fit_end(self) -> None:
        # a DDP run's gloo group, under any Trainer (Lightning destroys NCCL's only); Lightning
        # skips this hook when the fit raised, so a failed run exits with its traceback
        if dist.is_available() and dist.is_initialized():
            ReleaseAtExit().arm()

    def _log_rollout(self, stats: dict[str, Any]) -> None:
        if not stats:
            return
        logs: dict[str, float] = {}
        for key in ("env_steps_per_s", "env_steps", "wait_s", "episodes", "unstable_episodes",
                    "slots_dropped"):
            if key in stats:
                logs[f"rollout/{key}"] = float(stats[key])
        ret = float(stats.get("episode_return_mean", math.nan))
        if int(stats.get("episodes", 0)) > 0 and math.isfinite(ret):
            self.return_mean.update(torch.tensor(ret))
            self.length_mean.update(torch.tensor(float(stats["episode_length_mean"])))
            self.log("rollout/return", self.return_mean.compute(), prog_bar=True)
            self.log("rollout/episode_length", self.length_mean.compute())
            logs["rollout/episode_return"] = ret
        for name, value in stats.get("step_info", {}).items():  # reward terms etc., per step
            logs[f"step_info/{name}"] = float(value)
        self._emit(logs)
        if "env_steps_per_s" in stats:
            self.log("env_steps/s", float(stats["env_steps_per_s"]), prog_bar=True, logger=False)

    def _emit(self, metrics: dict[str, float]) -> None:
        """``TRACKED_METRICS`` through ``self.log``; the others to the loggers directly."""
        tracked = {k: v for k, v in metrics.items() if k in TRACKED_METRICS}
        if tracked:
            self.log_dict(tracked)
        if len(tracked) < len(metrics) and self._trainer is not None:
            write_to_loggers(self.trainer, {k: v for k, v in metrics.items()
                                            if k not in TRACKED_METRICS})

    # ------------------------------------------------------------------ checkpoints

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        policy = self._policy
        checkpoint["appo"] = {
            "policy_version": self.policy_version,
            "skipped_slots": self.skipped_slots,
            "sizes": (policy.obs_size, policy.critic_size, policy.action_size),
            "target": self._target[0].state_dict() if self._target else None,
            "shuffle_rng": self._shuffler().get_state(),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("appo", {})
        self.policy_version = int(state.get("policy_version", 0))
        self.skipped_slots = int(state.get("skipped_slots", 0))
        if state.get("shuffle_rng") is not None:  # older checkpoints: the seeded stream
            self._shuffler().set_state(state["shuffle_rng"])
        if self.policy is None and "sizes" in state:  # load_from_checkpoint: no setup() ran
            self.policy = self._build_policy(tuple(state["sizes"]))
        if state.get("target") is not None and self.policy is not None:
            target = copy.deepcopy(self.policy).requires_grad_(False)
            target.load_state_dict(state["target"])
            self._target[:] = [target]
