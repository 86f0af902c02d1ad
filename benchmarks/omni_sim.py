"""Simulated throughput of Megatron-like, disaggregated and Omni plans on the paper's workloads.

Run level (the main view): each workload is a training run whose image share moves through
phases and from step to step; every system launches it with ONE layout (TP/PP/DP, recompute,
stage split, encoder pool and TP) from the same grid under the same memory limit, sized for the
run's worst step, and many sampled steps are priced with it (Omni's per-step plans adapt).
JSON ``run_rows`` (per run and system: tokens/s mean, p5, p95, OOM steps, layout), ``ablation``
(Omni with each technique off), ``seeds`` (the spread over seeds) and, as a secondary view, the
per-mix ``rows`` (every system re-tuned for one sampled step of each mix).

    python benchmarks/omni_sim.py --out omni_sim.json [--quick]
    python benchmarks/omni_sim.py --vpp-effect [--runs B,C,D]   # interleaving on and off
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lightning_omni.plan.costs import (  # noqa: E402
    GPT_175B,
    H100_80G,
    LLAMA_12B,
    LLAMA_70B,
    VIT_1B,
    VIT_2_4B,
    VIT_10B,
    CostModel,
)
from lightning_omni.plan.run import (  # noqa: E402
    Phase,
    Run,
    design_steps,
    predict_run,
    sampled_steps,
    search_run,
)
from lightning_omni.plan.scenario import OMNI_TECHNIQUES  # noqa: E402
from lightning_omni.plan.systems import (  # noqa: E402
    CONVENTIONAL_PIPELINE_GRID,
    DEFAULT_GRID,
    SYSTEMS,
    Grid,
    Scenario,
    StepData,
    predict,
    search,
)
from lightning_omni.plan.workload import image_text_mixture  # noqa: E402

WORKLOADS = {  # name: (encoder, llm, gpus, global batch, seq len) as in the paper
    "A": (VIT_1B, LLAMA_12B, 64, 32, 16384),
    "B": (VIT_2_4B, LLAMA_70B, 128, 64, 16384),
    "C": (VIT_10B, LLAMA_70B, 256, 128, 8192),
    "D": (VIT_10B, GPT_175B, 512, 256, 8192),
}
RATIOS = (0.1, 0.5, 0.9)
LONG_SEQ = {"16k": 16384, "32k": 32768}
PAPER = {"A": 1.54, "B": 3.30, "C": 7.57, "D": 1.98, "16k": 6.88, "32k": 4.72,
         "stage0_mem_reduction": 2.21}


def run_scenario(sc: Scenario, label: str, ratio: float, pool: int | None) -> list[dict]:
    """All systems on one scenario. The disaggregated encoder pool is static for a run: it is
    tuned once per workload (at the 5:5 mix, ``pool``) and kept as the mix changes; the
    ``disaggregated_retuned`` row re-tunes it for this very mix (an oracle, for reference)."""
    cost = CostModel(sc.hardware)
    data = StepData(sc, cost)
    rows = []
    runs = [(s, None) for s in SYSTEMS if s != "disaggregated"]
    runs.insert(1, ("disaggregated", [pool] if pool else None))
    if pool:
        runs.append(("disaggregated_retuned", None))
    for name, pools in runs:
        system = "disaggregated" if name.startswith("disaggregated") else name
        best = search(system, sc, cost, data, encoder_pools=pools).best
        if name == "megatron":
            matched = _stage0_at_same_layout(sc, cost, data, best)
        rows.append({
            "workload": label, "gpus": sc.num_gpus, "image_ratio": ratio, "system": name,
            "tokens_per_s": round(best.tokens_per_s, 1),
            "stage0_mem_gb": round(best.stage0_memory_gb, 2), "oom": best.oom,
            "config": str(best.config), "step_s": round(best.step_seconds, 4),
            "encoder_gpus": best.config.encoder_gpus,
        })
    rows[0]["omni_stage0_mem_gb_same_layout"] = matched
    return rows


NO_RECOMPUTE_GRID = Grid(recompute=((False, False),))


def sensitivity(sc: Scenario, omni_tokens_per_s: float) -> dict:
    """How the answer depends on the baseline's configuration space: Megatron-like restricted
    to a conventional pipeline (PP >= 2, even layer split, all-or-nothing recompute), and
    Megatron-like without activation recompute."""
    cost = CostModel(sc.hardware)
    data = StepData(sc, cost)
    conv = search("megatron", sc, cost, data, grid=CONVENTIONAL_PIPELINE_GRID).best
    norec = search("megatron", sc, cost, data, grid=NO_RECOMPUTE_GRID).best
    return {
        "conventional_megatron": str(conv.config),
        "conventional_megatron_tokens_per_s": round(conv.tokens_per_s, 1),
        "speedup_vs_conventional_megatron": round(omni_tokens_per_s / conv.tokens_per_s, 3),
        "megatron_without_recompute_oom": norec.oom,
        "megatron_without_recompute_stage0_gb": round(norec.stage0_memory_gb, 1),
    }


def _stage0_at_same_layout(sc: Scenario, cost: CostModel, data: StepData, mega) -> float | None:
    """Omni's stage-0 peak under Megatron-like's chosen layout (only meaningful with a
    pipeline): the paper's first-stage memory comparison, free of layout differences."""
    if mega.config.pp < 2:
        return None
    return round(predict("omni", sc, mega.config, cost, data).stage0_memory_gb, 2)


