"""An exported g1-walk-flat policy in plain MuJoCo, as a robot's deploy program runs it.

    python -m lightning_unilab.export checkpoint CKPT --format onnx --out build/export
    python examples/deploy/g1_mujoco.py build/export/policy.onnx.json --command 0.5 0 0 \
        --seconds 20

Everything comes from the export's JSON and the file beside it: the scene and its physics step,
the observation's terms and slices, the action scale and default pose, the control period. The
loop (:class:`lightning_unilab.export.mujoco_loop.MujocoPolicyLoop`) steps ``mujoco.MjData``
with ``mj_step`` and runs the policy with onnxruntime (torch only for a TorchScript file): no
pool, no Lightning, no task classes. It starts at the task's keyframe and prints whether the
robot fell (the task's own criterion, from the JSON) and when: a trained walk should report no
fall in 20 s. ``python -m lightning_unilab.export sim2sim`` holds the same loop against the
training stack's evaluation first.
"""

from __future__ import annotations

import argparse
import json

from lightning_unilab.export.sim2sim import walk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("export_json")
    parser.add_argument("--command", type=float, nargs=3, default=(0.5, 0.0, 0.0),
                        metavar=("VX", "VY", "YAW_RATE"), help="constant command (0.5 0 0)")
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    print(json.dumps(walk(args.export_json, args.seconds, args.command)))


if __name__ == "__main__":
    main()
