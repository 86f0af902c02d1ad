"""The push check shared by the Go1 example's and g1-walk-flat's tests."""

from __future__ import annotations

import numpy as np


def assert_pushes_come_due(envs: list, plan: np.ndarray, action_size: int,
                           steps: int) -> None:
    """envs: a push-free env and its pushed twin, just reset alike; plan: the pushed env's
    (steps until it, vx, vy) per env. Under zero actions the two follow each other exactly
    until each env's push step, then the pushed one moves off in the push's direction."""
    n = len(plan)
    zero = np.zeros((n, action_size))
    speed = np.hypot(plan[:, 1], plan[:, 2])
    apart = np.zeros(n, int)
    for step in range(1, steps + 1):
        before = [env.pool.qvel[:, :2].copy() for env in envs]
        for env in envs:
            env.step(zero)
        same = np.all(envs[0].pool.qpos == envs[1].pool.qpos, axis=1)
        first = (~same) & (apart == 0)
        apart[first] = step
        if first.any():  # the shove's direction shows in the base's velocity change
            dv = (envs[1].pool.qvel[first, :2] - before[1][first]) - \
                (envs[0].pool.qvel[first, :2] - before[0][first])
            cos = (dv * plan[first, 1:]).sum(1) / np.hypot(*dv.T) / speed[first]
            assert (cos > 0.9).all(), cos
    np.testing.assert_array_equal(apart, plan[:, 0])