BASELINES = ("megatron", "disaggregated")


def speedup_of(rows: list[dict], baselines: tuple[str, ...] = BASELINES) -> float:
    """Omni over the best baseline that fits in memory (0 if Omni itself does not fit)."""
    omni = next(r for r in rows if r["system"] == "omni")
    base = [r["tokens_per_s"] for r in rows if r["system"] in baselines and not r["oom"]]
    if omni["oom"]:
        return 0.0
    return omni["tokens_per_s"] / max(base) if base else math.inf


# A run: alignment at 9:1 (10% of steps), pretraining at 5:5 (60%), a text-heavy stage at
# 1:9 (30%); each step's image share is drawn around its phase's mean.
CURRICULUM = (Phase(0.9, 1000, share_sd=0.05, name="alignment"),
              Phase(0.5, 6000, share_sd=0.1, name="pretrain"),
              Phase(0.1, 3000, share_sd=0.05, name="text-heavy"))
LONG_PHASES = (Phase(0.5, 1, share_sd=0.1, name="long-context"),)
ALL_SYSTEMS = ("megatron", "disaggregated", "omni")


def make_runs(seed: int, names: tuple[str, ...]) -> dict[str, Run]:
    runs = {}
    for name in names:
        if name in WORKLOADS:
            enc, llm, gpus, batch, seq = WORKLOADS[name]
            runs[name] = Run(name, enc, llm, H100_80G, gpus, batch, seq, CURRICULUM, seed=seed)
        else:
            enc, llm, gpus, batch, seq = WORKLOADS["C"]
            seq_len = LONG_SEQ[name.split("-")[1]]
            runs[name] = Run(name, enc, llm, H100_80G, gpus, batch * seq // seq_len, seq_len,
                             LONG_PHASES, long_max=seq_len, long_share=0.05, seed=seed)
    return runs


