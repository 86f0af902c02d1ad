"""omni-plan: predict a launch before paying for it.

Reads a workload YAML (models, cluster, batch, mixture, optionally a run's phases),
grid-searches each system's parallel layout under the same memory limit, prints predicted
throughput per system and image share (and, for a run, run-level throughput with one layout per
system), and writes PNG plots (throughput against image share; one step's per-rank timeline).
Bad input exits with status 2 and a message naming the key; never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from .plan.run import design_steps, predict_run, sampled_steps, search_run
from .plan.runnable import launch, runnable_grid, runnable_systems
from .plan.systems import SYSTEM_LABELS, Prediction, StepData, predict, search
from .plots import plot_throughput, plot_timeline
from .workload_yaml import PlanRequest, WorkloadError, load_workload


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="omni-plan", description=__doc__.splitlines()[0])
    p.add_argument("workload", type=Path, help="workload YAML (see docs/omni/planning.md)")
    p.add_argument("--out-dir", type=Path, default=Path("omni_plan_out"),
                   help="where plots and the JSON summary go (default: ./omni_plan_out)")
    p.add_argument("--no-plots", action="store_true", help="print the table only")
    p.add_argument("--runnable-only", action="store_true",
                   help="search only layouts OmniStrategy can launch today "
                        "(plan.runnable.launch: encoders on the LLM's ranks; TP only at "
                        "the encoders' TP, for Omni only with LSSP/reorder ablated)")
    p.add_argument("--verify", nargs="?", const="best", default=None, metavar="LAYOUT",
                   help="instead of planning, check a layout at full size: the real Hugging "
                        "Face model, one training step per rank role on fake tensors, against "
                        "the planner's prediction (LAYOUT: a layout string omni-plan prints; "
                        "default: the Omni layout it picks); writes verify.json to --out-dir "
                        "(docs/omni/full_size.md)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.verify is not None:
        report = verify_main(args.workload, args.verify)
        if report is None:
            return 2
        args.out_dir.mkdir(parents=True, exist_ok=True)
        (args.out_dir / "verify.json").write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out_dir / 'verify.json'}")
        return 0
    try:
        request = load_workload(args.workload)
    except WorkloadError as err:
        print(f"omni-plan: {args.workload}: {err}", file=sys.stderr)
        return 2
    try:
        if args.runnable_only:
            request = _runnable_only(request)
        return _plan(request, args)
    except ValueError as err:  # planning rejected an input the schema let through
        print(f"omni-plan: {args.workload}: {err}", file=sys.stderr)
        return 2


def verify_main(workload: Path, layout: str, roles: list[tuple[int, int]] | None = None
                ) -> dict | None:
    """``--verify``: the full-size check of ``layout`` (``"best"``: the Omni layout omni-plan
    picks) on ``workload`` (``roles``: only these (stage, TP rank)), printed as it goes; the
    report (``full_size.verify_layout``), or None after printing why the input was refused."""
    from .full_size import best_layout, parse_layout, verify_layout

    try:
        request = load_workload(workload)
        config = best_layout(request) if layout == "best" else parse_layout(layout)
        print(f"{request.name}: checking {config} at full size, one training step per rank "
              f"role on fake tensors (memory cap "
              f"{request.cost.hardware.memory_cap_bytes / 1e9:.1f} GB per GPU)", flush=True)
        return verify_layout(request, config, roles=roles,
                             progress=lambda line: print(line, flush=True))
    except ValueError as err:  # WorkloadError, a layout refused by name
        print(f"omni-plan: {workload}: {err}", file=sys.stderr)
        return None


def _runnable_only(request: PlanRequest) -> PlanRequest:
    """The request narrowed to layouts OmniStrategy runs (``plan/runnable.py``)."""
    systems = runnable_systems(request.systems, request.scenarios[0][1])
    dropped = sorted(set(request.systems) - set(systems))
    if dropped:
        print(f"--runnable-only: skipping {', '.join(SYSTEM_LABELS[s] for s in dropped)} "
              f"(a separate encoder pool; OmniStrategy runs encoders on the LLM's ranks)")
    if not systems:
        raise ValueError("systems: expected one OmniStrategy can run (megatron or omni with "
                         f"multiplexing) for --runnable-only, got {list(request.systems)}")
    return dataclasses.replace(request, systems=tuple(systems), grid=runnable_grid(request.grid))


def _launch_note(system: str, config, scenario) -> tuple[str, dict]:
    """The table's "runs" cell and the JSON record of whether OmniStrategy runs a layout."""
    verdict = launch(system, config, scenario)
    return ("yes" if verdict.runnable else "no"), verdict.to_json()


