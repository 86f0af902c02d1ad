"""OmniStrategy at PP1 x DP2 against Lightning's DDPStrategy: the same model, batches and
microbatching, steps/s as a ratio measured in one run, and where Omni's step time goes.

Two gloo processes with one thread each. Per model (the multimodal recipe's
``MultimodalCaptioner`` and the LLaVA tiny recipe's ``LlavaCaptioner``), per round, one fit
under each strategy, the order alternating between rounds (so drift of a shared machine hits
both):

* ``omni``: ``OmniStrategy(pipeline_parallel=1, num_microbatches=M)`` on batches of ``B``
  samples per replica, split into ``M`` microbatches of ``B / M``, gradients summed over them,
  one all-reduce, one optimizer step;
* ``ddp``: ``DDPStrategy`` with ``accumulate_grad_batches=M`` on loader batches of ``B / M``:
  ``M`` forwards and backwards of ``B / M`` samples (Lightning skips DDP's all-reduce on all
  but the last), one optimizer step. Both loaders go through Lightning's distributed sampler
  (2 replicas, no shuffling), so step ``k`` of either run trains on the same ``2 * B`` samples
  in the same microbatches: the same work. The one difference in what is computed: Omni
  normalizes the loss by the global count of labelled tokens, DDP each microbatch by its own
  (then 1/M and the mean over ranks), which changes the gradient's weights, not its cost.
  And the padding: Omni's microbatches are slices of the replica's batch, collated (padded) to
  its longest encoder sample, DDP's loader batches to their own longest; with heavy-tailed
  audio (the multimodal recipe) Omni's encoders see more padding rows.
  ``find_unused_parameters=True``: a microbatch without images (or audio) leaves an encoder
  unused, which DDP refuses otherwise.

Warm-up steps are not timed. Per fit (rank 0): ``steps_per_s`` = 1 / the median wall time of
the timed steps (a step: from the end of one optimizer step to the end of the next; the median
keeps a neighbour's burst on a shared machine out), ``throughput`` = timed steps / their total
wall time, ``cpu_steps_per_s`` = timed steps / this process's CPU time over them. Per strategy
the median over rounds; ``ratio`` = omni / ddp of the ``steps_per_s`` medians
(``throughput_ratio``, ``cpu_ratio`` likewise). ``first_loss_*``: the global loss of step 0
(token-weighted over both replicas) reported by Omni, and recomputed for the DDP run from its
microbatches before any update: they agree when both did the same work.

Breakdown (ms per step, exclusive times, median over timed steps and rounds, rank 0): see
``ROWS``.

    python benchmarks/omni_overhead.py [--quick] [--rounds R] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "omni"))  # spawn: torchrun-like env on gloo processes
sys.path.insert(0, str(REPO / "benchmarks"))  # spawned processes import this file by its name

BATCH, MICRO = 16, 4  # samples per replica and step, microbatches (both recipes' values)
MODELS = ("multimodal", "llava_tiny")

ROWS = {  # breakdown rows: what each one times (exclusive of the rows nested in it)
    "omni": {
        "metadata_exchange": "engine._gather: all_gather_object of every rank's sample "
                             "metadata (encoder rows per sample), to plan the step",
        "plan": "engine._plan less the exchange: building the step's schedule",
        "encoder_fwd": "executor ENC_FWD actions (image/audio encoders and projectors)",
        "encoder_bwd": "executor ENC_BWD actions",
        "llm_fwd": "executor LLM_FWD actions (embedding, blocks, head, loss)",
        "llm_bwd": "executor LLM_BWD actions",
        "grad_allreduce": "executor ALLREDUCE actions: one flat all-reduce of the gradients "
                          "over the two replicas",
        "executor_other": "executor.run less its actions (state, waits, bookkeeping)",
        "finish": "engine._finish: all-reduce of loss and metric sums, gradient division",
        "engine_other": "engine.step less the above (microbatch split, checks)",
        "training_step_glue": "OmniStrategy.training_step less engine.step (gradients set "
                              "aside, outputs)",
        "backward_glue": "OmniStrategy.backward (gradients put back, precision hooks)",
        "optimizer": "Strategy.optimizer_step less its closure: AdamW step, zero_grad",
        "lightning_loop": "the step's wall time less all of the above: data loading, "
                          "batch transfer, hooks, callbacks",
    },
    "ddp": {
        "forward": "DDPStrategy.training_step, M microbatches",
        "backward": "DDPStrategy.backward, M microbatches (the gradient all-reduce runs in "
                    "the last one's hooks, overlapped with it)",
        "optimizer": "Strategy.optimizer_step less its closure: AdamW step, zero_grad",
        "lightning_loop": "the step's wall time less all of the above",
    },
}
KIND_ROWS = {"enc_fwd": "encoder_fwd", "enc_bwd": "encoder_bwd", "llm_fwd": "llm_fwd",
             "llm_bwd": "llm_bwd", "allreduce": "grad_allreduce"}


class Clock:
    """Exclusive times of wrapped methods, summed per step (a stack: a call's time less the
    wrapped calls inside it)."""

    def __init__(self) -> None:
        self.cur: dict[str, float] = defaultdict(float)
        self.stack: list[float] = []  # time of nested wrapped calls, per open call

    def wrap(self, obj: Any, attr: str, row: str, split=None) -> None:
        fn = getattr(obj, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            self.stack.append(0.0)
            t0 = time.perf_counter()
            try:
                out = fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                inner = self.stack.pop()
                if self.stack:
                    self.stack[-1] += dt
            own = dt - inner
            if split is not None:  # parts of this call's time given to other rows
                for r, s in split(out).items():
                    self.cur[r] += s
                    own -= s
            self.cur[row] += own
            return out

        setattr(obj, attr, timed)

    def close(self) -> dict[str, float]:
        out, self.cur = dict(self.cur), defaultdict(float)
        return out


def _action_split(record: Any) -> dict[str, float]:
    parts: dict[str, float] = defaultdict(float)
    for a, t0, t1 in record.timings:
        row = KIND_ROWS.get(a.kind.value)
        if row is not None:
            parts[row] += t1 - t0
    return parts


class Recorder(pl.Callback):
    """Per optimizer step: end time and the clock's times; the first step's global loss."""

    def __init__(self, name: str, clock: Clock, loss_terms) -> None:
        self.name, self.clock, self.loss_terms = name, clock, loss_terms
        self.ends: list[float] = []
        self.cpu: list[float] = []  # this process's CPU time at the same points
        self.parts: list[dict[str, float]] = []
        self.first_loss: float | None = None
        self._sums = torch.zeros(2, dtype=torch.float64)
        self._seen = 0
        self._wrapped_engine = False

    def on_train_start(self, trainer, module) -> None:
        s, c = trainer.strategy, self.clock
        for attr, row in (("training_step", "training_step_glue" if self.name == "omni"
                           else "forward"),
                          ("backward", "backward_glue" if self.name == "omni" else "backward"),
                          ("optimizer_step", "optimizer")):
            c.wrap(s, attr, row)
        if self.name == "omni":
            e = s.engine
            c.wrap(e, "step", "engine_other")
            c.wrap(e, "_plan", "plan")
            c.wrap(e, "_gather", "metadata_exchange")
            c.wrap(e, "_finish", "finish")

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        s = trainer.strategy
        if self.name == "omni" and not self._wrapped_engine and s.engine.executor is not None:
            self.clock.wrap(s.engine.executor, "run", "executor_other", _action_split)
            self._wrapped_engine = True
        if self.name == "ddp" and self._seen < MICRO:  # step 0's microbatches, no update yet
            with torch.no_grad():
                total, count = self.loss_terms(module(batch), batch)
            self._sums += torch.tensor([float(total), float(count)], dtype=torch.float64)
            self._seen += 1
            if self._seen == MICRO:
                torch.distributed.all_reduce(self._sums)
                self.first_loss = float(self._sums[0] / self._sums[1])

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if self.name == "omni" and self.first_loss is None:
            self.first_loss = float(outputs["loss"])
        if len(self.ends) < trainer.global_step:  # an optimizer step ended in this batch
            self.ends.append(time.perf_counter())
            self.cpu.append(time.process_time())
            self.parts.append(self.clock.close())


def _fixed_width(batch: dict) -> dict:
    """Encoder rows padded to the data's longest image (64 patches) and audio (96 frames)."""
    from lightning_omni.examples.multimodal_data import MAX_FRAMES, PATCH, RESOLUTIONS

    for name, width in (("image", (max(RESOLUTIONS) // PATCH) ** 2), ("audio", MAX_FRAMES)):
        x = batch[name]
        batch[name] = torch.nn.functional.pad(x, (0, 0, 0, width - x.shape[1]))
    return batch


def _build(model_name: str, steps: int, per_step: int, fixed_padding: bool = False):
    """(module, datamodule, loss terms) of a recipe's model; the loader's batch ``per_step``."""
    samples = 2 * BATCH * steps
    if model_name == "multimodal":
        from lightning_omni.examples.multimodal_data import MultimodalCaptionData
        from lightning_omni.examples.multimodal_model import MultimodalCaptioner, caption_loss

        # recipes/omni/multimodal.yaml's model, its data's first stage
        model = MultimodalCaptioner(hidden=64, layers=4, heads=4, encoder_dim=32,
                                    encoder_heads=4, encoder_layers=2, lr=0.003)
        data = MultimodalCaptionData(batch_size=per_step, samples_per_epoch=samples)
        if fixed_padding:
            from lightning_omni.examples import multimodal_data as md

            data.train_dataloader = lambda: torch.utils.data.DataLoader(
                data.train_set, batch_size=per_step, shuffle=False,
                collate_fn=lambda s: _fixed_width(md.collate(s)))
        return model, data, caption_loss
    from lightning_omni.examples.llava_data import LlavaCaptionData
    from lightning_omni.examples.llava_model import LlavaCaptioner, LlavaShape
    from lightning_omni.integrations.hf_llava import causal_lm_loss

    model = LlavaCaptioner(LlavaShape(), lr=0.003)  # recipes/omni/llava_tiny.yaml's shape
    data = LlavaCaptionData(image_size=32, patch_size=8, image_tokens=model.image_tokens,
                            batch_size=per_step, samples_per_epoch=samples, image_fraction=0.7)
    return model, data, causal_lm_loss


def _fit(name: str, model_name: str, steps: int, fixed_padding: bool) -> dict[str, Any]:
    from lightning.pytorch.strategies import DDPStrategy

    from lightning_omni import OmniStrategy

    pl.seed_everything(0, verbose=False)
    if name == "omni":
        strategy, per_step, accumulate = OmniStrategy(pipeline_parallel=1,
                                                      num_microbatches=MICRO), BATCH, 1
    else:
        strategy = DDPStrategy(process_group_backend="gloo", find_unused_parameters=True)
        per_step, accumulate = BATCH // MICRO, MICRO
    model, data, terms = _build(model_name, steps, per_step, fixed_padding)
    rec = Recorder(name, Clock(), terms)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_steps=steps,
                         accumulate_grad_batches=accumulate, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         limit_val_batches=0, callbacks=[rec])
    trainer.fit(model, data)
    return {"ends": rec.ends, "cpu": rec.cpu, "parts": rec.parts, "first_loss": rec.first_loss}


def _worker(rank: int, world: int, rounds: int, warmup: int, steps: int,
            models: list[str], fixed_padding: bool = False) -> dict:
    import logging

    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "lightning_omni"):
        logging.getLogger(name).setLevel(logging.ERROR)
    out: dict = {}
    for model_name in models:
        for r in range(rounds):
            order = ("omni", "ddp") if r % 2 == 0 else ("ddp", "omni")
            for name in order:
                out.setdefault(model_name, {}).setdefault(name, []).append(
                    _fit(name, model_name, warmup + steps, fixed_padding))
    return out


def _summarize(runs: list[dict], warmup: int) -> dict[str, Any]:
    rates, throughputs, cpu_rates, parts = [], [], [], []
    for run in runs:
        ends, cpu = run["ends"], run["cpu"]
        timed = len(ends) - warmup
        walls = [b - a for a, b in zip(ends[warmup - 1:], ends[warmup:], strict=False)]
        rates.append(1.0 / statistics.median(walls))
        throughputs.append(timed / (ends[-1] - ends[warmup - 1]))
        cpu_rates.append(timed / (cpu[-1] - cpu[warmup - 1]))
        for wall, p in zip(walls, run["parts"][warmup:], strict=True):
            parts.append({**p, "lightning_loop": wall - sum(p.values()), "step": wall})
    rows = sorted({k for p in parts for k in p})
    breakdown = {k: 1e3 * statistics.median(p.get(k, 0.0) for p in parts) for k in rows}
    return {"steps_per_s": statistics.median(rates), "rounds_steps_per_s": rates,
            "rounds_throughput": throughputs, "rounds_cpu_steps_per_s": cpu_rates,
            "breakdown_ms": breakdown, "first_loss": runs[0]["first_loss"]}


def run(rounds: int, warmup: int, steps: int, models: list[str],
        fixed_padding: bool = False) -> dict:
    from omni_models import spawn

    r0, _ = spawn(_worker, 2, rounds, warmup, steps, models, fixed_padding, timeout=3000.0)
    out: dict = {}
    for model_name in models:
        omni = _summarize(r0[model_name]["omni"], warmup)
        ddp = _summarize(r0[model_name]["ddp"], warmup)
        paired = [a / b for a, b in zip(omni["rounds_steps_per_s"], ddp["rounds_steps_per_s"],
                                        strict=True)]
        out[model_name] = {
            "omni_steps_per_s": omni["steps_per_s"], "ddp_steps_per_s": ddp["steps_per_s"],
            "ratio": omni["steps_per_s"] / ddp["steps_per_s"],
            "ratio_per_round": paired,
            "rounds": {"omni_steps_per_s": omni["rounds_steps_per_s"],
                       "ddp_steps_per_s": ddp["rounds_steps_per_s"],
                       "omni_throughput": omni["rounds_throughput"],
                       "ddp_throughput": ddp["rounds_throughput"],
                       "omni_cpu_steps_per_s": omni["rounds_cpu_steps_per_s"],
                       "ddp_cpu_steps_per_s": ddp["rounds_cpu_steps_per_s"]},
            "throughput_ratio": statistics.median(omni["rounds_throughput"])
            / statistics.median(ddp["rounds_throughput"]),
            "cpu_ratio": statistics.median(omni["rounds_cpu_steps_per_s"])
            / statistics.median(ddp["rounds_cpu_steps_per_s"]),
            "first_loss_omni": omni["first_loss"], "first_loss_ddp": ddp["first_loss"],
            "first_loss_rel_diff": abs(omni["first_loss"] - ddp["first_loss"])
            / abs(ddp["first_loss"]),
            "breakdown_ms": {"omni": omni["breakdown_ms"], "ddp": ddp["breakdown_ms"]},
        }
    return out


def _table(res: dict) -> None:
    print(f"{'model':12s} {'omni steps/s':>12s} {'ddp steps/s':>12s} {'ratio':>6s} "
          f"{'thru':>6s} {'cpu':>6s} {'ratio per round':>30s} {'loss0 omni':>10s} "
          f"{'loss0 ddp':>10s}")
    for m in MODELS:
        if m not in res["models"]:
            continue
        r = res["models"][m]
        rounds = " ".join(f"{x:.2f}" for x in r["ratio_per_round"])
        print(f"{m:12s} {r['omni_steps_per_s']:12.2f} {r['ddp_steps_per_s']:12.2f} "
              f"{r['ratio']:6.3f} {r['throughput_ratio']:6.3f} {r['cpu_ratio']:6.3f} "
              f"{rounds:>30s} {r['first_loss_omni']:10.5f} "
              f"{r['first_loss_ddp']:10.5f}")
    print("\nbreakdown, ms per step (median, rank 0, exclusive):")
    for m, r in res["models"].items():
        for name in ("omni", "ddp"):
            b = r["breakdown_ms"][name]
            rows = [k for k in ROWS[name] if k in b] + ["step"]
            print(f"  {m} {name}: " + ", ".join(f"{k} {b[k]:.1f}" for k in rows))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 round, 2 + 2 steps (< 60 s)")
    ap.add_argument("--rounds", type=int, help="fits per strategy and model (default 5)")
    ap.add_argument("--steps", type=int, help="timed steps per fit (default 10)")
    ap.add_argument("--warmup", type=int, help="untimed steps per fit (default 3)")
    ap.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    ap.add_argument("--fixed-padding", action="store_true",
                    help="multimodal: pad encoder rows to the data's longest sample in every "
                         "batch, so Omni's microbatch slices and DDP's batches have one width")
    ap.add_argument("--out", help="write the numbers as JSON")
    args = ap.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 5)
    steps = args.steps or (2 if args.quick else 10)
    warmup = args.warmup or (2 if args.quick else 3)
    res: dict = {"load_average_1min_before": os.getloadavg()[0],
                 "settings": {"processes": 2, "threads_per_process": 1, "backend": "gloo",
                              "batch_per_replica": BATCH, "num_microbatches": MICRO,
                              "rounds": rounds, "warmup_steps": warmup, "timed_steps": steps},
                 "rows": ROWS}
    t0 = time.time()
    res["settings"]["fixed_padding"] = args.fixed_padding
    res["models"] = run(rounds, warmup, steps, args.models, args.fixed_padding)
    res["seconds"] = time.time() - t0
    res["load_average_1min_after"] = os.getloadavg()[0]  # others' work skews timings
    _table(res)
    print(f"load average (1 min) {res['load_average_1min_before']:.2f} before, "
          f"{res['load_average_1min_after']:.2f} after; {res['seconds']:.0f} s")
    bad = [m for m, r in res["models"].items()
           if not math.isfinite(r["ratio"]) or r["first_loss_rel_diff"] > 1e-4]
    res["command"] = " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])])
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=2))
    if bad:
        print(f"first-step losses differ (or no ratio) for {bad}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
