"""RolloutDataModule: rollouts from a collector process as an ordinary Lightning DataLoader.

    dm = RolloutDataModule("InvertedPendulum-v5", num_envs=64, horizon=32)
    module = APPOModule(...)        # builds its ActorCritic from dm.env_spec in setup()
    Trainer(max_steps=500).fit(module, datamodule=dm)

Contract with the LightningModule: it has an attribute ``policy`` (an ActorCritic, built in its
``setup``) and calls ``trainer.datamodule.publish_policy(policy)`` after each update. Each batch
is one ring slot in the :mod:`lightning_unilab.runtime.rollout` format (``as_tensors``: tensors
plus a ``"stats"`` dict), one training step per rollout.

Lifecycle: ``train_dataloader()`` (called after the module's setup) starts the collector with a
CPU copy of ``trainer.lightning_module.policy`` (a sync run with a CPU learner collects in this
process instead, on request: :mod:`lightning_unilab.runtime.inline`, the same rollouts);
``teardown`` stops it and removes the shared memory; so does ``on_exception`` (also
KeyboardInterrupt), and a finalizer at interpreter exit.
Under DDP every rank runs its own collector and ring with seed ``seed + global_rank``.

Zero copy and Lightning's prefetch: Lightning asks for batch i+1 before it runs
training_step(i). The stream therefore yields a placeholder mapping that takes its slot on first
access, when Lightning moves batch i+1 to the device, after training_step(i) has finished and
published its weights. So the learner holds one slot at a time (the previous one is released
then), the slot is taken one update later than at prefetch time (one update less policy lag),
and in sync mode, where batch i+1 cannot exist before
training_step(i) has published, prefetching cannot deadlock: both modes share this code.
``zero_copy=False`` copies each slot into private tensors and releases it at once (cost in
``ring_copy_ms``).

A learner on a GPU (``accelerator="gpu"``): the ring is page-locked where it is
(``pin_ring``), so Lightning's move of a slot to the device is a non-blocking DMA that
overlaps the learner's work; the slot goes back to the collector once that copy has finished
(:mod:`lightning_unilab.runtime.device_copy`). The collector's inference stays on its CPU copy.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset

from lightning_omnilab import quiet
from lightning_omnilab.process_group import ReleaseAtExit
from lightning_omnilab.validate import boolean, one_of, positive_number
from lightning_unilab.envs.randomization import Randomization, randomization_config
from lightning_unilab.envs.tasks import pin_model_params
from lightning_unilab.envs.tasks.base import NumpyTask
from lightning_unilab.envs.tasks.ref import task_config
from lightning_unilab.runtime.checkpoint_arrays import pack, unpack
from lightning_unilab.runtime.collector import MODES, Collector, CollectorConfig, available_cpus
from lightning_unilab.runtime.device_copy import PinnedRegion, copy_to_device
from lightning_unilab.runtime.inline import InlineCollector
from lightning_unilab.runtime.ring import Ring, check_num_slots
from lightning_unilab.runtime.rollout import RolloutSpec, as_tensors

__all__ = ["DATA_MODES", "EnvSpec", "RolloutDataModule", "learner_threads", "resolve_mode"]

log = logging.getLogger(__name__)

# notices every UniLab fit triggers and its user cannot act on (lightning_omnilab.quiet)
quiet.ignore_leafspec_deprecation()
quiet.drop_litlogger_tip()


@dataclass(frozen=True)
class EnvSpec:
    """Sizes the learner builds its networks from."""

    obs_size: int
    critic_size: int
    action_size: int


def _auto_threads(mode: str, local_ranks: int, learner_on_cpu: bool = True) -> int:
    """The collector's share of a rank's CPUs.

    Sync mode, and async mode with a CPU learner: all of them. The learner waits while a slot
    is collected (sync) or for most of each cycle (async), so leaving it a core idles that core
    most of the time; sharing it, the learner preempts one physics thread during its updates
    (G1 on 2 cores: 1,314 trained env steps/s with 2 collector threads against 1,098 with 1,
    ``benchmarks/rl_scaling.py --collector-threads``). Async with a GPU learner: all but one,
    the core that launches the learner's kernels, which the collector must not stall."""
    share = _cpu_share(local_ranks)
    return share if mode == "sync" or learner_on_cpu else max(1, share - 1)


