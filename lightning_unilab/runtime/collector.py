"""The collector process: a TaskVectorEnv and a CPU copy of the actor, filling ring slots.

    collector = Collector(CollectorConfig("InvertedPendulum-v5", num_envs=64, horizon=32), policy)
    collector.start()                        # spawns the process, returns once it is stepping
    slot, wait_s = collector.acquire()       # oldest ready rollout (raises if the process died)
    batch = as_tensors(collector.ring.arrays(slot), wait_s, collector.spec.info_names)
    ...; collector.release(slot)
    collector.publish(policy)                # new weights; the collector loads them next rollout
    collector.stop()                         # joins the process, unlinks the shared memory

The process is started with ``forkserver`` (``spawn``, with a warning logged, where there is
none or this process cannot use it): no forked torch/OpenMP state. Before each rollout it loads
the newest published weights (a version-word check, a copy only when it moved); in ``sync`` mode
it first waits until the weights of the update on its previous rollout are published: the
synchronous PPO baseline, sharing every other line with the asynchronous mode.

Faults: an exception in the process is sent back with its traceback and re-raised in the learner
as :class:`CollectorError` by the next ``acquire`` (whose wait checks the process every 50 ms),
so a dead collector never hangs the learner; a killed one is named with its signal. A collector
alive but silent (stopped by SIGSTOP, stuck) is what ``acquire``'s timeout is for:
:meth:`Collector.silent_error` names it and its process state. The collector watches a pipe
whose only write end the learner holds (EOF once the learner is gone, even SIGKILLed) between
rollouts and in every wait; then it unlinks the ring and the weight board itself and exits.

Checkpoints: the same pipe carries the learner's request for the collection's state
(:meth:`Collector.get_state`), answered between two rollouts (after a commit, or while waiting
for a free slot or new weights): the envs, the running observations and counters, and the
action-sampling stream, as the next rollout would start from them. A collector started with
such a state (``start(resume=...)``) continues from it.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import multiprocessing as mp
import os
import pickle
import signal
import time
import traceback
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lightning_omnilab.validate import is_int, one_of, positive_int
from lightning_unilab.envs.tasks.ref import TaskRef, task_label, task_ref
from lightning_unilab.runtime.ring import Ring, RingHandle
from lightning_unilab.runtime.rollout import RolloutSpec, RolloutState, collect
from lightning_unilab.runtime.shm import unlink_name
from lightning_unilab.runtime.weights import BoardHandle, WeightBoard

__all__ = ["Collector", "CollectorConfig", "CollectorError", "MODES", "available_cpus",
           "collection_state", "restore_collection"]

MODES = ("async", "sync")

log = logging.getLogger(__name__)


class CollectorError(RuntimeError):
    """The collector process failed; the message carries its traceback."""


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class CollectorConfig:
    """What the collector process builds: the env, its threads, seed and mode.

    ``task``: a built-in task name, or a task class in any form ``task_ref`` takes, kept as a
    :class:`~lightning_unilab.envs.tasks.ref.TaskRef` (import path and init args: the process
    imports the class and builds the task itself)."""

    task: str | TaskRef
    num_envs: int
    horizon: int
    task_kwargs: Mapping[str, Any] = field(default_factory=dict)  # TaskVectorEnv keywords
    threads: int = 1
    seed: int = 0
    mode: str = "async"
    counters: Mapping[str, Any] | None = None  # RolloutState counters to resume from

    def __post_init__(self) -> None:
        object.__setattr__(self, "task", task_ref(self.task))

    def check(self) -> None:
        one_of("mode", self.mode, MODES)
        if isinstance(self.task, TaskRef):  # here, not in the process: errors name the class
            self.task.check()
        cpus = available_cpus()
        if not is_int(self.threads, minimum=1, below=cpus + 1):
            raise ValueError(f"collector threads: expected 1..{cpus} (the CPUs this process may "
                             f"use), got {self.threads!r}; lower the collector's threads")
        for name in ("num_envs", "horizon"):
            positive_int(name, getattr(self, name))
        bad = {"num_threads", "autoreset", "seed", "copy"} & set(self.task_kwargs)
        if bad:
            raise ValueError(f"task_kwargs: {sorted(bad)} are set by the collector; use its "
                             "threads/seed arguments")

    def make_env(self, num_envs: int | None = None, threads: int | None = None) -> Any:
        from lightning_unilab.envs.vector_env import TaskVectorEnv

        return TaskVectorEnv(self.task, num_envs or self.num_envs, threads or self.threads,
                             seed=self.seed, **dict(self.task_kwargs))


class _ParentGone(Exception):
    pass


def collection_state(seed: int, env: Any, state: RolloutState,
                     action_rng: torch.Tensor) -> dict[str, Any]:
    """What the next rollouts depend on besides the weights, between two rollouts: the env's
    full state (:meth:`TaskVectorEnv.get_state`), the rollout's running observations and
    counters, and the action-sampling stream; plain data (numpy arrays, a uint8 tensor, ints)."""
    return {"seed": seed, "env": env.get_state(), "rollout": state.get_state(),
            "action_rng": action_rng.clone()}


def restore_collection(saved: dict[str, Any], seed: int, env: Any,
                       state: RolloutState) -> torch.Tensor:
    """Put :func:`collection_state`'s ``saved`` into a started ``env`` and ``state``; returns the
    action-sampling stream to continue. ValueError naming the entry where ``saved`` is of
    another task, env count or seed."""
    if saved.get("seed") != seed:
        raise ValueError(f"state['seed']: saved by a collector seeded {saved.get('seed')!r}, "
                         f"this one is seeded {seed}")
    rng = saved.get("action_rng")
    if not isinstance(rng, torch.Tensor) or rng.dtype != torch.uint8 or (
            rng.shape != torch.get_rng_state().shape):
        raise ValueError("state['action_rng']: expected the uint8 state of a CPU "
                         "torch.Generator")
    env.set_state(saved.get("env"))
    version = state.policy_version
    state.set_state(saved.get("rollout"))
    state.policy_version = version  # the weights are the learner's to say
    return rng.clone()


def _main(config: CollectorConfig, ring_handle: RingHandle, board_handle: BoardHandle,
          policy_bytes: bytes, lifeline: Any, conn: Any,
          resume: dict[str, Any] | None = None) -> None:
    """Body of the collector process.

    ``lifeline`` is the read end of a pipe whose only write end the learner holds: it becomes
    readable (EOF) when the learner is gone, however it died; the learner also sends its
    requests for the collection's state through it.
    """
    # the learner decides when we stop; Ctrl+C in a terminal reaches the whole process group
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ring = board = env = None

    def alive() -> None:
        while lifeline.poll():
            try:
                request = lifeline.recv()
            except (EOFError, OSError):
                raise _ParentGone from None
            if request == "state":  # called between rollouts only: a consistent state
                conn.send(("state", collection_state(config.seed, env, state,
                                                     torch.get_rng_state())))

    try:
        # the pool's threads step the envs; the actor's batch is a few small matmuls, and extra
        # OpenMP threads spin between them on the cores the pool needs (sync mode collected at
        # 0.69x rsl_rl's speed on 2 cores with 2 torch threads here)
        torch.set_num_threads(1)
        # denormal activations slow a trained policy's forward pass on CPU (the learner's
        # ``flush_denormal``); the actor's actions do not need them
        torch.set_flush_denormal(True)
        torch.manual_seed(config.seed)  # action sampling: a fixed seed gives a repeatable run
        ring = Ring.attach(ring_handle)
        board = WeightBoard.attach(board_handle)
        policy = pickle.loads(policy_bytes)
        policy.eval()
        env = config.make_env()
        state = RolloutState.start(env, seed=config.seed)
        if config.counters:
            state.load_counters(dict(config.counters))
        if resume is not None:
            torch.set_rng_state(restore_collection(resume, config.seed, env, state))
        state.policy_version = board.read_into(policy)
        conn.send(("ready", None))
        used: int | None = None  # weights version of the previous rollout
        while not ring.closed:
            alive()
            if config.mode == "sync" and used is not None:
                if not board.wait_for(used + 1, alive=alive, stop=lambda: ring.closed):
                    break
            if board.version != state.policy_version:
                state.policy_version = board.read_into(policy)
            slot = ring.acquire_write(alive=alive)
            if slot is None:
                break
            collect(env, policy, ring.arrays(slot), state)
            ring.commit(slot, state.seq - 1, state.policy_version, state.env_steps)
            used = state.policy_version
    except _ParentGone:
        # nobody else will remove the shared memory now
        for handle in (ring_handle, board_handle):
            unlink_name(handle.name)
    except BaseException:
        try:
            conn.send(("error", traceback.format_exc()))
        finally:
            os._exit(1)
    finally:
        if env is not None:
            env.close()
        for obj in (ring, board):
            if obj is not None:
                obj.close()


_FORKSERVER_OWNER: list[int] = []  # pid of the process that uses (and started) the forkserver


def _context() -> Any:
    """forkserver where available: a clean interpreter (no forked torch/OpenMP state) like spawn,
    but the imports are paid once per learner process, not once per collector start.

    A process forked from one that started a forkserver cannot use it (Python's forkserver
    client waits on a pid that is not its child): such a process (Lightning's ``ddp_fork``, a
    fork in a notebook) spawns its collectors instead.
    """
    if "forkserver" not in mp.get_all_start_methods():
        log.warning("collector: this platform has no forkserver start method; spawning the "
                    "collector instead (a fresh interpreter: every start pays the imports)")
        return mp.get_context("spawn")
    if not _FORKSERVER_OWNER:
        _FORKSERVER_OWNER.append(os.getpid())
    if _FORKSERVER_OWNER[0] != os.getpid():
        log.warning("collector: process %d was forked from process %d, whose forkserver it "
                    "cannot use; spawning the collector instead (a fresh interpreter: every "
                    "start pays the imports)", os.getpid(), _FORKSERVER_OWNER[0])
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["lightning_unilab.runtime.collector"])
    return ctx


def _stop(proc: Any, ring: Ring, board: WeightBoard, timeout: float) -> None:
    """Shut the ring, join or kill the process, unlink both blocks (finalizer-safe)."""
    try:
        if proc is not None and proc.pid is not None:  # started
            ring.shut()
            if proc.exitcode is None:  # a stopped (SIGSTOP) collector could not see the shut
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
            proc.join(timeout)
            if proc.exitcode is None:
                proc.kill()
                proc.join(timeout)
    finally:
        for obj in (ring, board):
            obj.close()
            obj.unlink()


class Collector:
    """Owns the collector process, its ring and its weight board (learner side).

    Args:
        config: env, threads, seed, mode of the process.
        policy: the learner's ActorCritic (any device): a CPU copy acts in the process, and its
            sizes must match the task's.
        num_slots: the ring's number of slots (see :mod:`lightning_unilab.runtime.ring`).
        writer_policy: the ring's writer policy (see :mod:`lightning_unilab.runtime.ring`).
        spec: the rollout spec if already known (else one env is built here to read the sizes).
        version: the version number of ``policy`` (a resumed run continues its numbering).
    """

    def __init__(self, config: CollectorConfig, policy: nn.Module, num_slots: int = 4,
                 writer_policy: str = "block", spec: RolloutSpec | None = None,
                 version: int = 0) -> None:
        config.check()
        if spec is None:
            env = config.make_env(num_envs=1, threads=1)
            spec = RolloutSpec.from_env(env, config.horizon)
            env.close()
        spec = spec.resized(config.num_envs, config.horizon)
        check_policy(policy, spec, config.task)
        Ring.check_config(spec, num_slots, writer_policy)
        self.config, self.spec = config, spec
        actor = copy.deepcopy(policy).cpu().float()
        self._policy_bytes = pickle.dumps(actor)
        self.ring = Ring.create(spec, num_slots, writer_policy)
        try:
            self.board = WeightBoard.create(actor, version)
        except BaseException:
            self.ring.close()
            self.ring.unlink()
            raise
        self.version = version
        self._device_publisher: Any = None  # a CUDA learner's (device_copy.DevicePublisher)
        self._proc: Any = None
        self._conn: Any = None
        self._lifeline: Any = None
        self._error: str | None = None
        self._finalizer = weakref.finalize(self, _stop, None, self.ring, self.board, 1.0)

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 300.0, resume: dict[str, Any] | None = None) -> None:
        """Spawn the process and wait until it has built its env and stepped into its loop;
        with ``resume`` (a :meth:`get_state`), its envs continue from there."""
        ctx = _context()
        parent, child = ctx.Pipe(duplex=False)
        life_r, life_w = ctx.Pipe(duplex=False)
        self._conn, self._lifeline = parent, life_w
        self._proc = ctx.Process(
            target=_main, name=f"omnilab-collector-{self.config.seed}", daemon=True,
            args=(self.config, self.ring.handle, self.board.handle, self._policy_bytes,
                  life_r, child, resume))
        self._proc.start()
        child.close()
        life_r.close()
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _stop, self._proc, self.ring, self.board, 5.0)
        deadline = time.monotonic() + timeout
        try:
            while not parent.poll(0.05):
                self.check()
                if time.monotonic() > deadline:
                    raise CollectorError(f"the collector did not start within {timeout:.0f} s")
            try:
                kind, payload = parent.recv()
            except EOFError:  # it died before saying anything
                kind, payload = "eof", None
            if kind != "ready":
                self._error = payload
                self._proc.join(5.0)
                self.check()
                raise CollectorError(f"the collector process failed to start ({kind})")
        except BaseException:
            self.stop()
            raise
        config = self.config
        log.info("collector started: pid %d by %s; task %s, %d envs x %d steps per slot, "
                 "%s mode, %d pool threads and 1 torch thread, %d ring slots (%s), seed %d",
                 self._proc.pid, ctx.get_start_method(), config.task, config.num_envs,
                 config.horizon, config.mode, config.threads, self.ring.num_slots,
                 self.ring.writer_policy, config.seed)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the process (join, else kill) and remove the shared memory; idempotent."""
        if not self._finalizer.alive:  # stopped already (a failed start stops itself)
            return
        if self._device_publisher is not None:  # no write into a board about to go
            publisher, self._device_publisher = self._device_publisher, None
            try:
                publisher.wait()
            except RuntimeError as err:
                log.warning("%s", err)
        self._finalizer.detach()
        _stop(self._proc, self.ring, self.board, timeout)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.exitcode is None

    def check(self) -> None:
        """Raise :class:`CollectorError` (with the process's traceback) if it has died."""
        if self._proc is None or self._proc.exitcode is None and self._error is None:
            return
        if self._error is None and self._conn is not None and self._conn.poll():
            try:
                kind, payload = self._conn.recv()
                if kind == "error":
                    self._error = payload
            except (EOFError, OSError):
                pass
        code = self._proc.exitcode
        how = (f"was killed by signal {-code} ({_signal_name(-code)})"
               if code is not None and code < 0 else f"exited with code {code}")
        detail = (f":\n{self._error}" if self._error
                  else " (no traceback: it did not get to send one)")
        raise CollectorError(f"the collector process {self._name()} {how}{detail}")

    def get_state(self, timeout: float = 300.0) -> dict[str, Any]:
        """The collection's state (:func:`collection_state`) as the collector's next rollout
        starts from it: asked through the lifeline, answered once its current rollout is
        committed. CollectorError if the process dies or does not answer within ``timeout``."""
        if self._lifeline is None or not self.running:
            self.check()
            raise RuntimeError("Collector.get_state: the collector is not running")
        self._lifeline.send("state")
        deadline = time.monotonic() + timeout
        while not self._conn.poll(0.05):
            self.check()
            if time.monotonic() > deadline:
                raise self.silent_error(timeout)
        kind, payload = self._conn.recv()
        if kind != "state":
            self._error = payload
            self._proc.join(5.0)
            self.check()
            raise CollectorError(f"the collector process {self._name()} answered {kind!r} to a "
                                 "request for its state")
        return payload

    def silent_error(self, waited: float) -> CollectorError:
        """The error for a collector that is alive but sent no rollout for ``waited`` s."""
        state = _process_state(self._proc.pid) if self._proc is not None else "not started"
        return CollectorError(
            f"the collector process {self._name()} sent no rollout within {waited:.1f} s; it is "
            f"alive but {state}; raise the data module's rollout_timeout if its rollouts take "
            "longer")

    def _name(self) -> str:
        if self._proc is None:
            return "(not started)"
        return f"{self._proc.name} (pid {self._proc.pid})"

    # ------------------------------------------------------------------ data and weights

    def acquire(self, timeout: float | None = None) -> tuple[int | None, float]:
        """(slot, seconds waited): the oldest ready rollout; slot None on timeout or stop."""
        start = time.perf_counter()
        slot = self.ring.acquire_read(timeout=timeout, alive=self.check)
        if slot is None:
            self.check()
        return slot, time.perf_counter() - start

    def release(self, slot: int) -> None:
        self.ring.release(slot)

    def publish(self, policy: nn.Module) -> int:
        """Publish ``policy``'s weights as the next version; returns it."""
        self.version += 1
        device = next(iter(policy.parameters()), torch.empty(0)).device
        if device.type == "cuda":  # copied on a side stream, written from a thread
            if self._device_publisher is None:
                from lightning_unilab.runtime.device_copy import DevicePublisher

                self._device_publisher = DevicePublisher(self.board.publish, device)
            self._device_publisher.publish(policy.state_dict(), self.version)
        else:
            self.board.publish(policy, self.version)
        return self.version


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "an unknown signal"


_STATES = {"T": "stopped (SIGSTOP or a job-control stop)", "t": "stopped by a debugger",
           "D": "blocked in the kernel (uninterruptible wait)", "Z": "a zombie (exited)",
           "R": "running", "S": "sleeping"}


def _process_state(pid: int) -> str:
    """What /proc says the process is doing (Linux; elsewhere "in an unknown state")."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            code = f.read().rsplit(") ", 1)[1][:1]
    except (OSError, IndexError):
        return "in an unknown state"
    return _STATES.get(code, f"in state {code!r}")


def check_policy(policy: Any, spec: RolloutSpec, task: str | TaskRef) -> None:
    """The policy's (obs, critic, action) sizes must be the task's (where it declares them)."""
    for name in ("obs_size", "critic_size", "action_size"):
        have = getattr(policy, name, None)
        want = getattr(spec, name)
        if have is not None and have != want:
            raise ValueError(f"policy.{name}: the network takes {have} but task "
                             f"{task_label(task)!r} has {want}; build the policy from the data "
                             "module's env_spec")
    if not callable(getattr(policy, "act", None)):
        raise TypeError(f"policy: expected a module with act(obs) (an ActorCritic), got "
                        f"{type(policy).__name__}")
