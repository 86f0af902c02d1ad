"""V-trace, GAE and n-step returns against hand-computed cases and against each other."""

import math

import pytest
import torch

from lightning_unilab.learner.returns import (
    bootstrap_truncated,
    episode_discounts,
    gae,
    nstep_returns,
    vtrace,
)

G = 0.9


def _case():
    """T=3, N=2. env 0: no episode end, IS ratios (0.5, 2, 1). env 1: terminated at t=0,
    truncated at t=1 (V(final) = 0.8), terminated and truncated at t=2, on-policy."""
    values = torch.tensor([[0.5, 0.2], [1.0, 0.4], [1.5, 0.6]])
    bootstrap = torch.tensor([2.0, 1.0])
    rewards = torch.tensor([[1.0, 1.0], [2.0, 1.0], [3.0, 1.0]])
    terminated = torch.tensor([[False, True], [False, False], [False, True]])
    truncated = torch.tensor([[False, False], [False, True], [False, True]])
    final_values = torch.tensor([[7.0, 9.0], [7.0, 0.8], [7.0, 5.0]])  # 7, 9, 5: must be unused
    log_rhos = torch.log(torch.tensor([[0.5, 1.0], [2.0, 1.0], [1.0, 1.0]]))
    rewards = bootstrap_truncated(rewards, terminated, truncated, final_values, G)
    discounts = episode_discounts(terminated, truncated, G)
    return values, bootstrap, rewards, discounts, log_rhos


def test_truncation_bootstrap_and_discounts():
    _, _, rewards, discounts, _ = _case()
    # only the truncated-not-terminated step gets + gamma * V(final)
    torch.testing.assert_close(rewards, torch.tensor([[1.0, 1.0], [2.0, 1.72], [3.0, 1.0]]))
    torch.testing.assert_close(discounts, torch.tensor([[G, 0.0], [G, 0.0], [G, 0.0]]))


def test_vtrace_by_hand_lambda_1():
    vs, adv = vtrace(*_case(), lam=1.0, rho_bar=1.0, c_bar=1.0)
    # env 0: delta = (0.5*1.4, 2.35, 3.3); v - V = (0.7 + .9*.5*5.32, 2.35 + .9*3.3, 3.3)
    # env 1: episode ends every step: v = r (+0 after), the last step ends without bootstrap
    torch.testing.assert_close(vs, torch.tensor([[3.594, 1.0], [6.32, 1.72], [4.8, 1.0]]))
    # A_t = r_t + d_t v_{t+1} - V_t (v_3 = V(s_3) = bootstrap)
    torch.testing.assert_close(adv, torch.tensor([[6.188, 0.8], [5.32, 1.32], [3.3, 0.4]]))


def test_vtrace_by_hand_lambda_half():
    vs, adv = vtrace(*_case(), lam=0.5, rho_bar=1.0, c_bar=1.0)
    # env 0: c = 0.5 * (0.5, 1, 1): v - V = (0.7 + .9*.25*3.835, 2.35 + .9*.5*3.3, 3.3)
    torch.testing.assert_close(vs[:, 0], torch.tensor([2.062875, 4.835, 4.8]))
    # A_t = r_t + d_t (0.5 V_{t+1} + 0.5 v_{t+1}) - V_t
    torch.testing.assert_close(adv[:, 0], torch.tensor([3.12575, 3.835, 3.3]))
    torch.testing.assert_close(vs[:, 1], torch.tensor([1.0, 1.72, 1.0]))


def test_vtrace_rho_and_c_clips_act_separately():
    # rho_bar = 2 lets the ratio 2 at t=1 through into delta_1, c_bar = 1 still cuts the trace
    vs, _ = vtrace(*_case(), lam=1.0, rho_bar=2.0, c_bar=1.0)
    torch.testing.assert_close(vs[:, 0], torch.tensor([4.6515, 8.67, 4.8]))
    # c_bar = 2 as well: the trace through t=1 carries weight 2
    vs, _ = vtrace(*_case(), lam=1.0, rho_bar=2.0, c_bar=2.0)
    torch.testing.assert_close(vs[:, 0], torch.tensor([5.988, 11.64, 4.8]))
    # ratios below the clips are not clipped: 0.5 at t=0 is used as is in every case above