def run_level(run: Run, steps: int, systems: tuple[str, ...] = ALL_SYSTEMS,
              eval_seed: int | None = None, grid: Grid = DEFAULT_GRID) -> list[dict]:
    """Every system's one layout for the run, priced on ``steps`` sampled steps."""
    cost = CostModel(run.hardware)
    design = design_steps(run, cost)
    sampled = sampled_steps(run, cost, steps, run.seed + 1 if eval_seed is None else eval_seed)
    rows = []
    for system in systems:
        found = search_run(system, run, cost, design, grid=grid)
        pred = predict_run(system, found.config, sampled, cost, run.name)
        rows.append({
            "run": run.name, "gpus": run.num_gpus, "system": system,
            "omni_off": list(run.omni_off),
            "tokens_per_s_mean": round(pred.tokens_per_s_mean, 1),
            "tokens_per_s_p5": round(pred.tokens_per_s_percentile(5), 1),
            "tokens_per_s_p95": round(pred.tokens_per_s_percentile(95), 1),
            "oom_steps": pred.oom_steps, "steps": len(sampled),
            "peak_memory_gb": round(pred.peak_gb, 2), "fits_design": found.fits,
            "layout": str(found.config),
        })
    return rows


def run_speedup(rows: list[dict]) -> float:
    """Omni's run-level mean over the best baseline whose run never runs out of memory
    (0 if Omni's run does; inf if every baseline's does)."""
    omni = next(r for r in rows if r["system"] == "omni")
    base = [r["tokens_per_s_mean"] for r in rows if r["system"] != "omni"
            and not r["oom_steps"]]
    if omni["oom_steps"]:
        return 0.0
    return omni["tokens_per_s_mean"] / max(base) if base else math.inf