DATA_MODES = ("auto", *MODES)


def resolve_mode(mode: str, learner_on_cpu: bool = True) -> str:
    """``"auto"`` as the mode that reaches a return threshold soonest where the learner runs.

    A CPU learner shares the rank's cores with the collector: run side by side, each runs about
    1.7x slower than alone, so APPO gains about 1.2x in env steps/s and loses more in samples
    to data one update old (HalfCheetah-v5 and Ant-v5 on 2 cores, docs/unilab/results.md):
    sync. A learner on an accelerator leaves the cores to the collector: async.
    """
    one_of("mode", mode, DATA_MODES)
    if mode != "auto":
        return mode
    return "sync" if learner_on_cpu else "async"


def learner_threads(mode: str, local_ranks: int = 1, learner_on_cpu: bool = True) -> int:
    """The learner's torch threads: with a CPU learner in sync mode the collector waits while
    the learner updates, so the update takes the rank's whole share of the CPUs (on 2 cores an
    update of the HalfCheetah recipe runs 1.7x faster on two threads than on one); in async
    mode the collector steps during the update, and a GPU learner only launches kernels: one
    thread."""
    one_of("mode", mode, ("sync", "async"))
    return _cpu_share(local_ranks) if mode == "sync" and learner_on_cpu else 1


