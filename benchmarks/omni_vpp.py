"""Measured interleaved pipeline: one vs two model chunks per stage (``virtual_pipeline_parallel``).

Two gloo processes with one thread each run the 2-stage pipeline of ``omni_runtime.py`` (same
model and 8 microbatches; 4 LLM blocks: 2 per stage, or 1 per virtual stage with two chunks):
on text-only batches (no encoder work: the LLM pipeline alone) and on ``omni_runtime``'s
image+text batches under both schedules. Per run: the measured step time, the measured bubble
fraction (1 - busy / step, averaged over the ranks), stage 0's peak saved activations and the
step the simulator predicts for the same plan priced with this run's per-action timings (median
over the measured steps, messages free). The runs take turns step by step, so a neighbour's
load falls on all of them alike. Megatron-LM's closed form for the LLM bubble over the ideal
step is ``(pp - 1) / (vpp * m)``: 1/8 with one chunk, 1/16 with two, paid for with twice as
many activation and gradient messages.

    python benchmarks/omni_vpp.py [--quick] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from lightning_omni.plan.simulate import simulate
from lightning_omni.runtime import ParallelDims, parallelize
from lightning_omni.runtime.metrics import measured_costs

sys.path.insert(0, str(Path(__file__).resolve().parent))  # omni_runtime: model and data
from omni_runtime import (  # noqa: E402
    IMG_IN,
    IMG_TOKENS,
    NUM_MB,
    SCHEDULES,
    VOCAB,
    _median_timings,
    make_batch,
    make_spec,
    run_two_ranks,
    timed_step,
)

CHUNKS = (1, 2)
# (batches, schedule): text only has no encoder work, so one schedule stands for both
CASES = (("text", "encoder_first_stage"), *(("image+text", s) for s in SCHEDULES))


def text_batch(seed: int) -> dict:
    """``make_batch``'s samples without their images: text tokens only."""
    b = make_batch(seed)
    n = b["tokens"].shape[0]
    b["tokens"][:, :IMG_TOKENS] = torch.randint(2, VOCAB, (n, IMG_TOKENS),
                                                generator=torch.Generator().manual_seed(seed))
    return {**b, "image": torch.zeros(n, 1, IMG_IN), "image_len": torch.zeros(n, dtype=torch.long)}


def _worker(rank: int, port: int, warmup: int, steps: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=timedelta(seconds=300))
    runs = {}
    for data, schedule in CASES:
        for vpp in CHUNKS:
            torch.manual_seed(0)
            spec = make_spec()
            dims = ParallelDims(pp=2, dp=1, vpp=vpp, num_microbatches=NUM_MB,
                                schedule=schedule).for_world(2, 2)
            engine = parallelize(spec, dims, dims.layout(rank, spec.costs_of_blocks()),
                                 torch.device("cpu"), timedelta(seconds=300))
            params = [p for m in (spec.embedding, spec.head, *spec.blocks,
                                  spec.modalities[0].encoder) for p in m.parameters()]
            runs[data, schedule, vpp] = (engine, torch.optim.SGD(params, lr=1e-3))
    result = {key: {"times": [], "timings": [], "peaks": [], "busy": []} for key in runs}
    # the runs take turns step by step, so a neighbour's load falls on all of them alike
    for i in range(warmup + steps):
        batches = {"text": text_batch(i), "image+text": make_batch(i)}
        for key, (engine, opt) in runs.items():
            batch = batches[key[0]]
            dt, res = timed_step(engine, opt, batch)
            if i >= warmup:
                out = result[key]
                out["times"].append(dt)
                gathered = [None, None]
                dist.all_gather_object(gathered, res.record.timings)
                out["timings"].append(gathered)
                out["peaks"].append(res.record.peak_saved_bytes)
                out["busy"].append(res.record.busy_seconds)
                out["plan"] = res.plan
    for out in result.values():
        out["peak"] = max(out.pop("peaks"))
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def run(quick: bool) -> dict:
    warmup, steps = (1, 3) if quick else (2, 8)
    r0, r1 = run_two_ranks(_worker, warmup, steps)
    rows = {}
    for data, schedule in CASES:
        for vpp in CHUNKS:
            key = (data, schedule, vpp)
            step = statistics.median(r0[key]["times"])
            plan = r0[key]["plan"]
            sim = simulate(plan, measured_costs(plan, _median_timings(r0[key]["timings"])))
            busy = [statistics.median(r[key]["busy"]) for r in (r0, r1)]
            rows[f"{data} {schedule}/vpp{vpp}"] = {
                "step_ms": 1e3 * step, "bubble_fraction": 1.0 - sum(busy) / (2 * step),
                "predicted_step_ms": 1e3 * sim.step_seconds,
                "predicted_bubble_fraction": 1.0 - sum(sim.busy_seconds)
                / (2 * sim.step_seconds),
                "stage0_activation_mb": r0[key]["peak"] / 2**20,
                "messages_per_step": sum(1 for prog in plan.actions for a in prog
                                         if a.kind.value == "send")}
    return {"runs": rows, "steps_measured": steps, "num_microbatches": NUM_MB}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer measured steps")
    ap.add_argument("--out", help="write the numbers as JSON")
    args = ap.parse_args(argv)
    summary: dict = {"load_average_1min_before": os.getloadavg()[0]}
    summary.update(run(args.quick))
    summary["load_average_1min_after"] = os.getloadavg()[0]  # others' work skews timings
    print(f"{'run':36s} {'step ms':>8s} {'bubble':>7s} {'pred ms':>8s} {'pred bubble':>11s} "
          f"{'st0 act MB':>10s} {'sends':>6s}")
    for name, r in summary["runs"].items():
        print(f"{name:36s} {r['step_ms']:8.1f} {r['bubble_fraction']:7.3f} "
              f"{r['predicted_step_ms']:8.1f} {r['predicted_bubble_fraction']:11.3f} "
              f"{r['stage0_activation_mb']:10.1f} {r['messages_per_step']:6d}")
    print(f"load average (1 min) {summary['load_average_1min_before']:.2f} before, "
          f"{summary['load_average_1min_after']:.2f} after")
    summary["command"] = " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])])
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        Path(args.out).write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
