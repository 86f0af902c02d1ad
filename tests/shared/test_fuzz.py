"""The fuzz campaign (fuzz/campaign.py): its CI subset at every door (at least 1,000 generated
inputs, no crash, hang or wrong result), and the counting itself on doors that misbehave."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "fuzz"))

import campaign  # noqa: E402

PROBES = str(Path(__file__).with_name("fuzz_probe_doors.py"))
CI_EXAMPLES = 120  # per door: 10 doors, at least 1,000 inputs in all


def test_ci_subset_every_door_survives_its_inputs():
    rows = campaign.campaign(None, CI_EXAMPLES, seed=0, time_box=150, hang_s=30)
    assert {r["door"] for r in rows} == set(campaign.load_doors())
    assert sum(r["inputs"] for r in rows) >= 1000
    for r in rows:
        assert (r["crashes"], r["hangs"], r["wrong"]) == (0, 0, 0), r
        assert r["refused"] > 0, f"{r['door']}: no bad input was generated"
        assert r["ok"] + r["refused"] == r["inputs"], r


@pytest.mark.parametrize("door, kind", [("nan", "wrong"), ("crash", "crashes"),
                                        ("hang", "hangs")])
def test_the_campaign_counts_what_goes_wrong(door, kind):
    row = campaign.run_door(door, 50, seed=1, time_box=20, hang_s=2, registry=PROBES)
    assert row[kind] >= 1, row
    if kind == "wrong":
        assert row["wrong"] == row["inputs"] and "silent NaN" in row["examples"][0]["what"]


def test_a_refusal_must_name_its_argument():
    row = campaign.run_door("refuse", 60, seed=2, time_box=20, hang_s=5, registry=PROBES)
    assert row["refused"] > 0 and row["ok"] > 0 and row["wrong"] > 0, row
    assert any("names no argument" in e["what"] for e in row["examples"])
