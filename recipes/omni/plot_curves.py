"""Plot the multimodal recipe's TensorBoard curves (loss and caption accuracy per sample seen).

    python recipes/omni/plot_curves.py build/recipe_logs/multimodal_single/version_0:16 \
        build/recipe_logs/multimodal_pp2_dp2/version_0:32 --out docs/omni/img/recipe_curves.png

Each run is ``LOGDIR:GLOBAL_BATCH``; the global batch converts steps into samples seen.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402


def scalars(logdir: str, *tags: str) -> tuple[list[int], list[float]]:
    ea = EventAccumulator(logdir)
    ea.Reload()
    for tag in tags:
        if tag in ea.Tags()["scalars"]:
            ev = ea.Scalars(tag)
            return [e.step for e in ev], [e.value for e in ev]
    raise KeyError(f"{logdir}: none of the tags {tags}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", help="LOGDIR:GLOBAL_BATCH[:LABEL]")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 3.6))
    for run in args.runs:
        logdir, batch, *name = run.split(":", 2)
        label = name[0] if name else Path(logdir).parent.name
        steps, loss = scalars(logdir, "omni/loss", "train/loss")
        ax_loss.plot([s * int(batch) for s in steps], loss, label=label)
        steps, acc = scalars(logdir, "train/caption_acc")
        ax_acc.plot([s * int(batch) for s in steps], acc, label=label)
    ax_loss.set(xlabel="training samples seen", ylabel="train loss (token cross-entropy)")
    ax_acc.set(xlabel="training samples seen", ylabel="caption token accuracy", ylim=(0, 1))
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
