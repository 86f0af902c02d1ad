"""``python -m lightning_unilab.motions``: convert, inspect and make reference motion clips.

    csv2npz IN.csv OUT.npz --fps 30 [--out-fps 50] [--quat-order xyzw|wxyz]
    npz2csv IN.npz OUT.csv [--quat-order xyzw|wxyz]
    info FILE.npz
    make-dance OUT.npz
    make-flip OUT.npz
    record CHECKPOINT OUT.npz [--task-params K=V ...] [--seconds S] [--seed N] [--allow-fall]
        [--all-bodies]

Every command but ``record`` (whose model is its checkpoint's task's) takes ``--model`` (a task
name or an MJCF path; default g1-walk-flat). A bad input prints one line and exits with
status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import mujoco

from lightning_unilab.motions.checks import clip_report
from lightning_unilab.motions.clip import load_clip, save_clip
from lightning_unilab.motions.convert import QUAT_ORDERS, clip_to_csv, csv_to_clip, root_body_name
from lightning_unilab.motions.flip import flip_report, make_flip
from lightning_unilab.motions.floor import floor_demand
from lightning_unilab.motions.keyframes import TRACKED_BODIES, make_dance
from lightning_unilab.motions.torque import joint_demand

DEFAULT_MODEL = "g1-walk-flat"


def load_model(name: str) -> mujoco.MjModel:
    """A task's model by task name, or the MJCF file at name."""
    if name.endswith(".xml") or Path(name).is_file():
        if not Path(name).is_file():
            raise FileNotFoundError(f"--model: no MJCF file at {name!r}")
        return mujoco.MjModel.from_xml_path(name)
    from lightning_unilab.envs import tasks

    return tasks.load_model(name)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lightning_unilab.motions",
                                     description=__doc__.split("\n")[0])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--model", default=DEFAULT_MODEL,
                        help=f"task name or MJCF path (default {DEFAULT_MODEL})")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("csv2npz", parents=[common],
                       help="retargeted joint csv -> BeyondMimic npz (forward kinematics)")
    p.add_argument("csv")
    p.add_argument("npz")
    p.add_argument("--fps", type=float, required=True, help="frame rate of the csv")
    p.add_argument("--out-fps", type=float, default=None, help="resample to this rate first")
    p.add_argument("--quat-order", choices=QUAT_ORDERS, default="xyzw")
    p = sub.add_parser("npz2csv", parents=[common], help="npz -> csv of root pose and joints")
    p.add_argument("npz")
    p.add_argument("csv")
    p.add_argument("--quat-order", choices=QUAT_ORDERS, default="xyzw")
    p = sub.add_parser("info", parents=[common], help="a clip's size, speeds and feet")
    p.add_argument("npz")
    p = sub.add_parser("make-dance", parents=[common],
                       help="generate the keyframed G1 dance (deterministic)")
    p.add_argument("npz")
    p = sub.add_parser("make-flip", parents=[common],
                       help="generate the G1 back flip, ballistic in the air (deterministic)")
    p.add_argument("npz")
    p = sub.add_parser("record", help="a trained policy's episode (a checkpoint) as a clip")
    p.add_argument("checkpoint")
    p.add_argument("npz")
    p.add_argument("--task-params", nargs="*", default=[], metavar="K=V",
                   help="task parameters over the checkpoint's, e.g. resample_steps=250")
    p.add_argument("--seconds", type=float, default=None,
                   help="episode length cap (default: the checkpoint's evaluation cap, else the "
                        "task's time limit)")
    p.add_argument("--seed", type=int, default=None,
                   help="start-state seed (default: the checkpoint's evaluation seed)")
    p.add_argument("--allow-fall", action="store_true",
                   help="keep an episode that ended in a fall (refused by default)")
    p.add_argument("--all-bodies", action="store_true",
                   help=f"keep every body (default: the {len(TRACKED_BODIES)} tracked ones)")
    return parser


def _task_params(items: Sequence[str]) -> dict[str, float]:
    """K=V items as task parameters (an int stays one: a task class's init args may need it)."""
    params: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            number = int(value) if value.strip().lstrip("+-").isdigit() else float(value)
        except ValueError:
            sep = ""
        if not sep or not name:
            raise ValueError(f"--task-params: expected NAME=NUMBER, got {item!r}")
        params[name] = number
    return params


def _run(args: argparse.Namespace) -> None:
    if args.command == "record":
        from lightning_unilab.motions.record import record_clip

        rec = record_clip(args.checkpoint, args.npz, _task_params(args.task_params),
                          args.seconds, args.seed, args.allow_fall,
                          None if args.all_bodies else TRACKED_BODIES)
        save_clip(rec.clip, args.npz)
        print(f"{args.npz}: {rec.clip.num_frames} frames at {rec.clip.fps:g} fps, "
              f"{rec.clip.duration:g} s, {len(rec.clip.body_names)} bodies ({rec.task}, "
              f"return {rec.ret:.2f}{', fell' if rec.terminated else ''})")
        return
    model = load_model(args.model)
    if args.command == "csv2npz":
        clip = csv_to_clip(args.csv, model, args.fps, args.out_fps, args.quat_order)
        save_clip(clip, args.npz)
        print(f"{args.npz}: {clip.num_frames} frames at {clip.fps:g} fps, "
              f"{len(clip.body_names)} bodies")
    elif args.command == "npz2csv":
        clip = load_clip(args.npz, model)
        clip_to_csv(clip, args.csv, args.quat_order, root_body_name(model))
        print(f"{args.csv}: {clip.num_frames} frames at {clip.fps:g} fps")
    elif args.command == "info":
        clip = load_clip(args.npz, model)
        print(f"{clip.path} ({clip.name})")
        print("\n".join(clip_report(clip, model).lines()))
        if root_body_name(model) in clip.body_names:
            print("\n".join(floor_demand(clip, model).lines()))
            print("\n".join(joint_demand(clip, model).lines()))
    else:
        clip = (make_dance if args.command == "make-dance" else make_flip)(model, args.npz)
        print(f"{args.npz}: {clip.num_frames} frames at {clip.fps:g} fps, "
              f"{clip.duration:g} s, {len(clip.body_names)} bodies")
        if args.command == "make-flip":
            print("\n".join(flip_report(clip, model).lines()))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        _run(args)
    except (ValueError, OSError, KeyError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
