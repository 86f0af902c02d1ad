"""Per-env splitmix64 streams, bit-identical to ``omnilab::Rng`` in cpp/include/omnilab/task.h.

numpy's generators cannot be reproduced in C++, and the C++ tasks' numpy references must draw the
very same start states; splitmix64 is a counter plus a mix, so a whole batch of draws is one
vectorized expression.
"""

from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_ENV_STRIDE = np.uint64(0x632BE59BD9B4E019)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def _for_env(seed: np.ndarray | np.uint64, env: np.ndarray) -> np.ndarray:
    """The start state of Rng::ForEnv(seed, env), elementwise."""
    with np.errstate(over="ignore"):
        return _mix(seed + _ENV_STRIDE * (env.astype(np.uint64) + np.uint64(1)))


class EnvRng:
    """num_envs independent streams; every draw takes the ids of the envs that draw."""

    def __init__(self, num_envs: int, seed: int = 0) -> None:
        self.state = np.zeros(num_envs, np.uint64)
        self.seed(np.arange(num_envs), seed)

    def seed(self, ids: np.ndarray, seed: int) -> None:
        """Stream of env i under seed, as Rng::ForEnv(seed, i)."""
        self.state[ids] = _for_env(np.uint64(seed % 2**64), np.asarray(ids))

    @classmethod
    def for_envs(cls, seeds: np.ndarray, envs: np.ndarray) -> EnvRng:
        """One stream per row, row i's that of Rng::ForEnv(seeds[i], envs[i]) (whole numbers
        below 2**64): streams derived from a key and a counter (an episode's noise key and its
        step), which need no state kept between draws."""
        rng = cls.__new__(cls)
        rng.state = _for_env(np.asarray(seeds).astype(np.uint64), np.asarray(envs))
        return rng

    def uniform(self, ids: np.ndarray, low: np.ndarray | float, high: np.ndarray | float,
                size: int) -> np.ndarray:
        """(len(ids), size) draws; env i's k-th value is its k-th next draw, as in C++."""
        steps = np.arange(1, size + 1, dtype=np.uint64) * _GOLDEN
        with np.errstate(over="ignore"):
            raw = _mix(self.state[ids][:, None] + steps[None, :])
            self.state[ids] += np.uint64(size) * _GOLDEN
        unit = (raw >> np.uint64(11)).astype(np.float64) * 2.0**-53
        low = np.asarray(low, np.float64)
        high = np.asarray(high, np.float64)
        return low + (high - low) * unit