def _cpu_share(local_ranks: int) -> int:
    """One rank's share of this machine's CPUs."""
    return max(1, available_cpus() // max(1, local_ranks))


def _every_rank(obj: Any) -> list[Any]:
    """``obj`` of every rank (gathered under torch.distributed), or ``[obj]``."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _identity(batch: Any) -> Any:
    return batch


class _DeferredBatch(Mapping):
    """A batch that takes its ring slot on first access; rebuilt from a mapping it is a dict.

    Lightning fetches batch i+1 before ``training_step(i)``. This placeholder is what it
    fetches; the slot is taken when Lightning moves batch i+1 to the device (its
    ``apply_to_collection`` rebuilds the mapping as ``type(batch)(items)``, which ``__new__``
    answers with the real dict), i.e. after step i has published its weights: in sync mode the
    collector writes slot i+1 only then, so fetching it earlier would deadlock.

    Why not Lightning's public alternative, ``training_step(self, dataloader_iter)`` (no
    prefetch): it showed no conclusive gain (docs/unilab/runtime.md), and it would move the
    deferral into every module that reads this data module: each would have to fetch and move
    its own batch, pass ``batch_size`` to every ``self.log`` (Lightning cannot infer it there),
    and give its callbacks' ``on_train_batch_start`` the previous batch; a module with a plain
    ``training_step(batch, batch_idx)`` would deadlock in sync mode. The placeholder keeps that
    contract inside the data module. Were Lightning ever to read a batch when it prefetches it,
    tests/unilab/test_data.py's sync test would hang.
    """

    def __new__(cls, data: Mapping | None = None, fetch: Callable[[], dict] | None = None):
        if data is not None:  # Lightning's apply_to_collection rebuilds mappings this way
            return dict(data)
        return super().__new__(cls)

    def __init__(self, data: Mapping | None = None,
                 fetch: Callable[[], dict] | None = None) -> None:
        self._fetch = fetch
        self._data: dict | None = None

    def _get(self) -> dict:
        if self._data is None:
            assert self._fetch is not None
            self._data, self._fetch = self._fetch(), None
        return self._data

    def __getitem__(self, key: str) -> Any:
        return self._get()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


class _RolloutStream(IterableDataset):
    def __init__(self, dm: RolloutDataModule) -> None:
        self.dm = dm

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        return self.dm._stream()


class RolloutDataModule(pl.LightningDataModule):
    """Rollouts of a TaskVectorEnv collected in a separate process (in sync mode with a CPU
    learner: in this one, see ``inline``), one rollout per batch.

    Args:
        task: task name (``lightning_unilab.envs.tasks.task_names()``), or a task class: a
            NumpyTask subclass, its import path "pkg.module.Class", or ``{"class_path": ...,
            "init_args": {...}}`` (a recipe's form). The collector process imports the class
            and builds the task; checkpoints keep the class path and init args
            (:mod:`lightning_unilab.envs.tasks.ref`).
        num_envs: N, the envs of a rollout.
        horizon: T, the steps of a rollout.
        task_kwargs: further TaskVectorEnv keywords (``params``, ``nonfinite``, ...).
        randomization: reset-time domain randomization (a
            :class:`~lightning_unilab.envs.randomization.Randomization`, e.g. ``G1Randomization``),
            passed to the env; a recipe names it by ``class_path``.
        num_slots: ring slots (>= 2: one read while one is written).
        writer_policy: "block" (default) or "overwrite_oldest".
        mode: "async" (APPO), "sync" (the collector waits for the latest weights: PPO), or
            "auto": sync with a CPU learner, async with a learner on an accelerator
            (:func:`resolve_mode`; decided when the Trainer's device is known).
        collector_threads: CPU threads of the collector (env pool and actor). None: every CPU
            this process may use in sync mode (the learner waits while it collects), all but
            one in async mode (the learner's), at least one.
        seed: env seed of rank 0; rank r uses seed + r.
        zero_copy: yield views of the slot (True) or private copies.
        pin_ring: with a CUDA learner, page-lock the ring in place so slots copy to the GPU
            without blocking (False: ordinary copies, e.g. where page-locking is not allowed).
        read_newest: take the newest ready slot and drop the older ones (counted in
            ``slots_dropped``): slots that went stale while the learner updated are never
            trained on, and the collector never waits. False: every slot, oldest first.
        start_timeout: seconds the collector may take to build its env.
        inline: sync mode collects in the learner's own process, when it asks for a batch
            (:mod:`lightning_unilab.runtime.inline`: the same rollouts, without a process to
            start or a hand-off per rollout). None: inline for a sync run with a CPU learner;
            False: always a collector process.
        rollout_timeout: seconds the learner waits for one rollout before it raises
            ``CollectorError`` naming the collector and its process state: a collector that
            is alive but silent (stopped, stuck) ends the run instead of hanging it. None: wait
            as long as the collector lives (a dead one is reported within 50 ms either way).
    """

    def __init__(
        self,
        task: str | dict[str, Any] | type[NumpyTask] = "InvertedPendulum-v5",
        num_envs: int = 64,
        horizon: int = 32,
        task_kwargs: dict[str, Any] | None = None,
        randomization: Randomization | None = None,
        num_slots: int = 4,
        writer_policy: str = "block",
        mode: str = "async",
        collector_threads: int | None = None,
        seed: int = 0,
        zero_copy: bool = True,
        start_timeout: float = 300.0,
        read_newest: bool = False,
        pin_ring: bool = True,
        inline: bool | None = None,
        rollout_timeout: float | None = 300.0,
    ) -> None:
        super().__init__()
        # loggers and checkpoints get plain data (weights-only loading reads it back): a task
        # class as {class_path, init_args}, a user's randomization likewise
        task, env_randomization = task_config(task), randomization
        randomization = randomization_config(randomization)  # type: ignore[assignment]
        # the physics step and like parameters at their values now: a checkpoint evaluated or
        # resumed after a default moved keeps the physics it trained on
        task_kwargs = pin_model_params(task, task_kwargs)
        self.save_hyperparameters()
        randomization = env_randomization
        self.task = task
        env_kwargs = dict(task_kwargs or {})
        if randomization is not None:
            if env_kwargs.get("randomization") is not None:
                raise ValueError("randomization: given both as an argument and in task_kwargs; "
                                 "keep one")
            if not callable(randomization):
                raise TypeError(f"randomization: expected a Randomization (callable as "
                                f"(rng, ids) -> draws), got {type(randomization).__name__}")
            env_kwargs["randomization"] = randomization
        self._auto_threads = collector_threads is None
        self.requested_mode = one_of("mode", mode, DATA_MODES)
        mode = resolve_mode(mode)  # a CPU learner until the Trainer says otherwise
        self.config = CollectorConfig(task, num_envs, horizon, env_kwargs,
                                      collector_threads or _auto_threads(mode, 1), seed, mode)
        self.config.check()
        check_num_slots(num_slots)
        self.num_slots, self.writer_policy = num_slots, writer_policy
        self.zero_copy = boolean("zero_copy", zero_copy)
        self.read_newest = boolean("read_newest", read_newest)
        self.slots_dropped = 0
        self.start_timeout = positive_number("start_timeout", start_timeout)
        self.rollout_timeout = positive_number("rollout_timeout", rollout_timeout, none_ok=True)
        self._spec: RolloutSpec | None = None
        self.collector: Collector | InlineCollector | None = None
        self.counters: dict[str, Any] = {}  # of the latest slot read (checkpointed)
        self.policy_version = 0
        self.slots_read = 0
        self.ring_copy_s = 0.0  # time spent turning slots into tensors (copies, if any)
        self.pin_ring = boolean("pin_ring", pin_ring)
        if inline is not None and not isinstance(inline, bool):
            raise TypeError(f"inline: expected True, False or None, got {inline!r}")
        if inline and self.requested_mode == "async":
            raise ValueError("inline: collecting in the learner's process needs mode 'sync' "
                             "(or 'auto' with a CPU learner), got mode 'async'")
        self.inline = inline
        self._pinned: PinnedRegion | None = None
        self._fetched: int | None = None  # the slot the latest batch views (zero copy)
        self._device_copies: dict[int, Any] = {}  # slot -> CUDA event of its copy
        self._collections: list[dict[str, Any]] = []  # a checkpoint's, until the next start

    # ------------------------------------------------------------------ sizes

    @property
    def rollout_spec(self) -> RolloutSpec:
        """The batch layout (builds one env here, once, to read the task's sizes)."""
        if self._spec is None:
            env = self.config.make_env(num_envs=1, threads=1)
            try:
                self._spec = RolloutSpec.from_env(env, self.config.horizon)
            finally:
                env.close()
            self._spec = self._spec.resized(self.config.num_envs, self.config.horizon)
            Ring.check_config(self._spec, self.num_slots, self.writer_policy)
        return self._spec

    @property
    def env_spec(self) -> EnvSpec:
        spec = self.rollout_spec
        return EnvSpec(spec.obs_size, spec.critic_size, spec.action_size)

    # ------------------------------------------------------------------ lifecycle

    def setup(self, stage: str) -> None:
        self.rollout_spec  # noqa: B018 - fail on impossible configs before anything starts

    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        module = trainer.lightning_module if trainer is not None else None
        policy = getattr(module, "policy", None)
        if policy is None:
            raise RuntimeError("RolloutDataModule: the LightningModule has no `policy` yet; build "
                               "it in the module's setup() from datamodule.env_spec")
        rank = trainer.global_rank if trainer is not None else 0
        self.stop_collector()
        if trainer is not None:
            on_cpu = trainer.strategy.root_device.type == "cpu"
            self.choose_mode(on_cpu)
        if self._auto_threads and trainer is not None:  # the CPUs are shared by this node's ranks
            threads = _auto_threads(self.config.mode, trainer.num_devices, on_cpu)
            self.config = CollectorConfig(**{**self.config.__dict__, "threads": threads})
        config = CollectorConfig(**{**self.config.__dict__, "seed": self.config.seed + rank,
                                    "counters": self.counters or None})
        resume = self._saved_collection(config.seed)
        # a resumed run continues its version numbers (the module checkpoints its own count)
        if self._collects_inline(trainer is None or on_cpu):
            self.collector = InlineCollector(config, policy, self.rollout_spec,
                                             version=self.policy_version)
        else:
            self.collector = Collector(config, policy, self.num_slots, self.writer_policy,
                                       spec=self.rollout_spec, version=self.policy_version)
        try:
            self.collector.start(self.start_timeout, resume=resume)
        except BaseException:
            self.stop_collector()
            raise
        return DataLoader(_RolloutStream(self), batch_size=None, collate_fn=_identity)

    def _collects_inline(self, learner_on_cpu: bool) -> bool:
        if self.config.mode != "sync":
            if self.inline:
                raise ValueError("inline: collecting in the learner's process needs mode "
                                 f"'sync'; mode {self.requested_mode!r} chose "
                                 f"{self.config.mode!r} for this learner")
            return False
        return learner_on_cpu if self.inline is None else self.inline

    def choose_mode(self, learner_on_cpu: bool) -> str:
        """Settle ``mode="auto"`` for the learner's device (a given mode stays); returns it."""
        mode = resolve_mode(self.requested_mode, learner_on_cpu)
        if mode != self.config.mode:
            log.info("mode auto: %s (the learner is on the %s)", mode,
                     "CPU" if learner_on_cpu else "accelerator")
            self.config = CollectorConfig(**{**self.config.__dict__, "mode": mode})
        return mode

    def publish_policy(self, policy: torch.nn.Module) -> int:
        """Make ``policy``'s weights (and normalizer) the collector's; returns the version."""
        if self.collector is None:
            raise RuntimeError("publish_policy: no collector is running (train_dataloader() "
                               "starts it)")
        self.policy_version = self.collector.publish(policy)
        return self.policy_version

    def transfer_batch_to_device(self, batch: Any, device: torch.device,
                                 dataloader_idx: int) -> Any:
        """To a GPU: non-blocking from the page-locked ring; the slot is handed back to the
        collector only after the copy's event (see ``_release``)."""
        if device.type != "cuda":
            return super().transfer_batch_to_device(batch, device, dataloader_idx)
        if self.pin_ring and self._pinned is None and isinstance(self.collector, Collector):
            self._pinned = PinnedRegion(self.collector.ring.buffer)
        out, done = copy_to_device(dict(batch), device)  # dict(): takes a deferred slot
        if done is not None and self._fetched is not None:
            self._device_copies[self._fetched] = done
        return out

    def _release(self, collector: Collector | InlineCollector, slot: int) -> None:
        done = self._device_copies.pop(slot, None)
        if done is not None:
            done.synchronize()  # the DMA reads the slot until then
        collector.release(slot)

    def stop_collector(self) -> None:
        for done in self._device_copies.values():
            done.synchronize()
        self._device_copies.clear()
        if self._pinned is not None:  # before the ring's mapping goes
            self._pinned.close()
            self._pinned = None
        if self.collector is not None:
            collector, self.collector = self.collector, None
            collector.stop()

    def teardown(self, stage: str) -> None:
        self.stop_collector()
        # a DDP run's gloo group, whatever the LightningModule (APPOModule arms it too);
        # Lightning calls this hook only after a fit that did not raise
        if dist.is_available() and dist.is_initialized():
            ReleaseAtExit().arm()

    def on_exception(self, exception: BaseException) -> None:
        self.stop_collector()

    # ------------------------------------------------------------------ checkpoint

    def state_dict(self) -> dict[str, Any]:
        """Counters, the weights version, and every rank's collection state (``collections``,
        gathered under DDP: each rank's envs, running observations and action stream,
        :func:`~lightning_unilab.runtime.collector.collection_state`). Collecting in this
        process (sync, CPU learner) that is where the next rollout starts, so a resumed run
        collects what the uninterrupted run would have; a collector process answers between
        two rollouts, after the rollouts already in the ring (docs/reliability.md, "Resume")."""
        state = {"counters": dict(self.counters), "policy_version": self.policy_version,
                 "slots_read": self.slots_read, "slots_dropped": self.slots_dropped}
        collector = self.collector
        mine = collector.get_state() if collector is not None and collector.running else None
        collections = [pack(c) for c in _every_rank(mine) if c is not None]
        if collections:
            state["collections"] = collections
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.counters = dict(state_dict.get("counters", {}))
        self.policy_version = int(state_dict.get("policy_version", 0))
        self.slots_read = int(state_dict.get("slots_read", 0))
        self.slots_dropped = int(state_dict.get("slots_dropped", 0))
        saved = state_dict.get("collections")
        if saved is None:  # a checkpoint of one collection, rank 0's (before DDP ranks saved)
            saved = [state_dict["collection"]] if "collection" in state_dict else []
        self._collections = [unpack(c) for c in saved]

    def _saved_collection(self, seed: int) -> dict[str, Any] | None:
        """The checkpoint's collection state of the envs seeded ``seed`` (this rank's), once."""
        saved, self._collections = self._collections, []
        mine = [c for c in saved if c.get("seed") == seed]
        if saved and not mine:  # a resume with more ranks than the run saved
            log.info("resuming: this rank's envs (seed %d) start fresh episodes; the checkpoint "
                     "holds those of seeds %s", seed, [c.get("seed") for c in saved])
        return mine[0] if mine else None

    # ------------------------------------------------------------------ the stream

    def _stream(self) -> Iterator[Mapping[str, Any]]:
        held: deque[int] = deque()
        while True:
            # taken when Lightning first touches it: after the previous training step
            yield _DeferredBatch(fetch=lambda: self._next(held, hold=0))

    def _next(self, held: deque[int], hold: int) -> dict[str, Any]:
        collector = self.collector
        if collector is None:
            raise RuntimeError("RolloutDataModule: the collector is not running")
        while len(held) > hold:
            self._release(collector, held.popleft())
        slot, wait_s = collector.acquire(timeout=self.rollout_timeout)
        if slot is None:
            if isinstance(collector, Collector) and not collector.ring.closed:
                raise collector.silent_error(wait_s)
            raise RuntimeError("RolloutDataModule: the collector was stopped")
        while self.read_newest:  # a newer one is ready: this one went stale meanwhile
            newer, _ = collector.acquire(timeout=0.0)
            if newer is None:
                break
            collector.release(slot)
            slot = newer
            self.slots_dropped += 1
        start = time.perf_counter()
        arrays = collector.ring.arrays(slot)
        batch = as_tensors(arrays, wait_s, collector.spec.info_names)
        if self.read_newest:
            batch["stats"]["slots_dropped"] = self.slots_dropped
        self._fetched = slot if self.zero_copy else None
        if self.zero_copy:
            held.append(slot)
        else:
            batch = {k: v.clone() if isinstance(v, torch.Tensor) else v
                     for k, v in batch.items()}
            collector.release(slot)
        self.ring_copy_s += time.perf_counter() - start
        log.debug("slot %d: seq %d, policy version %d, waited %.1f ms", slot, int(arrays["seq"]),
                  int(arrays["policy_version"]), 1e3 * wait_s)
        self.slots_read += 1
        self.counters = {"seq": int(arrays["seq"]) + 1, "env_steps": int(arrays["env_steps"]),
                         "episodes_total": int(arrays["episodes_total"]),
                         "recent_return_mean": float(arrays["recent_return_mean"]),
                         "recent_length_mean": float(arrays["recent_length_mean"])}
        return batch
