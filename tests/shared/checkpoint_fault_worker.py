"""A forked process that saves RL-style checkpoints in a loop through a given checkpoint IO, and
can be killed at a chosen step of a save (tests/shared/test_checkpoint_faults.py).

``fork(io, path, saves, fault, tmpdir)`` forks a child that resumes from ``path`` if it is there
(version + 1), saves ``saves`` versions, writing ``saved V`` to the pipe after each, then exits
0. It is forked, not spawned, so that a kill costs no imports. ``fault`` kills the child with
SIGKILL at a point of a save: ``replace:K``: just before the K-th ``os.replace`` of the child (a
rename of the file or of its digest); ``sendfile:K``: halfway through the K-th ``os.sendfile``
(the copy ``shutil.move`` does when the temporary file is on another file system than ``path``).
"""

from __future__ import annotations

import os
import signal
import tempfile
import time

import numpy as np
import torch

SIZE = 1 << 21  # 8 MB of float32: a save takes long enough to be hit


def checkpoint(version: int) -> dict:
    # numpy fills it: a torch op on its thread pool can hang in a forked child
    w = torch.from_numpy(np.full(SIZE, float(version), np.float32))
    return {"version": version, "state_dict": {"w": w},
            "global_step": version}


def install(fault: str) -> None:
    kind, k = fault.split(":")
    target = int(k)
    calls = {"n": 0}
    if kind == "replace":
        real = os.replace

        def replace(src, dst, *a, **kw):
            calls["n"] += 1
            if calls["n"] == target:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(src, dst, *a, **kw)

        os.replace = replace
    elif kind == "sendfile":
        real_sendfile = os.sendfile

        def sendfile(out_fd, in_fd, offset, count):
            calls["n"] += 1
            if calls["n"] == target:
                sent = real_sendfile(out_fd, in_fd, offset, max(1, count // 2))
                if sent:  # a part of the file is in place: die now
                    os.kill(os.getpid(), signal.SIGKILL)
                return sent
            return real_sendfile(out_fd, in_fd, offset, count)

        os.sendfile = sendfile
    else:
        raise ValueError(f"fault: unknown kind {kind!r}")


def _child(io, path: str, saves: int, fault: str | None, tmpdir: str | None, out: int) -> None:
    if tmpdir is not None:
        tempfile.tempdir = tmpdir  # where fsspec's transaction puts its temporary file
    version = io.load_checkpoint(path)["version"] if os.path.exists(path) else 0
    if fault:
        install(fault)
    for _ in range(saves):
        version += 1
        io.save_checkpoint(checkpoint(version), path)
        os.write(out, f"saved {version}\n".encode())


def fork(io, path, saves: int, fault: str | None = None, tmpdir: str | None = None):
    """(pid, a file reading the child's lines)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the test
        code = 1
        try:
            os.close(r)
            _child(io, os.fspath(path), saves, fault, tmpdir, w)
            code = 0
        except BaseException as err:  # noqa: BLE001 - reported to the parent, then exit
            os.write(w, f"error {type(err).__name__}: {err}\n".encode())
        finally:
            os._exit(code)
    os.close(w)
    return pid, os.fdopen(r)


def wait(pid: int, timeout: float = 60.0) -> int:
    """The child's exit: its code, or minus the signal that ended it."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise TimeoutError(f"checkpoint worker {pid} still running after {timeout} s")
        time.sleep(0.01)
