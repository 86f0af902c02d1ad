"""Return and advantage estimators on time-major rollouts ([T, N] tensors), pure torch.

Conventions shared by every function here:

- ``values[t]`` is V(s_t); ``bootstrap_value`` is V(s_T), the state after the last step.
- ``discounts[t]`` is gamma where step t did not end an episode and 0 where it did
  (:func:`episode_discounts`). Episodes that end by truncation are bootstrapped through their
  reward instead (:func:`bootstrap_truncated`), so one mask serves terminations and truncations
  and ``values[t + 1]`` (the next episode's first state under same-step auto-reset) is never
  mixed into the finished episode.
- The recursions run backwards over T (a loop over time, each step one op on all N envs);
  nothing here depends on autograd: call them under ``torch.no_grad()``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_omnilab.validate import positive_int, positive_number, probability

__all__ = [
    "bootstrap_truncated",
    "episode_discounts",
    "gae",
    "nstep_returns",
    "vtrace",
]


def _check(name: str, x: Tensor, shape: tuple[int, ...]) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of shape {shape}, got "
                        f"{type(x).__name__}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(x.shape)}")


def _rollout_shape(values: Tensor, bootstrap_value: Tensor, **others: Tensor) -> tuple[int, int]:
    if not isinstance(values, Tensor) or values.ndim != 2:
        got = tuple(values.shape) if isinstance(values, Tensor) else type(values).__name__
        raise ValueError(f"values: expected a [T, N] tensor, got {got}")
    t, n = values.shape
    _check("bootstrap_value", bootstrap_value, (n,))
    for name, x in others.items():
        _check(name, x, (t, n))
    return t, n


def episode_discounts(terminated: Tensor, truncated: Tensor, gamma: float) -> Tensor:
    """gamma where the episode goes on after step t, 0 where it ended (either way)."""
    probability("gamma", gamma)
    done = terminated.bool() | truncated.bool()
    return torch.where(done, 0.0, gamma).to(torch.float32)


def bootstrap_truncated(
    rewards: Tensor, terminated: Tensor, truncated: Tensor, final_values: Tensor, gamma: float
) -> Tensor:
    """rewards + gamma * V(final state) where an episode was cut short (truncated, not terminated).

    A time limit is not part of the task: the cut episode would have gone on and earned about
    V(final) more. A termination is part of it and earns nothing after.
    """
    _check("terminated", terminated, tuple(rewards.shape))
    _check("truncated", truncated, tuple(rewards.shape))
    _check("final_values", final_values, tuple(rewards.shape))
    cut = truncated.bool() & ~terminated.bool()
    return rewards + gamma * torch.where(cut, final_values, torch.zeros_like(final_values))


def _next_values(values: Tensor, bootstrap_value: Tensor) -> Tensor:
    return torch.cat([values[1:], bootstrap_value[None]], 0)


def vtrace(
    values: Tensor,
    bootstrap_value: Tensor,
    rewards: Tensor,
    discounts: Tensor,
    log_rhos: Tensor,
    lam: float = 1.0,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """V-trace value targets and policy-gradient advantages, with a lambda (IMPALA, eq. 1).

    With rho_t = min(rho_bar, pi/mu), c_t = lam * min(c_bar, pi/mu) and
    delta_t = rho_t * (r_t + d_t V(s_{t+1}) - V(s_t)):

        v_t - V(s_t) = delta_t + d_t c_t (v_{t+1} - V(s_{t+1})),      v_T = V(s_T)
        A_t          = r_t + d_t ((1 - lam) V(s_{t+1}) + lam v_{t+1}) - V(s_t)

    ``log_rhos`` are log(pi(a_t|s_t) / mu(a_t|s_t)) of the policy being evaluated against the
    behaviour policy. A_t carries no IS weight for a_t itself: the PPO surrogate applies one
    through its ratio. On-policy (log_rhos = 0, rho_bar, c_bar >= 1) v_t are the GAE(lam)
    returns and A_t the GAE(lam) advantages; with lam = 1 too, v_t is the discounted return to
    the end of the rollout, bootstrapped with V(s_T).

    Returns (v [T, N], A [T, N]).
    """
    _rollout_shape(values, bootstrap_value, rewards=rewards, discounts=discounts,
                   log_rhos=log_rhos)
    probability("lam", lam)
    positive_number("rho_bar", rho_bar)
    positive_number("c_bar", c_bar)
    rhos = log_rhos.exp()
    clipped_rho = rhos.clamp(max=rho_bar)
    cs = lam * rhos.clamp(max=c_bar)
    next_values = _next_values(values, bootstrap_value)
    deltas = clipped_rho * (rewards + discounts * next_values - values)
    corr = torch.empty_like(values)  # v_t - V(s_t)
    acc = torch.zeros_like(bootstrap_value)
    for t in range(values.shape[0] - 1, -1, -1):
        acc = deltas[t] + discounts[t] * cs[t] * acc
        corr[t] = acc
    vs = values + corr
    next_vs = _next_values(vs, bootstrap_value)
    adv = rewards + discounts * ((1 - lam) * next_values + lam * next_vs) - values
    return vs, adv


def gae(
    values: Tensor, bootstrap_value: Tensor, rewards: Tensor, discounts: Tensor, lam: float
) -> tuple[Tensor, Tensor]:
    """GAE(lam) (Schulman et al. 2016): returns (A + V, A), the on-policy special case of
    :func:`vtrace`, written separately as its reference."""
    _rollout_shape(values, bootstrap_value, rewards=rewards, discounts=discounts)
    probability("lam", lam)
    deltas = rewards + discounts * _next_values(values, bootstrap_value) - values
    adv = torch.empty_like(values)
    acc = torch.zeros_like(bootstrap_value)
    for t in range(values.shape[0] - 1, -1, -1):
        acc = deltas[t] + discounts[t] * lam * acc
        adv[t] = acc
    return adv + values, adv


def nstep_returns(
    values: Tensor,
    bootstrap_value: Tensor,
    rewards: Tensor,
    discounts: Tensor,
    n: int | None = None,
) -> Tensor:
    """n-step returns sum_{k<n} (prod d) r_{t+k} + (prod d) V(s_{t+n}), cut at the rollout's end
    (where V(s_T) bootstraps). n=None: to the end of the rollout (the Monte-Carlo return with a
    bootstrap)."""
    t_len, _ = _rollout_shape(values, bootstrap_value, rewards=rewards, discounts=discounts)
    n = t_len if positive_int("n", n, none_ok=True) is None else n
    all_values = torch.cat([values, bootstrap_value[None]], 0)  # V(s_0..s_T)
    out = torch.empty_like(values)
    for t in range(t_len):
        end = min(t + n, t_len)
        ret = torch.zeros_like(bootstrap_value)
        scale = torch.ones_like(bootstrap_value)
        for k in range(t, end):
            ret = ret + scale * rewards[k]
            scale = scale * discounts[k]
        out[t] = ret + scale * all_values[end]
    return out
