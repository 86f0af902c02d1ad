"""Two nodes on one machine: OmniStrategy and the UniLab DDP learners launched as a user launches
them across nodes, by torchrun (``--nnodes 2``, one agent per node rank) and by SLURM (the
variables ``srun`` sets, read by Lightning's SLURMEnvironment), each node with one process and
``Trainer(num_nodes=2, devices=1)``. Every process must know its global rank from its node rank
(local rank 0 on both). Omni's result must be the single-process one; UniLab's learners must
end with the same weights, each rank's collector seeded by its global rank. The commands are
the ones in docs/omni/quickstart.md and docs/unilab/runtime.md."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("multinode_worker.py")
TIMEOUT = 480.0  # seconds per launch: 10-30 s on 2 idle cores, far more on a busy machine
TASK, SEED = "InvertedPendulum-v5", 5
# launcher state a surrounding job could leak into ours
_LEAKS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
          "MASTER_ADDR", "MASTER_PORT")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in _LEAKS and not k.startswith(("SLURM_", "TORCHELASTIC_", "PET_"))}
    path = os.pathsep.join([str(REPO), str(REPO / "tests" / "omni"), str(WORKER.parent)])
    env["PYTHONPATH"] = path + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["OMP_NUM_THREADS"] = "1"
    return env


def _on_path(folder: str) -> None:
    """Helpers of another test folder (pytest adds it only when it collects tests there)."""
    path = str(REPO / "tests" / folder)
    if path not in sys.path:
        sys.path.insert(0, path)


def _torchrun(node_rank: int, port: int, cmd: list[str]) -> tuple[list[str], dict[str, str]]:
    """``torchrun --nnodes 2 --nproc-per-node 1 --node-rank N --master-addr ... CMD``."""
    return ([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
             "--nproc-per-node", "1", "--node-rank", str(node_rank),
             "--master-addr", "127.0.0.1", "--master-port", str(port), *cmd], _base_env())


def _srun(node_rank: int, port: int, cmd: list[str]) -> tuple[list[str], dict[str, str]]:
    """What ``srun --nodes 2 --ntasks-per-node 1 python CMD`` gives task N. No MASTER_ADDR:
    Lightning takes the first host of SLURM_NODELIST, as in a batch job."""
    env = _base_env()
    env.update(SLURM_JOB_ID="4242", SLURM_JOB_NAME="omnilab-multinode",
               SLURM_NODELIST="127.0.0.1", SLURM_NNODES="2", SLURM_NTASKS="2",
               SLURM_NTASKS_PER_NODE="1", SLURM_PROCID=str(node_rank), SLURM_LOCALID="0",
               SLURM_NODEID=str(node_rank), MASTER_PORT=str(port))
    return [sys.executable, *cmd], env


def _launch(launcher, cmd: list[str], logs: Path) -> None:
    """Both node ranks at once; waits for both, kills both (and their children) on a timeout
    or a failure, and fails with their output."""
    port = _free_port()
    logs.mkdir(parents=True, exist_ok=True)
    procs, files = [], []
    try:
        for node in (0, 1):
            args, env = launcher(node, port, cmd)
            out = open(logs / f"node{node}.log", "w+")  # noqa: SIM115 - closed below
            files.append(out)
            # a session of its own: torchrun's workers are killed with their agent
            procs.append(subprocess.Popen(args, cwd=REPO, env=env, stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + TIMEOUT
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() not in (None, 0) for p in procs):
                break  # one failed: its peer would wait for it until its own timeout
            time.sleep(0.2)
    finally:
        hung = [p.poll() is None for p in procs]
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        for out in files:
            out.flush()
    codes = [p.returncode for p in procs]
    report = []
    for node, out in enumerate(files):
        out.seek(0)
        text = "".join(line for line in out if not line.startswith("frame #"))  # C++ stacks
        report.append(f"--- node {node} (exit {codes[node]}, hung {hung[node]}) ---\n"
                      f"{text[-8000:]}")
        out.close()
    assert codes == [0, 0], f"{launcher.__name__} launch failed:\n" + "\n".join(report)


def _results(out: Path) -> list[dict]:
    """What each rank saw; and every rank's run, having ended cleanly, destroyed its process
    group before the interpreter finalized (a gloo group left to finalization can abort the
    process after a run that succeeded)."""
    for r in (0, 1):
        assert (out / f"rank{r}.exit").read_text() == "destroyed", f"rank {r}"
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


def _check_ranks(ranks: list[dict], environment: str) -> None:
    for r, got in enumerate(ranks):
        assert got["environment"] == environment
        assert (got["global_rank"], got["node_rank"], got["local_rank"]) == (r, r, 0)
        assert (got["dist_rank"], got["world_size"], got["dist_world"]) == (r, 2, 2)


# -- OmniStrategy ----------------------------------------------------------------------------
STEPS, BATCH, SAMPLES = 3, 8, 24


@pytest.fixture(scope="module")
def omni_reference():
    _on_path("omni")
    from omni_models import ToyData, reference_run

    return reference_run(STEPS, BATCH, ToyData(SAMPLES))


def _same_as_reference(ranks: list[dict], ref: dict) -> None:
    held = set()
    for got in ranks:
        torch.testing.assert_close(torch.tensor(got["losses"], dtype=torch.float64),
                                   torch.tensor(ref["losses"], dtype=torch.float64),
                                   rtol=1e-7, atol=1e-12)
        for name, p in got["params"].items():
            torch.testing.assert_close(p, ref["params"][name], rtol=1e-7, atol=1e-12,
                                       msg=lambda m, name=name: f"{name}: {m}")
            held.add(name)
    assert held == set(ref["params"]), "every parameter is held (and checked) somewhere"


@pytest.mark.parametrize("launcher,pp,dp,environment", [
    (_torchrun, 2, 1, "TorchElasticEnvironment"),  # a pipeline stage per node
    (_srun, 1, 2, "SLURMEnvironment"),  # a data-parallel replica per node
], ids=["torchrun-pp2", "slurm-dp2"])
def test_omni_across_two_nodes(launcher, pp, dp, environment, omni_reference, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    _launch(launcher, [str(WORKER), "omni", str(out), str(pp), str(dp), str(STEPS), str(BATCH),
                       str(SAMPLES)], tmp_path / "logs")
    ranks = _results(out)
    _check_ranks(ranks, environment)
    _same_as_reference(ranks, omni_reference)
    if pp == 2:  # one stage per node: the LLM blocks are split between them
        assert not set(ranks[0]["params"]) & {n for n in ranks[1]["params"]
                                              if n.startswith("blocks.")}


# -- UniLab DDP learners ---------------------------------------------------------------------
def _unilab_cmd(out: Path, root: Path) -> list[str]:
    """docs/unilab/runtime.md's multi-node command, small and synchronous (repeatable)."""
    report = {"class_path": "multinode_worker.RankReport", "init_args": {"out_dir": str(out)}}
    return ["-m", "lightning_unilab.train", "--config", "recipes/unilab/inverted_pendulum.yaml",
            "--trainer.num_nodes", "2", "--trainer.devices", "1", "--trainer.strategy", "ddp",
            "--trainer.max_time", "null", "--trainer.max_steps", "8",
            "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(root),
            f"--trainer.callbacks+={json.dumps(report)}",
            "--data.mode", "sync", "--data.num_envs", "8", "--data.horizon", "8",
            "--data.collector_threads", "1", "--data.seed", str(SEED),
            "--model.actor_hidden", "[16]", "--model.critic_hidden", "[16]",
            "--model.epochs", "2", "--model.minibatches", "2", "--learner_threads", "1"]


