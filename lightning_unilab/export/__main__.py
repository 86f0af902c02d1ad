"""``python -m lightning_unilab.export``: export a checkpoint's policy; check it sim-to-sim.

    python -m lightning_unilab.export checkpoint CKPT --format onnx [--out DIR]
    python -m lightning_unilab.export sim2sim DIR/policy.onnx.json [--steps 100]
        [--command 0.5 0 0] [--seconds 20]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from lightning_omnilab import safe_load
from lightning_unilab.envs.tasks.ref import TaskBuildError
from lightning_unilab.evaluate import TaskMismatchError
from lightning_unilab.export.checkpoint import export_checkpoint
from lightning_unilab.export.formats import FORMATS
from lightning_unilab.export.sim2sim import compare_with_evaluation, walk

# what the commands report as a usage error (exit 2) rather than a traceback
_REFUSED = (ValueError, TypeError, FileNotFoundError, ImportError, TaskBuildError,
            TaskMismatchError, safe_load.UnsafeCheckpointError)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lightning_unilab.export",
                                     description=__doc__.split("\n")[0], allow_abbrev=False)
    sub = parser.add_subparsers(dest="cmd", required=True)
    ck = sub.add_parser("checkpoint", allow_abbrev=False,
                        help="export the actor of a lightning_unilab.train checkpoint")
    ck.add_argument("ckpt")
    # no argparse choices: the house message ("format: expected one of ..., got ...") instead
    ck.add_argument("--format", default="onnx", help=f"one of {', '.join(FORMATS)} (onnx)")
    ck.add_argument("--out", default=None,
                    help="directory for policy.<ext> and its JSON (default: export/ beside "
                         "the checkpoint)")
    ck.add_argument("--tolerance", type=float, default=1e-5,
                    help="largest max abs action diff of the file against the evaluation's "
                         "actor that is accepted (1e-5)")
    s2s = sub.add_parser("sim2sim", allow_abbrev=False,
                         help="the export in a plain MuJoCo loop against the training stack's "
                              "evaluation, then alone from the keyframe, reporting falls")
    s2s.add_argument("export_json")
    s2s.add_argument("--steps", type=int, default=100,
                     help="control steps compared with the evaluation rollout (100)")
    s2s.add_argument("--command", type=float, nargs="+", default=None,
                     help="constant command, one value per component (g1-walk-flat: vx vy "
                          "yaw_rate; default zeros)")
    s2s.add_argument("--seed", type=int, default=None,
                     help="the evaluation's start-state seed (default: the recipe's)")
    s2s.add_argument("--seconds", type=float, default=20.0,
                     help="then run the loop alone this long from the keyframe and report "
                          "falls (20; 0: skip)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.cmd == "checkpoint":
            done = export_checkpoint(args.ckpt, args.format, args.out, tolerance=args.tolerance)
            v = done.description["verification"]
            print(f"{done.model}: {done.description['format']}, max abs diff "
                  f"{v['max_abs_diff']:.3g} against the evaluation's actor on "
                  f"{v['observations']} observations ({v['runtime']}), "
                  f"{done.description['export_seconds']:.1f} s "
                  f"({done.description['export_cpu_seconds']:.1f} s CPU); {done.json}")
            return 0
        report = {"compare": compare_with_evaluation(args.export_json, args.steps,
                                                     args.command, args.seed)}
        for mode in ("closed_loop", "driven"):
            report["compare"][mode].pop("action_diff_per_step")
        if args.seconds > 0:
            report["walk"] = walk(args.export_json, args.seconds, args.command)
        print(json.dumps(report, indent=1))
        return 0
    except _REFUSED as err:
        parser.error(str(err))
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
