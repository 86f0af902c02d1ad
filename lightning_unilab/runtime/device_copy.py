"""Ring slots to a GPU learner: the ring page-locked in place, slots copied without blocking.

A CUDA copy from ordinary (pageable) memory goes through a staging buffer and blocks the
learner; from page-locked memory it is a DMA that runs while the learner goes on. The ring is
shared memory that the collector keeps writing, so it is registered with CUDA where it is
(``cudaHostRegister``): no private pinned copy of each slot. The learner may then hand a slot
back only once its copy has finished, so each copy records a CUDA event and ``release`` waits on
it (by then long done: the update that reads the copy ran after it).

Weights go the other way: ``DevicePublisher`` copies a CUDA module's state to page-locked host
tensors on a side stream and writes the weight board from a thread once the copy is done, so
the learner's next update starts without waiting for the collector's copy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch


class PinnedRegion:
    """Shared memory registered with CUDA as page-locked (undone by ``close``)."""

    def __init__(self, buf: np.ndarray) -> None:
        self.ptr, self.nbytes = int(buf.ctypes.data), int(buf.nbytes)
        err = torch.cuda.cudart().cudaHostRegister(self.ptr, self.nbytes, 0)
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister of the rollout ring ({self.nbytes} bytes) "
                               f"failed with CUDA error {int(err)}; pass pin_ring=False to copy "
                               "from ordinary memory")
        self._buf = buf  # the mapping must outlive the registration

    def close(self) -> None:
        if self._buf is not None:
            torch.cuda.cudart().cudaHostUnregister(self.ptr)
            self._buf = None


def copy_to_device(batch: Mapping[str, Any], device: torch.device
                   ) -> tuple[dict[str, Any], torch.cuda.Event | None]:
    """``batch``'s tensors on ``device`` (non-blocking to CUDA), and the event after which its
    host memory may be reused (None: the copies are done when this returns)."""
    cuda = device.type == "cuda"
    out = {k: (v.to(device, non_blocking=cuda) if isinstance(v, torch.Tensor) else v)
           for k, v in batch.items()}
    if not cuda:
        return out, None
    done = torch.cuda.Event()
    done.record(torch.cuda.current_stream(device))
    return out, done


class DevicePublisher:
    """Publishes a CUDA module's state to a weight board without stalling the learner."""

    def __init__(self, write: Callable[[Mapping[str, torch.Tensor], int], None],
                 device: torch.device) -> None:
        self._write, self.device = write, device
        self._host: dict[str, torch.Tensor] | None = None
        self._stream = torch.cuda.Stream(device)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def publish(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        self.wait()  # the previous version's write (done long ago: an update has run since)
        if self._host is None:
            self._host = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=True)
                          for k, v in state.items()}
        main = torch.cuda.current_stream(self.device)
        self._stream.wait_stream(main)  # the copy sees the finished update
        with torch.cuda.stream(self._stream):
            for k, v in state.items():
                self._host[k].copy_(v.detach(), non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(self._stream)
        main.wait_stream(self._stream)  # the next update may not overwrite what is copied
        host = self._host

        def write() -> None:
            try:
                copied.synchronize()
                self._write(host, version)
            except BaseException as err:  # surfaced by the next publish or wait
                self._error = err

        self._thread = threading.Thread(target=write, name="weight-publish", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Until the last publish is on the board; re-raises its error."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise RuntimeError(f"publishing weights to the collector failed: {err}") from err
