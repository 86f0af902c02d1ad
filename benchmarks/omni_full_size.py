"""A workload's layout checked at full size on one CPU process: the real Hugging Face model,
OmniStrategy's setup and one training step per rank role on fake tensors, against the
planner's prediction for the same rank (``lightning_omni.full_size.verify_layout``; the same
check as ``omni-plan WORKLOAD.yaml --verify``).

    python benchmarks/omni_full_size.py recipes/omni_plan/workload_a_vit1b_llama12b.yaml \
        --layout best --out docs/omni/data/full_size_workload_a.json

``--layout best`` is the Omni layout ``omni-plan`` picks; any layout string it prints is
accepted (``"TP8 PP2 VPP2 DP16 +enc-recompute"``). Prints one line per rank role; ``--out``
writes the report as JSON (fields: docs/omni/full_size.md); ``--roles 0:0,1:0`` measures only
those (stage, TP rank) roles.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from lightning_omni.cli import verify_main

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload", type=Path, help="workload YAML (docs/omni/planning.md)")
    ap.add_argument("--layout", default="best",
                    help="'best' (omni-plan's Omni layout) or a layout string it prints")
    ap.add_argument("--out", type=Path, default=None, help="write the report as JSON here")
    ap.add_argument("--roles", type=_roles, default=None, metavar="STAGE:TP,...",
                    help="measure only these (pipeline stage, TP rank) roles (default: all)")
    args = ap.parse_args(argv)
    report = verify_main(args.workload, args.layout, args.roles)
    if report is None:
        return 2
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


def _roles(text: str) -> list[tuple[int, int]]:
    try:
        pairs = [tuple(int(n) for n in word.split(":")) for word in text.split(",")]
    except ValueError:
        pairs = []
    if not pairs or any(len(p) != 2 or min(p) < 0 for p in pairs):
        raise argparse.ArgumentTypeError(f"expected STAGE:TP pairs such as '0:0,1:0', got "
                                         f"{text!r}")
    return pairs


if __name__ == "__main__":
    sys.exit(main())
