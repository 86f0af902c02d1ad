"""Actor-critic networks and running observation normalization, shared by learner and collector.

The collector runs a CPU copy of :class:`ActorCritic` on raw observations (normalization is part of
the module, so publishing ``state_dict()`` also publishes the normalizer's statistics); the learner
updates the statistics from the rollouts it reads and trains on the same module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributions import Normal

from lightning_omnilab.validate import (
    ArgumentTypeError,
    fail,
    one_of,
    positive_int,
    positive_number,
)

__all__ = ["ActorCritic", "ObsNormalizer", "RunningMoments", "ValueNormalizer", "mlp"]

_ACTIVATIONS = {"elu": nn.ELU, "relu": nn.ReLU, "tanh": nn.Tanh, "silu": nn.SiLU}
# how the action std is trained: its log (ours), or the std itself (rsl_rl's "scalar")
STD_PARAMS = ("log", "scalar")
MIN_STD = 1e-6  # a scalar std stepped through 0 acts with this one


def hidden_sizes(name: str, value: Any) -> tuple[int, ...]:
    """Hidden layer widths: a list or tuple of ints >= 1 (empty: a linear map)."""
    if isinstance(value, str) or not isinstance(value, Sequence):
        fail(name, "a list of layer widths (ints >= 1)", value, ArgumentTypeError)
    for width in value:
        positive_int(name, width)
    return tuple(int(w) for w in value)


def check_activation(activation: Any) -> str:
    return one_of("activation", activation, sorted(_ACTIVATIONS))


def mlp(
    in_size: int, hidden: Sequence[int], out_size: int, activation: str = "elu"
) -> nn.Sequential:
    """in -> hidden... -> out, with ``activation`` between layers and none after the last."""
    check_activation(activation)
    hidden = hidden_sizes("hidden", hidden)
    sizes = [in_size, *hidden]
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:], strict=True):
        layers += [nn.Linear(a, b), _ACTIVATIONS[activation]()]
    layers.append(nn.Linear(sizes[-1], out_size))
    return nn.Sequential(*layers)


class RunningMoments(nn.Module):
    """Running mean and (biased) variance of a stream of rows, parallel Welford in float64.

    Statistics are buffers, so they travel with ``state_dict()`` into checkpoints and to the
    collector.
    """

    def __init__(self, size: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(size, dtype=torch.float64))
        self.register_buffer("var", torch.ones(size, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: Tensor) -> None:
        """Fold a batch ``[..., size]`` into the statistics."""
        x = x.reshape(-1, self.mean.numel()).to(torch.float64)
        if x.shape[0] == 0:
            return
        self.update_moments(x.shape[0], x.mean(0), x.var(0, unbiased=False))

    @torch.no_grad()
    def update_moments(self, count: float, batch_mean: Tensor, batch_var: Tensor) -> None:
        """Fold in a batch given by its size, mean and (biased) variance: the form in which
        several processes' batches are combined before every process applies the same update."""
        n = float(count)
        if n <= 0:
            return
        batch_mean = batch_mean.to(self.mean)
        batch_var = batch_var.to(self.var)
        total = self.count + n
        delta = batch_mean - self.mean
        self.mean += delta * (n / total)
        m2 = self.var * self.count + batch_var * n + delta.square() * (self.count * n / total)
        self.var.copy_(m2 / total)
        self.count.copy_(total)


class ObsNormalizer(RunningMoments):
    """Observations as a z-score under the running statistics, clipped at ``clip`` (None: not
    clipped); ``eps`` is added to the variance, so sqrt(eps) floors the std that a rarely
    moving input (a contact force that is mostly 0) is divided by."""

    def __init__(self, size: int, clip: float | None = 5.0, eps: float = 1e-8) -> None:
        super().__init__(size)
        positive_number("obs_clip", clip, none_ok=True)
        positive_number("obs_eps", eps)
        self.clip = clip
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        mean = self.mean.to(x.dtype)
        std = (self.var + self.eps).sqrt().to(x.dtype)
        z = (x - mean) / std
        return z if self.clip is None else z.clamp(-self.clip, self.clip)


class ValueNormalizer(RunningMoments):
    """Running statistics of the critic's targets: the critic's head predicts the z-score.

    The value loss (and its clip) then has the same scale on every task: a pendulum's returns
    of ~100 and a humanoid's of ~500 alike; in raw units the critic crawled towards them at Adam's
    step size and a value clip of 0.2 held it a step behind the policy. While nothing has been
    folded in (mean 0, std 1) it is the identity, exactly.
    """

    def __init__(self, min_std: float = 1e-4) -> None:
        super().__init__(1)
        self.min_std = min_std

    def std(self) -> Tensor:
        return self.var.sqrt().clamp_min(self.min_std)

    def normalize(self, value: Tensor) -> Tensor:
        return (value - self.mean.to(value.dtype)) / self.std().to(value.dtype)

    def denormalize(self, z: Tensor) -> Tensor:
        return self.mean.to(z.dtype) + self.std().to(z.dtype) * z

    @torch.no_grad()
    def update_preserving(self, head: nn.Linear, count: float, batch_mean: Tensor,
                          batch_var: Tensor) -> None:
        """Fold in a batch of targets and rescale the linear ``head`` so that the values it
        gives, ``mean + std * head(h)``, stay what they were (PopArt's output preservation,
        van Hasselt et al. 2016): only gradient steps move the critic."""
        old_mean, old_std = self.mean.clone(), self.std()
        self.update_moments(count, batch_mean, batch_var)
        new_mean, new_std = self.mean, self.std()
        scale = old_std / new_std
        head.weight.mul_(scale.to(head.weight.dtype))
        head.bias.copy_(((old_std * head.bias.double() + old_mean - new_mean) / new_std)
                        .to(head.bias.dtype))


