"""Generated bad input at the public entry points: inputs, crashes, hangs and wrong results.

Each entry point (defined in ``fuzz/doors.py``) runs in its own spawned process, hypothesis
drawing up to ``--examples`` inputs under ``--seed``, until its ``--time-box`` is spent. The
process writes its counts after every input, so a segfault still leaves them: a process that
dies is a crash (at the input it was running), one whose current input has run longer than
``--hang-s`` is a hang. An input ends as ``ok`` (a correct result, checked by the entry point),
``refused`` (its documented exception, naming the argument) or ``wrong`` (anything else; the
first few are kept with their inputs).

    python fuzz/campaign.py --examples 2000 --time-box 120 --out build/fuzz.json
    python fuzz/campaign.py --entry "TaskVectorEnv.step" --examples 200 --seed 3

The result JSON keeps its keys (``doors``, ``door``): the module and its flag ``--door`` keep
the campaign's first name for an entry point.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

OUTCOMES = ("ok", "refused", "wrong")


DOORS_FILE = str(Path(__file__).resolve().parent / "doors.py")


def load_doors(registry: str = DOORS_FILE) -> dict[str, Any]:
    """The entry points of ``registry``, a file defining ``DOORS() -> {name: Door}``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(Path(registry).stem, registry)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.DOORS()


def _child(name: str, examples: int, seed: int, out: str, registry: str) -> None:
    """Run one entry point ``examples`` times; counts to ``out`` after every input."""
    import torch
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis import strategies as st

    torch.set_num_threads(1)
    door = load_doors(registry)[name]
    state = door.setup()
    counts: dict[str, Any] = {"inputs": 0, **dict.fromkeys(OUTCOMES, 0), "examples": [],
                              "started": time.time(), "finished": False}
    path = Path(out)

    def save() -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(counts))
        tmp.replace(path)

    @hypothesis_seed(seed)
    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), print_blob=False)
    @given(st.data())
    def knock(data: Any) -> None:
        # an input counts once settled (hypothesis may discard one mid-draw); "running" says
        # an input is under way, for a crash or hang to be counted at it
        counts["running"] = True
        counts["started"] = time.time()
        save()
        data = _Recording(data, lambda text: (counts.__setitem__("current", text), save()))
        try:
            door.knock(state, data)
            outcome = "ok"
        except door.refusals as err:
            named = not door.names or any(n in str(err) for n in door.names)
            outcome = "refused" if named else "wrong"
            if not named:
                _keep(counts, data, f"refusal names no argument: {type(err).__name__}: {err}")
        except Exception as err:  # noqa: BLE001 - every other failure is the finding
            outcome = "wrong"
            _keep(counts, data, "".join(traceback.format_exception_only(err)).strip())
        counts[outcome] += 1
        counts["inputs"] += 1
        counts["running"] = False

    knock()
    counts["running"] = False
    counts["finished"] = True
    save()


class _Recording:
    """hypothesis' ``data`` keeping what was drawn, so that a wrong result shows its input."""

    def __init__(self, data: Any, note: Any = None) -> None:
        self.data, self.values, self.note = data, [], note

    def draw(self, strategy: Any, label: Any = None) -> Any:
        value = self.data.draw(strategy, label)
        self.values.append(value)
        if self.note is not None:  # the input so far, for a crash or a hang to show
            self.note(repr(self))
        return value

    def __repr__(self) -> str:
        return ", ".join(repr(v)[:120] for v in self.values)


def _keep(counts: dict[str, Any], data: Any, what: str) -> None:
    if len(counts["examples"]) < 5:
        counts["examples"].append({"input": repr(data)[:600], "what": what[:600]})


