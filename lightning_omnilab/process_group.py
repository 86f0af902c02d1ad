"""Destroy the default process group while the interpreter is still whole.

A gloo process group left to interpreter shutdown can abort a process whose run succeeded
(SIGABRT, "terminate called without an active exception", and torchrun reports the rank as
failed): its worker threads may drop the last reference to a tensor after Python can no longer
take the GIL. Lightning destroys the group at exit for NCCL only. Destroying is not enough when
the last collective ended a few milliseconds before exit: its worker thread is still waiting for
the GIL to release the work's tensors, and the interpreter's finalization (which holds the GIL)
kills that thread mid-destructor. So the release first gives the GIL away for a moment. After a
failure the group is left alone: a peer may still be inside a collective, and the destroy would
wait for it instead of letting the process exit with its traceback.
"""

from __future__ import annotations

import atexit
import time

import torch.distributed as dist

# long enough for a gloo worker thread blocked on the GIL to take it and drop its finished work
GIL_YIELD_S = 0.05


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
            time.sleep(GIL_YIELD_S)  # sleeping releases the GIL to the waiting worker threads
            dist.destroy_process_group()
