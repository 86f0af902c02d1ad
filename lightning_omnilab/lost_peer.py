"""Whether an error is a collective's transport failing (its peer dead or stopped).

gloo raises such failures as a bare ``RuntimeError`` whose text names a socket; NCCL as a
``DistBackendError`` or a ``RuntimeError`` about an aborted communicator. A caller that turns
errors of a computation into its own (a shape probe, a step) must let these through or name
them as lost peers, and must leave every other error as it was raised.
"""

from __future__ import annotations

import re

import torch.distributed as dist

_LOST_PEER = re.compile(
    r"Connection (closed|reset) by peer|Broken pipe|Socket Timeout|Timed out waiting|"
    r"pair closure|communicator was aborted|ncclRemoteError|Watchdog caught")


def is_lost_peer(err: BaseException) -> bool:
    """Whether ``err`` is a transport failure of a collective, not an error of the
    computation around it."""
    return isinstance(err, dist.DistError) or (
        isinstance(err, RuntimeError) and _LOST_PEER.search(str(err)) is not None)
