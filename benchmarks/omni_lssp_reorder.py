"""LSSP and grouped reordering at run time, measured on 2 gloo processes (one thread each).

    python benchmarks/omni_lssp_reorder.py [--quick] [--out FILE.json]

Data parallel 2, a transformer encoder (``TokenEncoder``) forward + backward per step:

* LSSP: every microbatch holds many short samples and one very long one (heavy tail).
  ``step_ms_dp_only`` runs every sample whole on one rank (longest-first placement);
  ``step_ms_lssp`` runs the long one Ulysses sequence parallel over both ranks (plan_lssp).
* Reordering: rank 0's loader returns the long samples, rank 1's the short ones.
  ``step_ms_no_reorder`` encodes where loaded; ``step_ms_reorder`` all-gathers metadata, moves
  samples per plan_reorder, encodes, and returns features with the autograd all-to-all.
  ``encoder_imbalance_before/after``: max/mean per-rank encoder cost of the plan (cost model
  calibrated in this run), and ``measured_imbalance_*`` the same from measured encoder times.

``cpu_ms_*`` is the slowest rank's process CPU time for the same steps: on a machine shared with
other work the wall times say more about the neighbours than about the plan, while CPU time
still shows each rank's share of the work (it leaves out waiting, so it flatters nothing that
computes).

Targets (issue 11): LSSP >= 1.2x faster than DP-only, reordering >= 1.3x faster than none,
imbalance after reordering <= 1.1. A step time is the slowest rank's (max over ranks).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lightning_omni.runtime.lssp_exec import (  # noqa: E402
    EncoderCost,
    build_exec_plan,
    plan_encoder_lssp,
    run_lssp_microbatch,
)
from lightning_omni.runtime.sample_exchange import GroupedReorder, SampleMeta  # noqa: E402
from lightning_omni.runtime.token_encoder import TokenEncoder  # noqa: E402

IN_DIM, DIM, HEADS, LAYERS = 16, 64, 4, 2


def _encoder() -> TokenEncoder:
    torch.manual_seed(0)
    return TokenEncoder(IN_DIM, DIM, HEADS, LAYERS, out_dim=DIM)


def _rows(sid: int, n: int) -> torch.Tensor:
    return torch.randn(n, IN_DIM, generator=torch.Generator().manual_seed(sid))


def _time_fwd_bwd(enc: TokenEncoder, n: int, reps: int) -> float:
    x = _rows(0, n)[None]
    ts = []
    for _ in range(reps + 1):
        t = time.perf_counter()
        enc(x).sum().backward()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts[1:])


def calibrate(enc: TokenEncoder, short: int, long: int) -> EncoderCost:
    """Fit seconds = a*L + b*L^2 to two measured lengths."""
    t1, t2 = _time_fwd_bwd(enc, short, 5), _time_fwd_bwd(enc, long, 3)
    b = max((t2 / long - t1 / short) / (long - short), 0.0)
    a = max(t1 / short - b * short, 1e-12)
    return EncoderCost(a, b, bytes_per_token=1.0)


def _slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _gather(value: float) -> list[float]:
    out = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(out, torch.tensor([value], dtype=torch.float64))
    return [float(x) for x in out]


def bench_lssp(enc, cost, rank, world, cfg) -> dict:
    lengths = {0: cfg["long"]}
    lengths.update({1 + i: cfg["short"] + (i * 7) % cfg["short"] for i in range(cfg["shorts"])})
    owner = {s: s % world for s in lengths}
    out = {}
    for name, heads in (("dp_only", 1), ("lssp", HEADS)):
        # heads=1 admits no SP degree above 1: the planner places every sample whole
        plan = plan_encoder_lssp([lengths], cost, world, heads, memory_cap=float("inf"))
        ex = build_exec_plan(plan.microbatches[0], lengths, owner)
        inputs = {s: _rows(s, n) for s, n in lengths.items() if owner[s] == rank}
        times, cpu = [], []
        for i in range(cfg["warmup"] + cfg["steps"]):
            enc.zero_grad(set_to_none=True)
            dist.barrier()
            t, c = time.perf_counter(), time.process_time()
            res = run_lssp_microbatch(enc, ex, inputs, list(range(world)))
            loss = res.anchor.sum() * 0 + sum(f.square().mean() for f in res.features.values())
            loss.backward()
            seconds, cpu_s = time.perf_counter() - t, time.process_time() - c
            if i >= cfg["warmup"]:
                times.append(_slowest(seconds))
                cpu.append(_slowest(cpu_s))
        out[f"step_ms_{name}"] = 1e3 * statistics.median(times)
        out[f"cpu_ms_{name}"] = 1e3 * statistics.median(cpu)
        out[f"long_samples_{name}"] = len(plan.microbatches[0].sp_groups)
    return out


def bench_reorder(enc, cost, rank, world, cfg) -> dict:
    n_each = cfg["reorder_samples"]
    if rank == 0:  # one rank's loader happens to get the long samples
        loaded = {i: cfg["reorder_long"] + 8 * i for i in range(n_each)}
    else:
        loaded = {100 + i: cfg["reorder_short"] + 4 * i for i in range(n_each)}
    inputs = {s: _rows(s, n) for s, n in loaded.items()}
    out: dict = {}
    ex = GroupedReorder([0] * world, cost=lambda n: cost.item(0, n).seconds)
    for name in ("no_reorder", "reorder"):
        times, busy, phases, cpu = [], [], [], []
        for i in range(cfg["warmup"] + cfg["steps"]):
            enc.zero_grad(set_to_none=True)
            dist.barrier()
            t, c = time.perf_counter(), time.process_time()
            if name == "reorder":
                gp = ex.plan([SampleMeta(s, n, cost.item(s, n).seconds)
                              for s, n in sorted(loaded.items())])
                t_plan = time.perf_counter()
                mine = ex.exchange(gp, inputs, (IN_DIM,), torch.float32)
            else:
                mine = inputs
                t_plan = time.perf_counter()
            t_enc = time.perf_counter()
            sids = sorted(mine)
            feats = {s: enc(mine[s][None])[0] for s in sids} if cfg["per_sample"] else \
                _batched(enc, mine, sids)
            if name == "reorder":
                feats, anchor = ex.return_features(gp, feats, (DIM,), torch.float32)
            else:
                anchor = torch.zeros(())
            loss = anchor.sum() * 0 + sum(f.square().mean() for f in feats.values())
            loss.backward()
            t_end, cpu_s = time.perf_counter(), time.process_time() - c
            if i >= cfg["warmup"]:
                busy.append(t_end - t_enc)  # before the max-reduce, which waits for the slowest
                phases.append((t_plan - t, t_enc - t_plan))
                times.append(_slowest(t_end - t))
                cpu.append(_slowest(cpu_s))
        out[f"step_ms_{name}"] = 1e3 * statistics.median(times)
        out[f"cpu_ms_{name}"] = 1e3 * statistics.median(cpu)
        if name == "reorder":
            out["plan_ms"] = 1e3 * statistics.median(p[0] for p in phases)
            out["exchange_ms"] = 1e3 * statistics.median(p[1] for p in phases)
        per_rank = _gather(statistics.median(busy))
        out[f"measured_imbalance_{'before' if name == 'no_reorder' else 'after'}"] = \
            max(per_rank) / (sum(per_rank) / len(per_rank))
        if name == "reorder":
            out["encoder_imbalance_before"] = gp.plan.imbalance_before
            out["encoder_imbalance_after"] = gp.plan.imbalance_after
            out["samples_moved"] = sum(len(v) for s in gp.plan.sends for v in s.values())
    out["bytes_exchanged_per_step"] = ex.bytes_sent / (cfg["warmup"] + cfg["steps"])
    return out


def _batched(enc, mine, sids):
    from lightning_omni.runtime.lssp_exec import encoder_many

    return dict(zip(sids, encoder_many(enc, [mine[s] for s in sids]), strict=True))


def config(quick: bool) -> dict:
    """The heavy-tailed mixtures (also used by ``omni_runtime.py``'s engine-level run)."""
    cfg = dict(long=2048, short=24, shorts=24, warmup=2, steps=6, reorder_samples=8,
               reorder_long=512, reorder_short=32, per_sample=False)
    if quick:
        cfg.update(long=1536, shorts=16, warmup=1, steps=3, reorder_samples=6, reorder_long=384)
    return cfg


def run_two(worker, cfg: dict, name: str) -> dict:
    """``worker(rank, port, cfg, out_dir)`` on 2 spawned processes; rank 0 writes ``name``."""
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / "build" / "torch_extensions"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(worker, args=(port, cfg, d), nprocs=2, start_method="spawn")
        return json.loads((Path(d) / name).read_text())


def _worker(rank: int, port: int, cfg: dict, out_dir: str) -> None:
    world = 2
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        enc = _encoder()
        cost = calibrate(enc, 64, cfg["long"]) if rank == 0 else None
        box = [cost]
        dist.broadcast_object_list(box, src=0)  # one plan everywhere needs one cost model
        cost = box[0]
        res = {"cost_model": {"seconds_per_token": cost.seconds_per_token,
                              "seconds_per_token_pair": cost.seconds_per_token_pair}}
        res.update(bench_lssp(enc, cost, rank, world, cfg))
        res.update(bench_reorder(enc, cost, rank, world, cfg))
        if rank == 0:
            (Path(out_dir) / "result.json").write_text(json.dumps(res))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer, smaller steps (< 60 s)")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    args = ap.parse_args()
    cfg = config(args.quick)
    res = run_two(_worker, cfg, "result.json")
    res["config"] = cfg
    res["load_average_1min_after"] = os.getloadavg()[0]  # others' work skews the timings
    res["speedup_lssp"] = res["step_ms_dp_only"] / res["step_ms_lssp"]
    res["speedup_reorder"] = res["step_ms_no_reorder"] / res["step_ms_reorder"]
    checks = [("LSSP vs DP-only", res["speedup_lssp"], ">= 1.2", res["speedup_lssp"] >= 1.2),
              ("reorder vs none", res["speedup_reorder"], ">= 1.3",
               res["speedup_reorder"] >= 1.3),
              ("imbalance after", res["encoder_imbalance_after"], "<= 1.1",
               res["encoder_imbalance_after"] <= 1.1)]
    print(f"{'metric':34s} {'value':>10s}")
    res["cpu_speedup_lssp"] = res["cpu_ms_dp_only"] / res["cpu_ms_lssp"]
    res["cpu_speedup_reorder"] = res["cpu_ms_no_reorder"] / res["cpu_ms_reorder"]
    for k in ("step_ms_dp_only", "step_ms_lssp", "step_ms_no_reorder", "step_ms_reorder",
              "cpu_ms_dp_only", "cpu_ms_lssp", "cpu_ms_no_reorder", "cpu_ms_reorder",
              "cpu_speedup_lssp", "cpu_speedup_reorder", "load_average_1min_after",
              "encoder_imbalance_before", "encoder_imbalance_after",
              "measured_imbalance_before", "measured_imbalance_after",
              "bytes_exchanged_per_step", "samples_moved", "plan_ms", "exchange_ms"):
        print(f"{k:34s} {res[k]:10.3f}")
    print()
    for name, value, target, ok in checks:
        print(f"{name:34s} {value:10.3f}  target {target}: {'met' if ok else 'MISSED'}")
    res["targets_met"] = {name: ok for name, _, _, ok in checks}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