def _plan(request: PlanRequest, args: argparse.Namespace) -> int:
    results: dict[str, list[tuple[float, Prediction]]] = {s: [] for s in request.systems}
    timeline: list[Prediction] = []
    cap_gb = request.cost.hardware.memory_cap_bytes / 1e9
    print(f"{request.name}: {len(request.scenarios)} mixes x {len(request.systems)} systems "
          f"(memory cap {cap_gb:.1f} GB per GPU)")
    header = f"{'share':>5}  {'system':28} {'K tok/s':>9} {'step s':>8} {'peak GB':>8}  " \
             f"{'fits':4}  {'runs':4}  best layout"
    print(header)
    print("-" * len(header))
    launches: dict[str, list[dict]] = {s: [] for s in request.systems}
    reasons: dict[str, set[str]] = {s: set() for s in request.systems}
    for ratio, scenario in request.scenarios:
        data = StepData(scenario, request.cost)
        for system in request.systems:
            pools = request.encoder_pools if system == "disaggregated" else None
            best = search(system, scenario, request.cost, data, encoder_pools=pools,
                          grid=request.grid).best
            results[system].append((ratio, best))
            runs, record = _launch_note(system, best.config, scenario)
            launches[system].append(record)
            reasons[system].update(record["why_not"])
            print(f"{ratio:5.2f}  {SYSTEM_LABELS[system]:28} {best.tokens_per_s / 1e3:9.1f} "
                  f"{best.step_seconds:8.3f} {max(best.stage_peak_memory_gb):8.1f}  "
                  f"{'no' if best.oom else 'yes':4}  {runs:4}  {best.config}")
            if best.oom:
                print(f"       no layout of {SYSTEM_LABELS[system]} fits: the smallest peak "
                      f"memory found is {max(best.stage_peak_memory_gb):.1f} GB against a cap "
                      f"of {cap_gb:.1f} GB")
            if ratio == request.timeline_ratio:
                timeline.append(predict(system, scenario, best.config, request.cost, data,
                                        record_timeline=True))
    _print_speedups(results)
    for system, why in reasons.items():
        for reason in sorted(why):
            print(f"runs no ({system}): OmniStrategy cannot run {reason}")
    if any(reasons.values()):
        print("(omni-plan --runnable-only searches only the layouts it can run)")
    summary: dict = {system: [{"image_ratio": r, "tokens_per_s": p.tokens_per_s,
                               "step_seconds": p.step_seconds,
                               "stage0_memory_gb": p.stage0_memory_gb,
                               "peak_memory_gb": max(p.stage_peak_memory_gb),
                               "oom": p.oom, "config": str(p.config), "launch": record}
                              for (r, p), record in zip(points, launches[system], strict=True)]
                     for system, points in results.items()}
    if request.run is not None:
        summary["run"] = _run_level(request, cap_gb)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if not args.no_plots:
        a = plot_throughput(results, args.out_dir / "throughput.png",
                            f"{request.name}: predicted throughput")
        b = plot_timeline(timeline, args.out_dir / "timeline.png",
                          f"{request.name}: one step at share {request.timeline_ratio}")
        print(f"wrote {a} and {b}")
    print(f"wrote {args.out_dir / 'summary.json'}")
    return 0


def _run_level(request: PlanRequest, cap_gb: float) -> list[dict]:
    """One layout per system for the whole run, priced on sampled steps."""
    run = request.run
    assert run is not None
    design = design_steps(run, request.cost)
    steps = sampled_steps(run, request.cost, request.sampled_steps, run.seed + 1)
    print(f"\nrun {run.name}: {len(run.phases)} phases, one layout per system, "
          f"{len(steps)} sampled steps")
    head = f"{'system':28} {'K tok/s mean':>12} {'p5':>8} {'p95':>8} {'OOM steps':>9}  " \
           f"{'runs':4}  layout"
    print(head)
    print("-" * len(head))
    rows = []
    for system in request.systems:
        pools = request.encoder_pools if system == "disaggregated" else None
        found = search_run(system, run, request.cost, design, encoder_pools=pools,
                           grid=request.grid)
        pred = predict_run(system, found.config, steps, request.cost, run.name)
        runs, record = _launch_note(system, found.config,
                                    run.scenario(run.typical_share(), run.seed))
        row = {"system": system, "layout": str(found.config), "fits_design": found.fits,
               "launch": record,
               "tokens_per_s_mean": pred.tokens_per_s_mean,
               "tokens_per_s_p5": pred.tokens_per_s_percentile(5),
               "tokens_per_s_p95": pred.tokens_per_s_percentile(95),
               "oom_steps": pred.oom_steps, "steps": len(steps), "peak_memory_gb": pred.peak_gb}
        rows.append(row)
        print(f"{SYSTEM_LABELS[system]:28} {row['tokens_per_s_mean'] / 1e3:12.1f} "
              f"{row['tokens_per_s_p5'] / 1e3:8.1f} {row['tokens_per_s_p95'] / 1e3:8.1f} "
              f"{pred.oom_steps:>4d}/{len(steps):<4d}  {runs:4}  {found.config}")
        if runs == "yes":
            args = ", ".join(f"{k}={v!r}" for k, v in record["strategy_kwargs"].items())
            print(f"    launch: OmniStrategy({args})")
        if not found.fits:
            print(f"    no layout of {SYSTEM_LABELS[system]} fits the run's design steps: the "
                  f"smallest peak memory found is {found.smallest_peak_gb:.1f} GB against a "
                  f"cap of {cap_gb:.1f} GB")
        elif pred.oom:
            print(f"    out of memory on {pred.oom_steps} of {len(steps)} sampled steps "
                  f"(peak {pred.peak_gb:.1f} GB, cap {cap_gb:.1f} GB): an OOM run")
    return rows


def _print_speedups(results: dict[str, list[tuple[float, Prediction]]]) -> None:
    if "omni" not in results:
        return
    for i, (ratio, omni) in enumerate(results["omni"]):
        fitting = [pts[i][1].tokens_per_s for s, pts in results.items()
                   if s != "omni" and not pts[i][1].oom]
        if fitting and not omni.oom:
            print(f"share {ratio:.2f}: Omni / best baseline = "
                  f"{omni.tokens_per_s / max(fitting):.2f}x")


if __name__ == "__main__":
    raise SystemExit(main())