def _random_rollout(seed: int, t: int = 7, n: int = 5):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(t, n, generator=g, dtype=torch.float64)
    bootstrap = torch.randn(n, generator=g, dtype=torch.float64)
    rewards = torch.randn(t, n, generator=g, dtype=torch.float64)
    terminated = torch.rand(t, n, generator=g) < 0.15
    truncated = torch.rand(t, n, generator=g) < 0.15
    final_values = torch.randn(t, n, generator=g, dtype=torch.float64)
    rewards = bootstrap_truncated(rewards, terminated, truncated, final_values, 0.97)
    discounts = episode_discounts(terminated, truncated, 0.97).double()
    return values, bootstrap, rewards, discounts


@pytest.mark.parametrize("lam", [0.0, 0.3, 0.95, 1.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vtrace_on_policy_equals_gae(seed, lam):
    values, bootstrap, rewards, discounts = _random_rollout(seed)
    vs, adv = vtrace(values, bootstrap, rewards, discounts, torch.zeros_like(values), lam=lam)
    ret, gae_adv = gae(values, bootstrap, rewards, discounts, lam)
    torch.testing.assert_close(vs, ret)
    torch.testing.assert_close(adv, gae_adv)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lambda_1_is_the_discounted_return(seed):
    values, bootstrap, rewards, discounts = _random_rollout(seed)
    vs, _ = vtrace(values, bootstrap, rewards, discounts, torch.zeros_like(values), lam=1.0)
    torch.testing.assert_close(vs, nstep_returns(values, bootstrap, rewards, discounts))
    # and lambda 0 is the one-step TD target
    vs0, _ = vtrace(values, bootstrap, rewards, discounts, torch.zeros_like(values), lam=0.0)
    torch.testing.assert_close(vs0, nstep_returns(values, bootstrap, rewards, discounts, n=1))


def test_nstep_by_hand():
    values, bootstrap, rewards, discounts, _ = _case()
    ret2 = nstep_returns(values, bootstrap, rewards, discounts, n=2)
    # env 0: t=0: 1 + .9*2 + .81*V(s_2)=1.5; t=1: 2 + .9*3 + .81*2; t=2: 3 + .9*2 (cut at T)
    torch.testing.assert_close(ret2[:, 0], torch.tensor([1 + 1.8 + 0.81 * 1.5,
                                                          2 + 2.7 + 0.81 * 2.0, 3 + 1.8]))
    torch.testing.assert_close(ret2[:, 1], torch.tensor([1.0, 1.72, 1.0]))


def test_off_policy_ratio_below_one_shortens_the_trace():
    values, bootstrap, rewards, discounts = _random_rollout(3)
    on, _ = vtrace(values, bootstrap, rewards, discounts, torch.zeros_like(values))
    log_rhos = torch.full_like(values, math.log(0.25))
    off, _ = vtrace(values, bootstrap, rewards, discounts, log_rhos)
    # with every ratio 0.25 the correction is a quarter-weighted, faster-decaying sum
    assert not torch.allclose(on, off)
    gap_on, gap_off = (on - values).abs().mean(), (off - values).abs().mean()
    assert gap_off < gap_on


def test_bad_inputs_name_the_argument():
    values, bootstrap, rewards, discounts = _random_rollout(0)
    with pytest.raises(ValueError, match="bootstrap_value"):
        vtrace(values, bootstrap[:-1], rewards, discounts, torch.zeros_like(values))
    with pytest.raises(ValueError, match="log_rhos"):
        vtrace(values, bootstrap, rewards, discounts, torch.zeros(3))
    with pytest.raises(ValueError, match="lam"):
        gae(values, bootstrap, rewards, discounts, 1.5)
    with pytest.raises(ValueError, match="gamma"):
        episode_discounts(torch.zeros(2, 2, dtype=torch.bool),
                          torch.zeros(2, 2, dtype=torch.bool), 1.1)
    with pytest.raises(ValueError, match="n:"):
        nstep_returns(values, bootstrap, rewards, discounts, n=0)
