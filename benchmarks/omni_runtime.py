"""Measured pipelined steps: encoder on stage 0 (Megatron-like) vs uniform insertion (Omni).

Two gloo processes with one thread each run a 2-stage pipeline of the same model, data and
microbatches under both schedules; the encoder's work per microbatch is about one LLM stage's.
For each schedule: the measured step time, stage 0's peak saved activations, the measured
bubble fraction, and the step the simulator predicts for the same plan priced with this run's
per-action timings (median over the measured steps).

Second part, LSSP and grouped reordering through the same engine (PP1 x DP2, one thread per
process, a transformer encoder feeding a light per-token LLM so the encoder work dominates):

* ``step_ms_dp_only`` / ``step_ms_lssp``: each replica's batch is a heavy-tailed mixture (one
  very long sample among short ones); DP-only balances whole samples over the two ranks
  (``reorder=True``), LSSP also runs the long one Ulysses sequence parallel over both
  (``lssp=True, reorder=True``);
* ``step_ms_no_reorder`` / ``step_ms_reorder``: replica 0 loads the long samples, replica 1 the
  short ones; without reordering each encodes its own, with it the plan moves samples;
  ``encoder_imbalance_before/after``: max/mean per-rank encoder cost of the reorder plan (cost
  model fitted in the same run, ``omni_lssp_reorder.calibrate``);
* ``cpu_ms_*``: the slowest rank's process CPU time per step (on a shared machine the wall time
  says more about the neighbours than about the plan).

    python benchmarks/omni_runtime.py [--quick] [--part pipeline|lssp|all] [--out FILE.json]
                                      [--plot FILE.png]
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
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor, nn
from torch.nn import functional as F

from lightning_omni.plan.schedule import COMPUTE_KINDS, Kind
from lightning_omni.plan.simulate import simulate
from lightning_omni.runtime import OmniEngine, ParallelDims, parallelize
from lightning_omni.runtime.metrics import measured_costs
from lightning_omni.spec import Modality, OmniSpec

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))  # omni_lssp_reorder: encoder, rows, calibration
SCHEDULES = ("encoder_first_stage", "uniform_insertion")
HIDDEN, HEADS, SEQ, VOCAB = 192, 4, 128, 64  # a light head: the two stages weigh the same
IMG_IN, IMG_TOKENS = 48, 96  # image rows per sample (placeholders in the sequence)
LLM_BLOCKS, ENC_LAYERS = 4, 3  # 2 blocks per stage; 3 encoder layers on 96 rows ~ 2 on 128
MICRO, NUM_MB = 4, 8  # samples per microbatch, microbatches per step
IMG_ID = 1


class Block(nn.Module):
    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.causal = causal
        self.ln1, self.ln2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.qkv, self.out = nn.Linear(HIDDEN, 3 * HIDDEN), nn.Linear(HIDDEN, HIDDEN)
        self.mlp = nn.Sequential(nn.Linear(HIDDEN, 4 * HIDDEN), nn.GELU(),
                                 nn.Linear(4 * HIDDEN, HIDDEN))

    def forward(self, h: Tensor, mask: Tensor | None = None) -> Tensor:
        b, t, d = h.shape
        q, k, v = self.qkv(self.ln1(h)).view(b, t, 3, HEADS, d // HEADS).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), attn_mask=mask,
                                           is_causal=self.causal and mask is None)
        h = h + self.out(a.transpose(1, 2).reshape(b, t, d))
        return h + self.mlp(self.ln2(h))


class ImageEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(IMG_IN, HIDDEN)
        self.layers = nn.ModuleList(Block(causal=False) for _ in range(ENC_LAYERS))

    def forward(self, x: Tensor, lengths: Tensor) -> Tensor:
        keep = torch.arange(x.shape[1]) < lengths.unsqueeze(1)
        mask = keep[:, None, None, :]
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h, mask)
        return h


class Embedding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, HIDDEN)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.tok(tokens)


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln, self.out = nn.LayerNorm(HIDDEN), nn.Linear(HIDDEN, VOCAB)

    def forward(self, h: Tensor) -> Tensor:
        return self.out(self.ln(h))


def loss_terms(logits: Tensor, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    labels = batch["labels"]
    total = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100,
                            reduction="sum")
    return total, (labels != -100).sum()


def make_spec() -> OmniSpec:
    torch.manual_seed(0)
    enc = ImageEncoder()
    return OmniSpec([Modality("image", enc, "image", "image_len", IMG_ID)], Embedding(),
                    [Block(causal=True) for _ in range(LLM_BLOCKS)], Head(), loss_terms)


def image_text_batch(n: int, seq: int, rows: int, dim: int, vocab: int, image_id: int,
                     seed: int) -> dict[str, Tensor]:
    """``n`` samples of ``seq`` tokens: an image of ``rows`` placeholders, then random text."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(2, vocab, (n, seq), generator=g)
    tokens[:, :rows] = image_id
    labels = torch.full((n, seq), -100)
    labels[:, rows:-1] = tokens[:, rows + 1:]
    return {"tokens": tokens, "labels": labels,
            "image": torch.randn(n, rows, dim, generator=g),
            "image_len": torch.full((n,), rows)}