def run_door(name: str, examples: int, seed: int, time_box: float, hang_s: float,
             registry: str = DOORS_FILE) -> dict[str, Any]:
    """One entry point in a spawned process: its counts plus crashes, hangs and its wall time."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "counts.json"
        proc = mp.get_context("spawn").Process(target=_child, args=(name, examples, seed,
                                                                      str(out), registry))
        t0 = time.monotonic()
        proc.start()
        crash = hang = boxed = 0
        while proc.is_alive():
            proc.join(0.5)
            counts = _read(out)
            running = time.time() - counts["started"] if counts else 0.0
            if counts and counts.get("running") and running > hang_s:
                hang = 1
                break
            if time.monotonic() - t0 > time_box + hang_s:  # the box spent: stop here
                boxed = 1
                break
        if proc.is_alive():
            proc.kill()
            proc.join()
        counts = _read(out) or {"inputs": 0, **dict.fromkeys(OUTCOMES, 0), "examples": [],
                                "finished": False, "running": False}
        if proc.exitcode not in (0, None) and not counts["finished"] and not hang | boxed:
            crash = 1  # died at the input it was running (not killed here at the box's end)
        if crash or hang:
            counts["examples"].append({"input": counts.get("current", "?"),
                                       "what": "crash" if crash else f"hang (> {hang_s} s)"})
        return {"door": name, "inputs": counts["inputs"] + crash + hang,
                **{o: counts[o] for o in OUTCOMES}, "crashes": crash, "hangs": hang,
                "time_box_spent": not counts["finished"] and not crash and not hang,
                "exitcode": proc.exitcode, "seconds": round(time.monotonic() - t0, 1),
                "examples": counts["examples"], "seed": seed}


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def campaign(doors: list[str] | None, examples: int, seed: int, time_box: float,
             hang_s: float, registry: str = DOORS_FILE,
             on_result: Callable[[list[dict[str, Any]]], None] | None = None,
             ) -> list[dict[str, Any]]:
    """Every entry point in turn; ``on_result(results)`` sees the results so far after each."""
    names = doors or list(load_doors(registry))
    rows = []
    for name in names:
        row = run_door(name, examples, seed, time_box, hang_s, registry)
        print(f"{name:24s} {row['inputs']:6d} inputs  ok {row['ok']:5d}  refused "
              f"{row['refused']:5d}  wrong {row['wrong']:3d}  crashes {row['crashes']}  "
              f"hangs {row['hangs']}  ({row['seconds']} s, seed {seed})", flush=True)
        for ex in row["examples"]:
            print(f"    wrong: {ex['what']}\n      input: {ex['input']}")
        rows.append(row)
        if on_result is not None:
            on_result(rows)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entry", "--door", dest="door", action="append", default=None,
                        metavar="NAME",
                        help="an entry point by name (repeatable; --door is the old spelling)")
    parser.add_argument("--examples", type=int, default=500, help="inputs per entry point at most")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-box", type=float, default=120.0, help="seconds per entry point")
    parser.add_argument("--hang-s", type=float, default=30.0,
                        help="one input running longer than this is a hang")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    t0 = time.monotonic()

    def save(rows: list[dict[str, Any]], finished: bool = False) -> dict[str, int]:
        """The results so far to ``--out``: a long run interrupted keeps what it counted."""
        total = {k: sum(r[k] for r in rows) for k in ("inputs", "wrong", "crashes", "hangs")}
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({
                "seed": args.seed, "examples": args.examples, "time_box": args.time_box,
                "finished": finished, "seconds": round(time.monotonic() - t0, 1),
                "doors": rows, "total": total}, indent=1))
        return total

    rows = campaign(args.door, args.examples, args.seed, args.time_box, args.hang_s,
                    on_result=save)
    total = save(rows, finished=True)
    print(f"total: {total['inputs']} inputs, {total['wrong']} wrong, {total['crashes']} "
          f"crashes, {total['hangs']} hangs (seed {args.seed}, {round(time.monotonic() - t0)} s)")
    return 1 if total["wrong"] or total["crashes"] or total["hangs"] else 0


if __name__ == "__main__":
    sys.exit(main())