def _start_obs(seed: int) -> torch.Tensor:
    """The first rollout's start observations (float32, as in the batch) of a collector seeded
    with ``seed``."""
    from lightning_unilab.envs.vector_env import TaskVectorEnv

    env = TaskVectorEnv(TASK, 8, 1, seed=seed)
    try:
        obs, _ = env.reset(seed=seed)
        return torch.as_tensor(obs, dtype=torch.float32)
    finally:
        env.close()


def test_unilab_ddp_learners_across_two_nodes(tmp_path):
    """torchrun only: SLURM's side is Lightning's SLURMEnvironment, tested with Omni above (a
    second UniLab launch costs another ~20 s of imports on 2 cores)."""
    _on_path("unilab")
    from shm_probe import our_blocks

    orphans_before = our_blocks(orphans=True)
    out = tmp_path / "out"
    out.mkdir()
    _launch(_torchrun, _unilab_cmd(out, tmp_path / "runs"), tmp_path / "logs")
    ranks = _results(out)
    _check_ranks(ranks, "TorchElasticEnvironment")
    for r, got in enumerate(ranks):
        assert got["steps"] == 8  # two rollouts: 2 epochs x 2 minibatches each
        assert got["seed"] == SEED + r  # the global rank's seed, not the local rank's (0)
        torch.testing.assert_close(got["first_obs"], _start_obs(SEED + r), rtol=0, atol=0)
    assert not torch.equal(ranks[0]["first_obs"], ranks[1]["first_obs"])
    # DDP averaged the gradients: the same weights on both ranks
    torch.testing.assert_close(ranks[0]["params"], ranks[1]["params"], rtol=0, atol=0)
    # the recipe's EvaluationRollout ran on rank 0 after fit (rank 1 took part in the
    # broadcast of the log directory, which hung or failed before)
    assert len(list((tmp_path / "runs").rglob("evaluation/episode.json"))) == 1
    assert not our_blocks(orphans=True) - orphans_before  # each rank removed its ring