def make_batch(seed: int) -> dict[str, Tensor]:
    """Every sample has an image of IMG_TOKENS rows, then text."""
    return image_text_batch(MICRO * NUM_MB, SEQ, IMG_TOKENS, IMG_IN, VOCAB, IMG_ID, seed)


def _probe(reps: int = 30) -> float:
    """Seconds for a fixed amount of one LLM block's forward work."""
    torch.manual_seed(0)
    block, x = Block(causal=True), torch.randn(MICRO, SEQ, HIDDEN)
    t0 = time.perf_counter()
    with torch.no_grad():
        for _ in range(reps):
            block(x)
    return time.perf_counter() - t0


def _parallel_slowdown() -> float:
    """How much slower the same work runs when both ranks compute at once than alone: uniform
    insertion turns one rank's idle time into work, which pays only if its core is free."""
    alone = []
    for turn in range(2):
        dist.barrier()
        if dist.get_rank() == turn:
            alone.append(_probe())
        dist.barrier()
    dist.barrier()
    together = _probe()
    mine = torch.tensor([together / alone[0]])
    dist.all_reduce(mine)
    return float(mine) / 2


def _worker(rank: int, port: int, warmup: int, steps: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=timedelta(seconds=300))
    result: dict = {"slowdown_before": _parallel_slowdown()}
    for schedule in SCHEDULES:
        spec = make_spec()
        dims = ParallelDims(pp=2, dp=1, num_microbatches=NUM_MB,
                            schedule=schedule).for_world(2, 2)
        engine = parallelize(spec, dims, dims.layout(rank, spec.costs_of_blocks()),
                             torch.device("cpu"), timedelta(seconds=300))
        opt = torch.optim.SGD([p for m in (spec.embedding, spec.head, *spec.blocks,
                                           spec.modalities[0].encoder) for p in m.parameters()],
                              lr=1e-3)
        times, timings, peaks, busy = [], [], [], []
        for i in range(warmup + steps):
            batch = make_batch(i)
            dt, res = timed_step(engine, opt, batch)
            if i >= warmup:
                times.append(dt)
                gathered = [None, None]
                dist.all_gather_object(gathered, res.record.timings)
                timings.append(gathered)
                peaks.append(res.record.peak_saved_bytes)
                busy.append(res.record.busy_seconds)
        result[schedule] = {"times": times, "timings": timings, "peak": max(peaks),
                            "busy": busy, "plan": res.plan}
    result["slowdown_after"] = _parallel_slowdown()
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def _median_timings(per_step: list) -> list:
    """Per rank and action position: the median (start, end) over steps, as one timing list
    (positions are the same every step: the data and hence the plan do not change)."""
    ranks = len(per_step[0])
    out = []
    for r in range(ranks):
        rows = []
        for j, (a, _, _) in enumerate(per_step[0][r]):
            durations = [step[r][j][2] - step[r][j][1] for step in per_step]
            rows.append((a, 0.0, statistics.median(durations)))
        out.append(rows)
    return out


