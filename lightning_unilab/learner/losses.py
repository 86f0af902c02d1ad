"""The APPO loss terms as pure functions of tensors (docs/unilab/appo.md explains each).

Every function takes flat per-sample tensors ([B] or [B, act]) and returns means over B, so a
minibatch is just an index into the flattened slot.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_omnilab.validate import positive_number

__all__ = [
    "MAX_LOG_RATIO",
    "RATIO_FORMS",
    "approx_kl",
    "clipped_value_loss",
    "gaussian_entropy",
    "gaussian_kl",
    "off_policy_weights",
    "policy_ratio",
    "ppo_surrogate",
]

# "behaviour": pi / mu (APPO as in sample-factory); "impact": pi / max(mu, pi_target), the
# IMPACT-style ratio used by UniLab: never larger than the ratio to either policy;
# "decoupled": pi / pi_prox, clipped around the pre-update (proximal) policy, with the
# off-policy correction pi_prox / mu moved into a per-sample weight (Hilton et al. 2022,
# "Batch size-invariance for policy optimization"). Clipping pi / mu instead clips every sample
# whose behaviour policy is already a step behind, so a lagged slot gives almost no gradient.
RATIO_FORMS = ("behaviour", "impact", "decoupled")

# |log ratio| beyond this is far outside any clip range; without the bound, a policy whose
# small std has moved its mean by many std gives exp(log r) = inf in float32, and inf * A (or
# 0 * -inf from an underflowed weight) turned the loss into NaN
MAX_LOG_RATIO = 20.0


def _safe_exp(log_ratio: Tensor) -> Tensor:
    return log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO).exp()


def policy_ratio(
    logp: Tensor, behaviour_logp: Tensor, target_logp: Tensor | None = None,
    form: str = "behaviour",
) -> Tensor:
    """pi/mu, pi/max(mu, pi_target) for ``form="impact"``, or pi/pi_target for
    ``form="decoupled"`` (both need ``target_logp``)."""
    if form == "behaviour":
        return _safe_exp(logp - behaviour_logp)
    if form == "impact":
        if target_logp is None:
            raise ValueError("target_logp: the 'impact' ratio needs the target policy's log-probs")
        return _safe_exp(logp - torch.maximum(behaviour_logp, target_logp))
    if form == "decoupled":
        if target_logp is None:
            raise ValueError("target_logp: the 'decoupled' ratio needs the proximal policy's "
                             "log-probs")
        return _safe_exp(logp - target_logp)
    raise ValueError(f"form: expected one of {RATIO_FORMS}, got {form!r}")


def off_policy_weights(target_logp: Tensor, behaviour_logp: Tensor, rho_bar: float) -> Tensor:
    """min(rho_bar, pi_prox / mu): the truncated importance weight of the decoupled surrogate,
    the same truncation V-trace applies to its policy-gradient term (IMPALA, eq. 4)."""
    positive_number("rho_bar", rho_bar)
    return _safe_exp(target_logp - behaviour_logp).clamp(max=rho_bar)


def ppo_surrogate(ratio: Tensor, advantages: Tensor, clip: float,
                  weights: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(loss, clipped fraction): -mean(w min(r A, clip(r, 1-eps, 1+eps) A)) and the share of
    samples whose ratio left [1-eps, 1+eps]; ``weights`` w (no gradient) default to 1."""
    positive_number("clip", clip)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip, 1.0 + clip) * advantages
    surrogate = torch.minimum(unclipped, clipped)
    if weights is not None:
        surrogate = weights.detach() * surrogate
    loss = -surrogate.mean()
    frac = ((ratio - 1.0).abs() > clip).float().mean()
    return loss, frac


def clipped_value_loss(
    values: Tensor, old_values: Tensor, targets: Tensor, clip: float | None
) -> Tensor:
    """mean(max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2)); plain MSE if clip is None.

    The clipped branch keeps the critic from moving further than c away from the values the
    advantages were computed with, in the direction that would lower the loss.
    """
    err = (values - targets).square()
    if clip is None:
        return err.mean()
    positive_number("clip", clip)
    moved = old_values + (values - old_values).clamp(-clip, clip)
    return torch.maximum(err, (moved - targets).square()).mean()


def gaussian_entropy(log_std: Tensor) -> Tensor:
    """Mean over samples of the entropy of a diagonal Gaussian, summed over action dims."""
    per_dim = 0.5 * (1.0 + torch.log(torch.tensor(2.0 * torch.pi, dtype=log_std.dtype))) + log_std
    return per_dim.sum(-1).mean()


def gaussian_kl(
    mean_p: Tensor, log_std_p: Tensor, mean_q: Tensor, log_std_q: Tensor
) -> Tensor:
    """Mean over samples of KL(p || q) of diagonal Gaussians, summed over action dims."""
    var_p, var_q = (2 * log_std_p).exp(), (2 * log_std_q).exp()
    per_dim = log_std_q - log_std_p + (var_p + (mean_p - mean_q).square()) / (2 * var_q) - 0.5
    return per_dim.sum(-1).mean()


def approx_kl(logp_old: Tensor, logp_new: Tensor) -> Tensor:
    """Sample estimate of KL(old || new) from actions drawn under old: mean((r - 1) - log r),
    r = new/old; unbiased and never negative (Schulman's k3 estimator)."""
    log_r = logp_new - logp_old
    return (log_r.exp() - 1.0 - log_r).mean()
