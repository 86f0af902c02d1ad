"""Termination terms: (n,) bools saying an episode has failed (a fall), or (n, k) contacts.

Contacts come from MuJoCo contact sensors (``<contact geom1=... geom2="floor" num="1"
data="found"/>``, or ``body1=``/``subtree1=`` for a whole body), read from the pool's
``sensordata`` output: the pool gathers derived arrays but not MuJoCo's contact list, and a
sensor does the per-env matching in C inside the step.
"""

from __future__ import annotations

import numpy as np

__all__ = ["base_too_low", "body_contact", "contact_found", "nonfinite", "tilted"]


def contact_found(sensordata: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """(n, k) bool: which of k contact sensors (their columns, from ``sensor_columns``) found a
    contact. sensordata is (n, nsensordata)."""
    return sensordata[:, columns] > 0


def body_contact(sensordata: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """(n,) bool: any of the contact sensors found a contact: e.g. the torso or a knee touching
    the floor, a fall for a walker."""
    return contact_found(sensordata, columns).any(axis=1)


def base_too_low(height: np.ndarray, min_height: float) -> np.ndarray:
    """(n,) bool: the base is below min_height (flat ground: its world z)."""
    return height < min_height


def tilted(gravity: np.ndarray, max_tilt: float) -> np.ndarray:
    """(n,) bool: the base's up axis is more than max_tilt radians from vertical, judged from
    the projected gravity (n, 3): -g_z is the cosine of the tilt."""
    return -gravity[:, 2] < np.cos(max_tilt)


def nonfinite(first: np.ndarray, *more: np.ndarray) -> np.ndarray:
    """(n,) bool: a row of any of the (n, ...) arrays (qpos, qvel ...) holds NaN or inf: the
    state can no longer be simulated, so the episode ends."""
    bad = ~np.isfinite(first).reshape(len(first), -1).all(axis=1)
    for a in more:
        bad |= ~np.isfinite(a).reshape(len(a), -1).all(axis=1)
    return bad
