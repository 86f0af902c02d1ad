"""PNG plots for omni-plan: throughput against image share, and one step's per-rank timeline."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .plan.schedule import Kind  # noqa: E402
from .plan.systems import SYSTEM_LABELS, Prediction  # noqa: E402

COLORS = {Kind.LLM_FWD: "#4c78a8", Kind.LLM_BWD: "#9ecae9", Kind.ENC_FWD: "#f58518",
          Kind.ENC_BWD: "#ffbf79", Kind.ALLREDUCE: "#54a24b", Kind.ALLTOALL: "#b279a2"}


def plot_throughput(results: Mapping[str, Sequence[tuple[float, Prediction]]], path: Path,
                    title: str) -> Path:
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for system, points in results.items():
        xs = [r for r, _ in points]
        ys = [p.tokens_per_s / 1e3 for _, p in points]
        ax.plot(xs, ys, marker="o", label=SYSTEM_LABELS.get(system, system))
        for r, p in points:
            if p.oom:
                ax.annotate("OOM", (r, p.tokens_per_s / 1e3), textcoords="offset points",
                            xytext=(0, 6), ha="center", fontsize=7, color="red")
    ax.set_xlabel("encoder-modality share of samples (image or audio)")
    ax.set_ylabel("predicted throughput (K tokens/s)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_timeline(predictions: Sequence[Prediction], path: Path, title: str) -> Path:
    """One panel per system: a row per simulated rank, a bar per compute span."""
    rows = sum(len(p.sim.timeline) for p in predictions)
    fig, axes = plt.subplots(len(predictions), 1, squeeze=False,
                             figsize=(10, 1.5 + 0.9 * len(predictions) + 0.3 * rows))
    horizon = max(p.step_seconds for p in predictions)
    for ax, pred in zip(axes[:, 0], predictions, strict=True):
        for rank, spans in enumerate(pred.sim.timeline):
            for kind in COLORS:
                bars = [(s.start, s.end - s.start) for s in spans if s.kind == kind]
                if bars:
                    ax.broken_barh(bars, (rank - 0.4, 0.8), color=COLORS[kind])
        ax.set_yticks(range(len(pred.sim.timeline)))
        ax.set_yticklabels([_rank_label(pred, r) for r in range(len(pred.sim.timeline))],
                           fontsize=7)
        ax.invert_yaxis()
        ax.set_xlim(0, horizon * 1.01)
        ax.set_title(f"{SYSTEM_LABELS.get(pred.system, pred.system)}: {pred.config}, "
                     f"step {pred.step_seconds:.2f} s", fontsize=9)
    axes[-1, 0].set_xlabel("seconds")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    fig.legend(handles, [k.value for k in COLORS], loc="lower center", fontsize=7, ncol=5)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 0.95))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _rank_label(pred: Prediction, rank: int) -> str:
    stage = pred.schedule.stage_of(rank)
    return f"stage {stage}" if stage >= 0 else "encoders"
