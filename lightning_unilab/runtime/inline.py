"""Synchronous collection in the learner's own process: the collector's loop without a process.

In sync mode the learner waits while a rollout is collected and the collector waits while the
learner updates, so a second process buys nothing on a CPU learner and costs its start (a fresh
interpreter importing torch, about 2 s) and a hand-off per rollout (weights through the board,
the slot through the ring, two processes waking each other). :class:`InlineCollector` runs the
same :func:`~lightning_unilab.runtime.rollout.collect` on a CPU copy of the actor when the
learner asks for a batch, with the process collector's settings: one torch thread while
acting, and action sampling on its own random stream seeded as the process seeds its own. So
its rollouts are the process collector's, bit for bit (``tests/unilab/test_inline.py``).

It offers the learner side of :class:`~lightning_unilab.runtime.collector.Collector` that
:class:`~lightning_unilab.runtime.data.RolloutDataModule` uses: ``start``, ``acquire``,
``release``, ``publish``, ``stop``, ``ring.arrays``, ``spec`` and ``config``.
"""

from __future__ import annotations

import copy
import logging
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from lightning_unilab.runtime.collector import (
    CollectorConfig,
    check_policy,
    collection_state,
    restore_collection,
)
from lightning_unilab.runtime.rollout import RolloutSpec, RolloutState, collect

__all__ = ["InlineCollector"]

log = logging.getLogger(__name__)


class _Slots:
    """Two private batches in place of the ring: one may still be viewed by the previous
    batch's tensors while the next is written."""

    def __init__(self, spec: RolloutSpec) -> None:
        self._arrays = [spec.allocate(), spec.allocate()]

    def arrays(self, slot: int) -> dict[str, np.ndarray]:
        return self._arrays[slot]


class InlineCollector:
    """Collects a rollout whenever the learner acquires one, with the latest published weights.

    Args:
        config: env, threads, seed of the collection (``mode`` must be "sync").
        policy: the learner's ActorCritic on the CPU; a float32 copy acts.
        spec: the rollout spec (resized to the config's envs and horizon).
        version: the version number of ``policy`` (a resumed run continues its numbering).
    """

    def __init__(self, config: CollectorConfig, policy: nn.Module, spec: RolloutSpec,
                 version: int = 0) -> None:
        config.check()
        if config.mode != "sync":
            raise ValueError(f"mode: the inline collector collects in turns with the learner "
                             f"(sync), got {config.mode!r}")
        spec = spec.resized(config.num_envs, config.horizon)
        check_policy(policy, spec, config.task)
        self.config, self.spec, self.version = config, spec, version
        self.actor = copy.deepcopy(policy).cpu().float().eval()
        self.ring = _Slots(spec)
        # the process collector seeds its process's generator with the env seed
        self._rng = torch.Generator().manual_seed(config.seed).get_state()
        self._env: Any = None
        self._state: RolloutState | None = None
        self._next_slot = 0

    def start(self, timeout: float = 300.0,  # noqa: ARG002 - the process's signature
              resume: dict[str, Any] | None = None) -> None:
        """Build the env and reset it (the process collector's start, in this process); with
        ``resume`` (a :meth:`get_state`), continue from there."""
        env = self.config.make_env()
        try:
            state = RolloutState.start(env, seed=self.config.seed)
            if self.config.counters:
                state.load_counters(dict(self.config.counters))
        except BaseException:
            env.close()
            raise
        state.policy_version = self.version
        self._env, self._state = env, state
        config = self.config
        log.info("collecting in the learner's process (sync mode): task %s, %d envs x %d steps "
                 "per rollout, %d pool threads, seed %d", config.task, config.num_envs,
                 config.horizon, config.threads, config.seed)
        if resume is not None:
            self.set_state(resume)

    @property
    def running(self) -> bool:
        return self._env is not None

    def acquire(self, timeout: float | None = None) -> tuple[int | None, float]:
        """(slot, seconds spent collecting): a new rollout, or None where ``timeout`` is 0 (a
        newer one than the last is never waiting: collection happens on request)."""
        if timeout is not None and timeout <= 0:
            return None, 0.0
        if self._env is None or self._state is None:
            raise RuntimeError("InlineCollector: not started (or stopped)")
        start = time.perf_counter()
        slot, self._next_slot = self._next_slot, 1 - self._next_slot
        threads, rng = torch.get_num_threads(), torch.get_rng_state()
        torch.set_num_threads(1)  # a few small matmuls: as the process collector acts
        torch.set_rng_state(self._rng)
        try:
            with torch.no_grad():
                collect(self._env, self.actor, self.ring.arrays(slot), self._state)
        finally:
            self._rng = torch.get_rng_state()
            torch.set_rng_state(rng)
            torch.set_num_threads(threads)
        return slot, time.perf_counter() - start

    def release(self, slot: int) -> None:
        """Nothing to hand back: the slot is written again two rollouts later."""

    def publish(self, policy: nn.Module) -> int:
        """``policy``'s weights (and normalizer) for the next rollouts; returns their version."""
        with torch.no_grad():
            state = policy.state_dict()
            for key, dst in self.actor.state_dict().items():
                dst.copy_(state[key].detach())
        self.version += 1
        if self._state is not None:
            self._state.policy_version = self.version
        return self.version

    def get_state(self) -> dict[str, Any]:
        """What the next rollouts depend on besides the weights: the env's full state
        (:meth:`TaskVectorEnv.get_state`), the rollout's running observations and counters,
        the action-sampling stream and the slot to write next; plain data (numpy arrays, a
        uint8 tensor, ints, str). A checkpoint of a sync run keeps it, so that a resumed run
        collects the rollouts the uninterrupted run would have."""
        if self._env is None or self._state is None:
            raise RuntimeError("InlineCollector: not started (or stopped)")
        return {**collection_state(self.config.seed, self._env, self._state, self._rng),
                "next_slot": self._next_slot}

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`get_state` (after :meth:`start`, which built the env). ValueError
        naming the entry where the state is of another task, env count or seed."""
        if self._env is None or self._state is None:
            raise RuntimeError("InlineCollector: start() it before set_state")
        next_slot = state.get("next_slot", 0)  # a process collector's state has none
        if next_slot not in (0, 1):
            raise ValueError(f"state['next_slot']: expected 0 or 1, got {next_slot!r}")
        self._rng = restore_collection(state, self.config.seed, self._env, self._state)
        self._next_slot = int(next_slot)

    def stop(self, timeout: float = 5.0) -> None:  # noqa: ARG002 - the process's signature
        """Close the env; idempotent."""
        env, self._env = self._env, None
        if env is not None:
            env.close()