def vpp_effect(names: tuple[str, ...], seed: int, steps: int) -> list[dict]:
    """What interleaving changes: every run searched with the default grid (vpp 1 or 2) and
    with vpp 1 only, priced on the same sampled steps."""
    out = []
    runs = make_runs(seed, names)
    for name, run in runs.items():
        with_v = run_level(run, steps)
        without = run_level(run, steps, grid=replace(DEFAULT_GRID, vpp=(1,)))
        for a, b in zip(with_v, without, strict=True):
            out.append({"run": name, "system": a["system"], "layout": a["layout"],
                        "tokens_per_s_mean": a["tokens_per_s_mean"],
                        "oom_steps": a["oom_steps"], "layout_vpp1": b["layout"],
                        "tokens_per_s_mean_vpp1": b["tokens_per_s_mean"],
                        "oom_steps_vpp1": b["oom_steps"],
                        "gain": round(a["tokens_per_s_mean"] / b["tokens_per_s_mean"] - 1, 4)})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here")
    parser.add_argument("--quick", action="store_true",
                        help="workload A only, 4 steps, 2 seeds (about a minute of CPU)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None,
                        help="sampled steps per run (default 16; --quick 6)")
    parser.add_argument("--no-per-mix", action="store_true",
                        help="skip the per-mix secondary view")
    parser.add_argument("--per-mix-only", action="store_true",
                        help="only the per-mix secondary view")
    parser.add_argument("--vpp-effect", action="store_true",
                        help="only the run level with and without interleaved pipelines")
    parser.add_argument("--runs", default=None,
                        help="comma-separated runs (default: all; --quick: A)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    steps = args.steps or (4 if args.quick else 16)
    names = ("A",) if args.quick else tuple(WORKLOADS) + tuple(f"C-{k}" for k in LONG_SEQ)
    if args.runs:
        names = tuple(args.runs.split(","))
        known = tuple(WORKLOADS) + tuple(f"C-{k}" for k in LONG_SEQ)
        bad = [n for n in names if n not in known]
        if bad:
            parser.error(f"--runs: expected names from {known}, got {bad}")
    if args.vpp_effect:
        rows = vpp_effect(names, args.seed, steps)
        print(f"{'run':7} {'system':15} {'tok/s':>10} {'vpp1 tok/s':>11} {'gain':>7}  "
              f"layout | layout with vpp 1 only")
        for r in rows:
            print(f"{r['run']:7} {r['system']:15} {r['tokens_per_s_mean']:10.0f} "
                  f"{r['tokens_per_s_mean_vpp1']:11.0f} {r['gain']:+7.1%}  {r['layout']} | "
                  f"{r['layout_vpp1']}")
        result = {"vpp_effect": rows, "steps_per_run": steps,
                  "seconds": round(time.perf_counter() - start, 1)}
        print(f"simulated in {result['seconds']} s")
        if args.out:
            args.out.write_text(json.dumps(result, indent=2))
        return 0
    if args.per_mix_only:
        result = per_mix(args.seed)
        _print_table(result["rows"])
        print(f"per mix, max speedup: {result['max_speedup']}  long: "
              f"{result['long_seq_speedup']}")
        result["seconds"] = round(time.perf_counter() - start, 1)
        if args.out:
            args.out.write_text(json.dumps(result, indent=2))
        return 0
    runs = make_runs(args.seed, names)
    run_rows: list[dict] = []
    per_run: dict[str, list[dict]] = {}
    for name, run in runs.items():
        per_run[name] = run_level(run, steps)
        run_rows += per_run[name]
        print(f"[{time.perf_counter() - start:6.1f} s] run {name} done", flush=True)
    speedups = {name: round(run_speedup(rows), 3) for name, rows in per_run.items()}

    ablation: list[dict] = []
    # every run but D (the costliest to search; its rows say what the others do)
    abl_names = ("A",) if args.quick else tuple(n for n in runs if n != "D")
    for name in abl_names:
        full = next(r for r in per_run[name] if r["system"] == "omni")
        for technique in OMNI_TECHNIQUES:
            run = _replace_run(runs[name], omni_off=(technique,))
            row = run_level(run, steps, ("omni",))[0]
            ablation.append({"run": name, "off": technique,
                             "tokens_per_s_mean": row["tokens_per_s_mean"],
                             "oom_steps": row["oom_steps"], "layout": row["layout"],
                             "loss_vs_full": round(1 - row["tokens_per_s_mean"]
                                                   / full["tokens_per_s_mean"], 3)})
        print(f"[{time.perf_counter() - start:6.1f} s] ablation {name} done", flush=True)

    seeds: dict[str, dict] = {}
    seed_list = range(args.seed, args.seed + (2 if args.quick else 5))
    seed_names = ("A",) if args.quick else ("A", "C", "C-16k", "C-32k")
    seed_steps = steps if args.quick else max(4, steps // 2)
    for name in seed_names:
        per_seed = []
        for sd in seed_list:
            rows = (per_run[name] if sd == args.seed and seed_steps == steps
                    else run_level(make_runs(sd, (name,))[name], seed_steps))
            per_seed.append({"seed": sd, "speedup": round(run_speedup(rows), 3),
                             **{r["system"]: r["tokens_per_s_mean"] for r in rows},
                             **{f"{r['system']}_layout": r["layout"] for r in rows},
                             **{f"{r['system']}_oom_steps": r["oom_steps"] for r in rows}})
        sp = [x["speedup"] for x in per_seed if math.isfinite(x["speedup"])]
        seeds[name] = {"per_seed": per_seed, "speedup_min": min(sp, default=None),
                       "speedup_max": max(sp, default=None),
                       "speedup_mean": round(float(sum(sp) / len(sp)), 3) if sp else None,
                       "steps_per_seed": seed_steps}
        print(f"[{time.perf_counter() - start:6.1f} s] seeds {name} done", flush=True)

    result: dict = {"run_rows": run_rows, "run_speedup": speedups, "ablation": ablation,
                    "seeds": seeds, "paper": PAPER, "steps_per_run": steps}
    if not args.quick and not args.no_per_mix:
        result.update(per_mix(args.seed))
    result["seconds"] = round(time.perf_counter() - start, 1)
    _print_run_table(run_rows, speedups)
    _print_ablation(ablation)
    for name, v in seeds.items():
        print(f"seeds {name}: Omni / best baseline {v['speedup_min']} .. {v['speedup_max']} "
              f"(mean {v['speedup_mean']}) over {len(v['per_seed'])} seeds")
    if "rows" in result:
        _print_table(result["rows"])
        print(f"per mix, max speedup: {result['max_speedup']}  long: "
              f"{result['long_seq_speedup']}")
    print(f"simulated in {result['seconds']} s")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
        print(f"wrote {args.out}")
    return 0


def _replace_run(run: Run, **changes) -> Run:
    return replace(run, **changes)


def per_mix(seed: int) -> dict:
    """The secondary view: every system re-tuned for one sampled step of each mix."""
    rows: list[dict] = []
    groups: dict[tuple[str, float], list[dict]] = {}
    pools: dict[str, int] = {}
    for name, (enc, llm, gpus, batch, seq) in WORKLOADS.items():
        for ratio in (0.5, 0.1, 0.9):  # 5:5 first: it fixes the static encoder pool
            sc = Scenario(f"{name}-{ratio}", enc, llm, H100_80G, gpus, batch, seq,
                          image_text_mixture(ratio), seed=seed)
            groups[name, ratio] = run_scenario(sc, name, ratio, pools.get(name))
            if name not in pools:
                pools[name] = next(r["encoder_gpus"] for r in groups[name, ratio]
                                   if r["system"] == "disaggregated")
        for ratio in RATIOS:
            rows += groups[name, ratio]
    long_rows: dict[str, list[dict]] = {}
    enc, llm, gpus, batch, seq = WORKLOADS["C"]
    for label, seq_len in LONG_SEQ.items():
        sc = Scenario(f"C-{label}", enc, llm, H100_80G, gpus, batch * seq // seq_len, seq_len,
                      image_text_mixture(0.5, long_max=seq_len, long_share=0.05), seed=seed)
        long_rows[label] = run_scenario(sc, f"C-{label}", 0.5, pools["C"])
        rows += long_rows[label]
    return {
        "rows": rows,
        "max_speedup": {name: round(max(speedup_of(groups[name, r]) for r in RATIOS), 3)
                        for name in WORKLOADS},
        "long_seq_speedup": {k: round(speedup_of(v), 3) for k, v in long_rows.items()},
        "static_encoder_pool_gpus": pools,
    }


def _print_run_table(rows: list[dict], speedups: dict[str, float]) -> None:
    head = f"{'run':7} {'system':14} {'tok/s mean':>11} {'p5':>10} {'p95':>10} " \
           f"{'OOM':>6} {'peak GB':>7}  layout"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['run']:7} {r['system']:14} {r['tokens_per_s_mean']:11.0f} "
              f"{r['tokens_per_s_p5']:10.0f} {r['tokens_per_s_p95']:10.0f} "
              f"{r['oom_steps']:>3d}/{r['steps']:<2d} {r['peak_memory_gb']:7.1f}  {r['layout']}")
    print(f"run level, Omni / best baseline without OOM steps: {speedups}")


def _print_ablation(rows: list[dict]) -> None:
    for r in rows:
        print(f"ablation {r['run']:7} without {r['off']:18} {r['tokens_per_s_mean']:11.0f} "
              f"tok/s ({r['loss_vs_full']:+.1%} loss; OOM steps {r['oom_steps']}) "
              f"{r['layout']}")


def _print_table(rows: list[dict]) -> None:
    head = f"{'workload':8} {'gpus':>5} {'img':>4} {'system':22} {'tok/s':>11} {'step s':>8} " \
           f"{'st0 GB':>7} {'oom':>4}  config"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['workload']:8} {r['gpus']:5d} {r['image_ratio']:4.1f} {r['system']:22} "
              f"{r['tokens_per_s']:11.0f} {r['step_s']:8.3f} {r['stage0_mem_gb']:7.1f} "
              f"{str(r['oom']):>4}  {r['config']}")


if __name__ == "__main__":
    raise SystemExit(main())
