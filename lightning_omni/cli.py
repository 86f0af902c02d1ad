"""omni-plan: predict a launch before paying for it.

Reads a workload YAML (models, cluster, batch, mixture), grid-searches each system's parallel
layout under the same memory limit, prints predicted throughput per system and image share,
and writes PNG plots (throughput against image share; one step's per-rank timeline).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from .plan.systems import SYSTEM_LABELS, Prediction, StepData, predict, search
from .plots import plot_throughput, plot_timeline
from .workload_yaml import WorkloadError, load_workload


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="omni-plan", description=__doc__.splitlines()[0])
    p.add_argument("workload", type=Path, help="workload YAML (see docs/omni/planning.md)")
    p.add_argument("--out-dir", type=Path, default=Path("omni_plan_out"),
                   help="where plots and the JSON summary go (default: ./omni_plan_out)")
    p.add_argument("--no-plots", action="store_true", help="print the table only")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        request = load_workload(args.workload)
    except WorkloadError as err:
        print(f"omni-plan: {args.workload}: {err}", file=sys.stderr)
        return 2
    results: dict[str, list[tuple[float, Prediction]]] = {s: [] for s in request.systems}
    timeline: list[Prediction] = []
    print(f"{request.name}: {len(request.scenarios)} mixes x {len(request.systems)} systems")
    header = f"{'share':>5}  {'system':28} {'K tok/s':>9} {'step s':>8} {'stage0 GB':>9}  " \
             f"{'fits':4}  best layout"
    print(header)
    print("-" * len(header))
    for ratio, scenario in request.scenarios:
        data = StepData(scenario, request.cost)
        for system in request.systems:
            pools = request.encoder_pools if system == "disaggregated" else None
            best = search(system, scenario, request.cost, data, encoder_pools=pools).best
            results[system].append((ratio, best))
            print(f"{ratio:5.2f}  {SYSTEM_LABELS[system]:28} {best.tokens_per_s / 1e3:9.1f} "
                  f"{best.step_seconds:8.3f} {best.stage0_memory_gb:9.1f}  "
                  f"{'no' if best.oom else 'yes':4}  {best.config}")
            if ratio == request.timeline_ratio:
                timeline.append(predict(system, scenario, best.config, request.cost, data,
                                        record_timeline=True))
    _print_speedups(results)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    summary = {system: [{"image_ratio": r, "tokens_per_s": p.tokens_per_s,
                         "step_seconds": p.step_seconds, "stage0_memory_gb": p.stage0_memory_gb,
                         "oom": p.oom, "config": str(p.config)} for r, p in points]
               for system, points in results.items()}
    (args.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if not args.no_plots:
        a = plot_throughput(results, args.out_dir / "throughput.png",
                            f"{request.name}: predicted throughput")
        b = plot_timeline(timeline, args.out_dir / "timeline.png",
                          f"{request.name}: one step at share {request.timeline_ratio}")
        print(f"wrote {a} and {b}")
    print(f"wrote {args.out_dir / 'summary.json'}")
    return 0


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
