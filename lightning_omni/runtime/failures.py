"""One error type for a step that cannot finish, and one way to turn a collective's failure into it.

gloo and NCCL report a lost or stopped peer as a bare ``RuntimeError`` (or one of its c10d
subclasses) whose text names a socket, not the step. ``communicating`` wraps one communication
call and says what was waited for and how long; the engine adds the rank and the step.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from lightning_omnilab.lost_peer import is_lost_peer

__all__ = ["OmniRuntimeError", "communicating", "is_lost_peer", "naming_lost_peers", "timed_out"]


class OmniRuntimeError(RuntimeError):
    """A step that cannot finish: a lost or stopped peer, a timed-out message or collective."""


@contextmanager
def communicating(what: str, timeout: timedelta | float | None) -> Iterator[None]:
    """Run one communication call; its failure becomes an ``OmniRuntimeError`` naming ``what``
    (the action or collective and its peers), the seconds waited and the timeout."""
    t0 = time.monotonic()
    try:
        yield
    except OmniRuntimeError:
        raise
    except RuntimeError as err:
        raise OmniRuntimeError(
            f"{what}: failed after {time.monotonic() - t0:.1f} s{_limit(timeout)}; a peer rank "
            f"has probably died or stopped ({type(err).__name__}: {err})") from err


@contextmanager
def naming_lost_peers(what: str) -> Iterator[None]:
    """Run work whose collectives ``communicating`` cannot wrap one by one (DTensor
    operators inside the stage's layers, the gathers of a checkpoint's tensors): a lost peer
    becomes an ``OmniRuntimeError`` naming ``what``; any other error passes as it came."""
    try:
        yield
    except OmniRuntimeError:
        raise
    except RuntimeError as err:
        if not is_lost_peer(err):
            raise
        raise OmniRuntimeError(f"{what}: a collective failed; a peer rank has probably died or "
                               f"stopped ({type(err).__name__}: {err})") from err


def timed_out(what: str, waited: float, timeout: timedelta | float | None) -> OmniRuntimeError:
    """The error for a wait that returned without completing."""
    return OmniRuntimeError(f"{what}: not complete after {waited:.1f} s{_limit(timeout)}; a peer "
                            "rank has probably died or stopped")


def _limit(timeout: timedelta | float | None) -> str:
    if timeout is None:
        return ""
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    return f" (timeout {seconds:g} s)"