def timed_step(engine: OmniEngine, opt: torch.optim.Optimizer, batch: dict) -> tuple:
    """One training step of every rank from a barrier; the slowest rank's seconds and the
    step's result."""
    dist.barrier()
    t0 = time.perf_counter()
    opt.zero_grad()
    res = engine.step(batch)
    opt.step()
    dt = torch.tensor([time.perf_counter() - t0])
    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
    return float(dt), res


def run_two_ranks(worker, warmup: int, steps: int) -> tuple[dict, dict]:
    """``worker(rank, port, warmup, steps, out_dir)`` on two spawned processes; what each
    saved as ``rank{r}.pt``."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(worker, args=(port, warmup, steps, out_dir), nprocs=2,
                           start_method="spawn")
        return tuple(torch.load(Path(out_dir) / f"rank{r}.pt", weights_only=False)
                     for r in range(2))


def run(quick: bool) -> tuple[dict, dict]:
    warmup, steps = (1, 3) if quick else (2, 8)
    r0, r1 = run_two_ranks(_worker, warmup, steps)
    summary, detail = {}, {}
    for schedule in SCHEDULES:
        step = statistics.median(r0[schedule]["times"])
        timings = _median_timings(r0[schedule]["timings"])
        plan = r0[schedule]["plan"]
        sim = simulate(plan, measured_costs(plan, timings), record_timeline=True)
        busy = [statistics.median(r[schedule]["busy"]) for r in (r0, r1)]
        summary[f"step_ms_{schedule}"] = 1e3 * step
        summary[f"stage0_activation_mb_{schedule}"] = r0[schedule]["peak"] / 2**20
        summary[f"stage1_activation_mb_{schedule}"] = r1[schedule]["peak"] / 2**20
        summary[f"bubble_fraction_{schedule}"] = 1.0 - sum(busy) / (2 * step)
        summary[f"predicted_step_ms_{schedule}"] = 1e3 * sim.step_seconds
        summary[f"prediction_error_{schedule}"] = sim.step_seconds / step - 1.0
        enc = sum(t1 - t0 for rows in timings for a, t0, t1 in rows
                  if a.kind in (Kind.ENC_FWD, Kind.ENC_BWD))
        llm = sum(t1 - t0 for rows in timings for a, t0, t1 in rows
                  if a.kind in (Kind.LLM_FWD, Kind.LLM_BWD))
        summary[f"encoder_to_stage_work_{schedule}"] = enc / (llm / 2)
        detail[schedule] = {"measured": r0[schedule]["timings"][-1], "simulated": sim}
    summary["speedup"] = (summary["step_ms_encoder_first_stage"]
                          / summary["step_ms_uniform_insertion"])
    summary["stage0_memory_ratio"] = (summary["stage0_activation_mb_encoder_first_stage"]
                                      / summary["stage0_activation_mb_uniform_insertion"])
    summary["steps_measured"] = steps
    # 1.0: two processes compute as fast as one (two free cores); 2.0: they share one
    summary["cpu_parallel_slowdown"] = (r0["slowdown_before"] + r0["slowdown_after"]) / 2
    return summary, detail


def plot(detail: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {Kind.LLM_FWD: "#4c72b0", Kind.LLM_BWD: "#8fb0de", Kind.ENC_FWD: "#dd8452",
              Kind.ENC_BWD: "#f2b58c"}
    fig, axes = plt.subplots(2, 2, figsize=(12, 4.2), sharex=True)
    end = 0.0
    for col, schedule in enumerate(SCHEDULES):
        measured = detail[schedule]["measured"]
        sim = detail[schedule]["simulated"]
        rows = {"measured": [[(t0, t1, a.kind) for a, t0, t1 in measured[r]
                              if a.kind in COMPUTE_KINDS] for r in range(2)],
                "simulated": [[(iv.start, iv.end, iv.kind) for iv in sim.timeline[r]
                               if iv.kind in COMPUTE_KINDS] for r in range(2)]}
        for row, name in enumerate(("measured", "simulated")):
            ax = axes[row][col]
            for r in range(2):
                for t0, t1, kind in rows[name][r]:
                    ax.barh(r, 1e3 * (t1 - t0), left=1e3 * t0, color=colors[kind],
                            edgecolor="white", linewidth=0.3)
                    end = max(end, 1e3 * t1)
            ax.set_yticks([0, 1], ["stage 0", "stage 1"])
            ax.invert_yaxis()
            ax.set_title(f"{schedule}: {name}", fontsize=9)
    for ax in axes[1]:
        ax.set_xlabel("ms")
    for ax in axes.flat:
        ax.set_xlim(0, end * 1.02)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    fig.legend(handles, [str(k) for k in colors], loc="lower center", ncol=4, fontsize=8)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)


TARGETS = {"speedup": 1.2, "stage0_memory_ratio": 1.25, "prediction_error": 0.15}


# -- LSSP and grouped reordering through OmniEngine (PP1 x DP2) -----------------------------
LSSP_HIDDEN, LSSP_VOCAB = 16, 32


class TokenMlp(nn.Module):
    """A light per-token LLM block. Every sample of a replica's batch is padded to its longest
    (a 2048-row sample pads its 23 neighbours to 2056 tokens), the same in both modes; a light
    LLM keeps that padding from hiding the encoder work whose placement this part measures."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(LSSP_HIDDEN, LSSP_HIDDEN)

    def forward(self, h: Tensor) -> Tensor:
        return h + torch.tanh(self.lin(h))


