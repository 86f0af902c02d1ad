"""A motion-tracking checkpoint from start frames spread over each clip, to the clip's end.

    python benchmarks/tracking_eval.py CKPT --starts 5 --out build/tracking_eval.json

For each clip of the checkpoint's library and each of ``--starts`` frames spread evenly over it
(frame 0 first), one evaluation episode as ``python -m lightning_unilab.evaluate checkpoint CKPT
--param start_frame=F`` runs it (no start noise, no randomization), with its plot (and, for
the first start, a GIF with the reference as a ghost) under ``--dir``. Prints a table: falls,
steps to the clip's end, body position, anchor orientation and joint errors per start, and the
pass rule of docs/unilab/tracking.md (no fall from any start, mean body position error at most
``--max-error``), and writes it as JSON.

    python benchmarks/tracking_eval.py CKPT --tries 5 --out build/flip_tries.json

``--tries N`` (the flip's rule) runs instead N episodes from each clip's first frame, seeds 0 to
N-1, with the training's start noise and randomization (friction, masses, pushes) kept, so that
no two tries are the same; each is a landing if it reaches the clip's end upright without a
fall, and the rule passes when at least ``--min-landings`` of them land.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def spread_starts(clip_frames: np.ndarray, starts: int) -> list[tuple[int, int]]:
    """(clip, global start frame) pairs: ``starts`` frames evenly over each clip's first
    len - 1 frames (its last frame starts nothing), frame 0 of the clip first."""
    out, first = [], 0
    for clip, frames in enumerate(int(f) for f in clip_frames):
        for k in range(starts):
            out.append((clip, first + (k * (frames - 1)) // starts))
        first += frames
    return out


def first_frames(clip_frames: np.ndarray) -> list[tuple[int, int]]:
    """(clip, global frame) of each clip's first frame."""
    starts = np.concatenate([[0], np.cumsum(clip_frames)[:-1]]).astype(int)
    return [(clip, int(f)) for clip, f in enumerate(starts)]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("ckpt")
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--tries", type=int, default=0,
                        help="instead of --starts: N randomized episodes from each clip's first "
                             "frame (default 0: off)")
    parser.add_argument("--min-landings", type=int, default=None,
                        help="with --tries: landings the rule needs (default: 4 of 5, i.e. "
                             "ceil(0.8 N))")
    parser.add_argument("--max-error", type=float, default=0.05,
                        help="the pass rule's mean body position error, m (default 0.05)")
    parser.add_argument("--dir", default=None, help="episode folders (default: beside --out)")
    parser.add_argument("--no-video", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.starts < 1:
        parser.error(f"--starts: expected a positive number, got {args.starts}")
    if args.tries < 0:
        parser.error(f"--tries: expected 0 (off) or a positive number, got {args.tries}")
    need = args.min_landings if args.min_landings is not None else -(-4 * args.tries // 5)
    if args.tries and not 0 < need <= args.tries:
        parser.error(f"--min-landings: expected 1 to --tries ({args.tries}), got {need}")

    from lightning_omnilab import safe_load
    from lightning_unilab import _core
    from lightning_unilab.envs import tasks
    from lightning_unilab.envs.tasks.g1_tracking import EVALUATION_PARAMS, NAME, library_arrays
    from lightning_unilab.evaluate import checkpoint_evaluation, evaluate_policy
    from lightning_unilab.learner.appo import APPOModule

    checkpoint = safe_load.load(args.ckpt)
    with safe_load.project_types():
        module = APPOModule.load_from_checkpoint(args.ckpt, map_location="cpu",
                                                 weights_only=True)
    base = checkpoint_evaluation(checkpoint)
    if base.task != NAME:
        parser.error(f"ckpt: trained on {base.task!r}, not {NAME!r}")
    params = dict(base.task_kwargs.get("params") or {})
    data = dict(base.task_kwargs.get("task_data") or {})
    model = tasks.load_model(NAME, params)
    frames = library_arrays(model, {**_core.task_defaults(NAME), **params},
                            data)["clip_frames"]
    out_dir = Path(args.dir) if args.dir else Path(args.out).with_suffix("")
    rows = []
    if args.tries:  # (clip, frame, seed): randomized, the evaluation's episode otherwise
        episodes = [(c, f, k) for c, f in first_frames(frames) for k in range(args.tries)]
        fixed = {**EVALUATION_PARAMS}
        for name in [k for k in fixed if k.startswith("reset_")]:
            fixed.pop(name)  # the training's start noise
    else:
        episodes = [(c, f, None) for c, f in spread_starts(frames, args.starts)]
    for i, (clip, start, seed) in enumerate(episodes):
        if seed is None:
            run = checkpoint_evaluation(checkpoint, params={"start_frame": float(start)})
            folder = out_dir / f"clip{clip}_frame{start}"
        else:
            run = checkpoint_evaluation(checkpoint, params={**fixed, "start_frame": float(start)},
                                        seed=seed, randomize=True)
            folder = out_dir / f"clip{clip}_try{seed}"
        t0 = time.perf_counter()
        summary = evaluate_policy(module.policy, run.task, folder, run.task_kwargs,
                                  seed=run.seed, max_steps=None,
                                  video=not args.no_video and i == 0)
        m = summary["tracking"]
        rows.append({"clip": clip, "start_frame": start, "seed": seed,
                     "end_frame": m["end_frame"],
                     "steps": m["steps"], "fell": m["fell"],
                     "body_pos_error_m": m["body_pos_error_m"],
                     "anchor_ori_error_rad": m["anchor_ori_error_rad"],
                     "joint_error_rad": m["joint_error_rad"], "rotation_rad": m["rotation_rad"],
                     "landed": m["landed"], "plot": summary["plot"], "video": summary["video"],
                     "seconds": round(time.perf_counter() - t0, 1)})
    falls = sum(r["fell"] for r in rows)
    landings = sum(bool(r["landed"]) for r in rows)
    mean_error = float(np.mean([r["body_pos_error_m"] for r in rows]))
    if args.tries:
        passes = all(sum(bool(r["landed"]) for r in rows if r["clip"] == c) >= need
                     for c in range(len(frames)))
        rule = f"at least {need} of {args.tries} tries land on every clip"
    else:
        passes = falls == 0 and mean_error <= args.max_error
        rule = f"no fall and mean body position error at most {args.max_error} m"
    result = {"ckpt": str(args.ckpt), "starts_per_clip": 0 if args.tries else args.starts,
              "tries_per_clip": args.tries, "clip_frames": [int(f) for f in frames],
              "falls": falls, "landings": landings, "body_pos_error_m_mean": mean_error,
              "body_pos_error_m_max": float(max(r["body_pos_error_m"] for r in rows)),
              "passes": passes, "rule": rule, "max_error_m": args.max_error, "rows": rows}
    print(f"{'clip':>4} {'start':>6} {'seed':>5} {'end':>6} {'fell':>5} {'landed':>6} "
          f"{'body pos m':>10} {'anchor ori rad':>14} {'joints rad':>10} {'rotation':>8}")
    for r in rows:
        seed = "-" if r["seed"] is None else r["seed"]
        print(f"{r['clip']:>4} {r['start_frame']:>6} {seed:>5} {r['end_frame']:>6} "
              f"{r['fell']!s:>5} {bool(r['landed'])!s:>6} {r['body_pos_error_m']:>10.4f} "
              f"{r['anchor_ori_error_rad']:>14.4f} {r['joint_error_rad']:>10.4f} "
              f"{r['rotation_rad']:>8.2f}")
    print(f"falls {falls} of {len(rows)}; landings {landings}; mean body position error "
          f"{mean_error:.4f} m; rule: {rule}; passes: {passes}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
