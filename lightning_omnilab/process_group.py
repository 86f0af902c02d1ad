"""Destroy the default process group while the interpreter is still whole.

A gloo process group left to interpreter shutdown can abort a process whose run succeeded
(SIGABRT, "terminate called without an active exception", and torchrun reports the rank as
failed): its worker threads may drop the last reference to a tensor after Python can no longer
take the GIL. Lightning destroys the group at exit for NCCL only. After a failure the group is
left alone: a peer may still be inside a collective, and the destroy would wait for it instead
of letting the process exit with its traceback.
"""

from __future__ import annotations

import atexit

import torch.distributed as dist


class ReleaseAtExit:
    """Arm once the group exists; ``failed()`` when the run raises."""

    def __init__(self) -> None:
        self._failed = False
        self._armed = False

    def arm(self) -> None:
        if not self._armed:
            atexit.register(self._release)
            self._armed = True

    def failed(self) -> None:
        self._failed = True

    def _release(self) -> None:
        if not self._failed and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