def _lssp_loss(logits: Tensor, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    labels = batch["labels"]
    total = F.cross_entropy(logits.reshape(-1, LSSP_VOCAB), labels.reshape(-1),
                            ignore_index=-100, reduction="sum")
    return total, (labels != -100).sum()


def make_lssp_spec() -> OmniSpec:
    from omni_lssp_reorder import DIM as ENC_DIM
    from omni_lssp_reorder import HEADS, IN_DIM, LAYERS

    from lightning_omni.runtime.token_encoder import TokenEncoder

    torch.manual_seed(0)
    enc = TokenEncoder(IN_DIM, ENC_DIM, HEADS, LAYERS, out_dim=LSSP_HIDDEN)
    return OmniSpec([Modality("image", enc, "image", "image_len", IMG_ID)],
                    nn.Embedding(LSSP_VOCAB, LSSP_HIDDEN), [TokenMlp()],
                    nn.Linear(LSSP_HIDDEN, LSSP_VOCAB), _lssp_loss)


def make_rows_batch(lengths: list[int], seed: int) -> dict[str, Tensor]:
    """Samples with ``lengths`` encoder rows each (placeholders first), then 8 text tokens."""
    from omni_lssp_reorder import IN_DIM, _rows

    b, rows, text = len(lengths), max(lengths), 8
    tokens = torch.randint(2, LSSP_VOCAB, (b, rows + text),
                           generator=torch.Generator().manual_seed(seed))
    labels = torch.full_like(tokens, -100)
    image = torch.zeros(b, rows, IN_DIM)
    for i, n in enumerate(lengths):
        tokens[i, :n] = IMG_ID
        tokens[i, n:rows] = 0
        labels[i, rows:-1] = tokens[i, rows + 1:]
        image[i, :n] = _rows(seed * 1000 + i, n)
    return {"tokens": tokens, "labels": labels, "image": image,
            "image_len": torch.tensor(lengths)}


def lssp_batches(rank: int, cfg: dict) -> dict[str, list[int]]:
    """Per mode, the encoder rows of this replica's samples (see the module docstring)."""
    shorts = [cfg["short"] + (i * 7) % cfg["short"] for i in range(cfg["shorts"])]
    mixture = [cfg["long"], *shorts[1:]] if rank == 0 else shorts
    uneven = ([cfg["reorder_long"] + 8 * i for i in range(cfg["reorder_samples"])] if rank == 0
              else [cfg["reorder_short"] + 4 * i for i in range(cfg["reorder_samples"])])
    return {"dp_only": mixture, "lssp": mixture, "no_reorder": uneven, "reorder": uneven}


def _lssp_worker(rank: int, port: int, cfg: dict, out_dir: str) -> None:
    from omni_lssp_reorder import calibrate

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=timedelta(seconds=300))
    spec = make_lssp_spec()
    box = [calibrate(spec.modalities[0].encoder, 64, cfg["long"]) if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)  # one plan everywhere needs one cost model
    cost = box[0]
    modes = {"dp_only": (False, True), "lssp": (True, True), "no_reorder": None,
             "reorder": (False, True)}
    result: dict = {"cost_model": [cost.seconds_per_token, cost.seconds_per_token_pair]}
    for name, lengths in lssp_batches(rank, cfg).items():
        flags = modes[name]
        lssp, reorder = flags or (False, False)
        dims = ParallelDims(pp=1, dp=2, num_microbatches=1, lssp=lssp, reorder=reorder,
                            locality_groups=(0, 0), encoder_cost=(cost.seconds_per_token,
                                                                  cost.seconds_per_token_pair),
                            ulysses_backend=cfg["backend"]).for_world(2, 2)
        spec = make_lssp_spec()
        engine = parallelize(spec, dims, dims.layout(rank, spec.costs_of_blocks()),
                             torch.device("cpu"), timedelta(seconds=300))
        params = [p for m in (spec.embedding, spec.head, *spec.blocks,
                              spec.modalities[0].encoder) for p in m.parameters()]
        opt = torch.optim.SGD(params, lr=1e-3)
        wall, cpu = [], []
        for i in range(cfg["warmup"] + cfg["steps"]):
            batch = make_rows_batch(lengths, i)
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            opt.zero_grad()
            res = engine.step(batch)
            opt.step()
            dt = torch.tensor([time.perf_counter() - t0, time.process_time() - c0])
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            if i >= cfg["warmup"]:
                wall.append(float(dt[0]))
                cpu.append(float(dt[1]))
        result[f"step_ms_{name}"] = 1e3 * statistics.median(wall)
        result[f"cpu_ms_{name}"] = 1e3 * statistics.median(cpu)
        if res.grouped is not None:
            m = res.grouped.metrics()
            result[f"long_samples_{name}"] = m["lssp/long_samples"]
            if name == "reorder":
                result["encoder_imbalance_before"] = m["reorder/imbalance_before"]
                result["encoder_imbalance_after"] = m["reorder/imbalance_after"]
                result["samples_moved"] = m["reorder/samples_moved"]
            sent = torch.tensor([float(res.record.bytes_sent)])
            dist.all_reduce(sent)
            result[f"bytes_exchanged_{name}"] = float(sent)
    if rank == 0:
        (Path(out_dir) / "lssp.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def run_lssp_reorder(quick: bool) -> dict:
    from omni_lssp_reorder import config, run_two

    cfg = {**config(quick), "backend": "auto"}
    res = run_two(_lssp_worker, cfg, "lssp.json")
    res["lssp_config"] = cfg
    for kind in ("step_ms", "cpu_ms"):
        pre = "" if kind == "step_ms" else "cpu_"
        res[f"{pre}speedup_lssp"] = res[f"{kind}_dp_only"] / res[f"{kind}_lssp"]
        res[f"{pre}speedup_reorder"] = res[f"{kind}_no_reorder"] / res[f"{kind}_reorder"]
    return res


LSSP_TARGETS = [("LSSP vs DP-only (wall)", "speedup_lssp", 1.2, ">="),
                ("reorder vs none (wall)", "speedup_reorder", 1.3, ">="),
                ("imbalance after reordering", "encoder_imbalance_after", 1.1, "<=")]


def report_lssp_reorder(res: dict) -> None:
    print(f"\n{'LSSP / reordering (PP1 x DP2)':34s} {'wall ms':>9s} {'cpu ms':>9s}")
    for name in ("dp_only", "lssp", "no_reorder", "reorder"):
        print(f"{name:34s} {res[f'step_ms_{name}']:9.1f} {res[f'cpu_ms_{name}']:9.1f}")
    print(f"{'speedup LSSP (wall / cpu)':34s} {res['speedup_lssp']:9.2f} "
          f"{res['cpu_speedup_lssp']:9.2f}")
    print(f"{'speedup reorder (wall / cpu)':34s} {res['speedup_reorder']:9.2f} "
          f"{res['cpu_speedup_reorder']:9.2f}")
    print(f"{'encoder imbalance before -> after':34s} {res['encoder_imbalance_before']:9.3f} "
          f"{res['encoder_imbalance_after']:9.3f}")
    for label, key, target, op in LSSP_TARGETS:
        ok = res[key] >= target if op == ">=" else res[key] <= target
        print(f"{label:34s} {res[key]:6.3f} (target {op} {target}) {'OK' if ok else 'MISSED'}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer measured steps (~1 min)")
    ap.add_argument("--out", help="write the numbers as JSON")
    ap.add_argument("--plot", help="write measured vs simulated timelines (PNG)")
    ap.add_argument("--part", choices=("pipeline", "lssp", "all"), default="all",
                    help="the pipelined schedules, LSSP/reordering, or both")
    args = ap.parse_args(argv)
    summary: dict = {"load_average_1min_before": os.getloadavg()[0]}
    if args.part in ("pipeline", "all"):
        summary.update(_pipeline_part(args))
    if args.part in ("lssp", "all"):
        lssp = run_lssp_reorder(args.quick)
        report_lssp_reorder(lssp)
        summary.update(lssp)
    summary["load_average_1min_after"] = os.getloadavg()[0]  # others' work skews timings
    summary["command"] = " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])])
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        Path(args.out).write_text(json.dumps(summary, indent=2))
    return 0


def _pipeline_part(args) -> dict:
    summary, detail = run(args.quick)
    print(f"{'schedule':22s} {'step ms':>9s} {'pred ms':>9s} {'err':>7s} {'bubble':>7s} "
          f"{'st0 act MB':>10s} {'st1 act MB':>10s} {'enc/stage':>9s}")
    for s in SCHEDULES:
        print(f"{s:22s} {summary[f'step_ms_{s}']:9.1f} {summary[f'predicted_step_ms_{s}']:9.1f} "
              f"{summary[f'prediction_error_{s}']:+7.1%} {summary[f'bubble_fraction_{s}']:7.2f} "
              f"{summary[f'stage0_activation_mb_{s}']:10.1f} "
              f"{summary[f'stage1_activation_mb_{s}']:10.1f} "
              f"{summary[f'encoder_to_stage_work_{s}']:9.2f}")
    print(f"two ranks computing at once run {summary['cpu_parallel_slowdown']:.2f}x slower than "
          "one alone (1.00 = two free cores)")
    worst = max(abs(summary[f"prediction_error_{s}"]) for s in SCHEDULES)
    checks = [("uniform insertion speedup", summary["speedup"], TARGETS["speedup"], ">="),
              ("stage-0 activation memory ratio", summary["stage0_memory_ratio"],
               TARGETS["stage0_memory_ratio"], ">="),
              ("worst |prediction error|", worst, TARGETS["prediction_error"], "<=")]
    for name, value, target, op in checks:
        ok = value >= target if op == ">=" else value <= target
        print(f"{name:34s} {value:6.3f} (target {op} {target}) {'OK' if ok else 'MISSED'}")
    summary["bubble_fraction"] = {s: summary[f"bubble_fraction_{s}"] for s in SCHEDULES}
    summary["predicted_step_ms"] = {s: summary[f"predicted_step_ms_{s}"] for s in SCHEDULES}
    if args.plot:
        plot(detail, args.plot)
    return summary


if __name__ == "__main__":
    raise SystemExit(main())