class ActorCritic(nn.Module):
    """Gaussian MLP actor (state-independent log std) and MLP critic, each with its normalizer;
    the critic's output is de-normalized by ``value_normalizer`` (the identity until a learner
    folds target statistics into it). ``std_param``: the action std is trained as its log
    (``log_std``) or as itself (``std``, rsl_rl's; floored at 1e-6 where it acts).

    ``critic_size`` may differ from ``obs_size`` (privileged critic observations).
    """

    def __init__(
        self,
        obs_size: int,
        critic_size: int,
        action_size: int,
        actor_hidden: Sequence[int] = (512, 256, 128),
        critic_hidden: Sequence[int] = (512, 256, 128),
        activation: str = "elu",
        init_log_std: float = 0.0,
        normalize_obs: bool = True,
        obs_clip: float | None = 5.0,
        obs_eps: float = 1e-8,
        std_param: str = "log",
    ) -> None:
        super().__init__()
        one_of("std_param", std_param, STD_PARAMS)
        for name, value in (("obs_size", obs_size), ("critic_size", critic_size),
                            ("action_size", action_size)):
            positive_int(name, value)
        self.obs_size, self.critic_size, self.action_size = obs_size, critic_size, action_size
        self.normalize_obs = normalize_obs
        self.obs_normalizer = ObsNormalizer(obs_size, obs_clip, obs_eps)
        self.critic_normalizer = ObsNormalizer(critic_size, obs_clip, obs_eps)
        self.value_normalizer = ValueNormalizer()
        self.actor = mlp(obs_size, hidden_sizes("actor_hidden", actor_hidden), action_size,
                         activation)
        self.critic = mlp(critic_size, hidden_sizes("critic_hidden", critic_hidden), 1,
                          activation)
        self.std_param = std_param
        start = torch.full((action_size,), float(init_log_std))
        if std_param == "log":
            self.log_std = nn.Parameter(start)
        else:  # rsl_rl's: Adam's steps of one size move a small std relatively further
            self.std = nn.Parameter(start.exp())

    def noise_parameter(self) -> nn.Parameter:
        """The trained parameter of the action noise (``log_std`` or ``std``)."""
        return self.log_std if self.std_param == "log" else self.std

    def action_log_std(self) -> Tensor:
        """The log std of the actions ``[action_size]``, whichever is the parameter."""
        if self.std_param == "log":
            return self.log_std
        return self.std.clamp_min(MIN_STD).log()

    def _actor_input(self, obs: Tensor) -> Tensor:
        return self.obs_normalizer(obs) if self.normalize_obs else obs

    def _critic_input(self, critic_obs: Tensor) -> Tensor:
        return self.critic_normalizer(critic_obs) if self.normalize_obs else critic_obs

    def distribution(self, obs: Tensor) -> Normal:
        """Action distribution for raw observations ``[..., obs_size]``."""
        mean = self.actor(self._actor_input(obs))
        # validate_args=False: the argument checks cost more than the tiny MLPs on the hot path
        return Normal(mean, self.action_log_std().expand_as(mean).exp(), validate_args=False)

    def value(self, critic_obs: Tensor) -> Tensor:
        """State values ``[...]`` for raw critic observations ``[..., critic_size]``."""
        return self.value_normalizer.denormalize(self.normalized_value(critic_obs))

    def normalized_value(self, critic_obs: Tensor) -> Tensor:
        """The critic head's output: the value as a z-score under ``value_normalizer``."""
        return self.critic(self._critic_input(critic_obs)).squeeze(-1)

    @torch.no_grad()
    def act(
        self, obs: Tensor, deterministic: bool = False
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(action, log-prob, mean, log std) for raw observations; sampled unless deterministic."""
        dist = self.distribution(obs)
        action = dist.mean if deterministic else dist.sample()
        return action, dist.log_prob(action).sum(-1), dist.mean, dist.stddev.log()

    @torch.no_grad()
    def update_normalizers(self, obs: Tensor, critic_obs: Tensor) -> None:
        if self.normalize_obs:
            self.obs_normalizer.update(obs)
            self.critic_normalizer.update(critic_obs)
