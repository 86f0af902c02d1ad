"""benchmarks/tracking_eval.py: which episodes it runs (start frames over each clip, or each
clip's first frame for the flip's tries) and how it refuses bad counts."""

from __future__ import annotations

import re

import numpy as np
import pytest
from unilab_models import load_benchmark


@pytest.fixture(scope="module")
def tracking_eval():
    return load_benchmark("tracking_eval")


def test_starts_spread_over_each_clip(tracking_eval):
    # clips of 11 and 6 frames: 0, 10//3*1=3, 20//3=6 over the first; 11 + (0, 1, 3) over the second
    assert tracking_eval.spread_starts(np.array([11, 6]), 3) == [
        (0, 0), (0, 3), (0, 6), (1, 11), (1, 12), (1, 14)]


def test_tries_start_at_each_clips_first_frame(tracking_eval):
    assert tracking_eval.first_frames(np.array([272])) == [(0, 0)]
    assert tracking_eval.first_frames(np.array([5, 7, 2])) == [(0, 0), (1, 5), (2, 12)]


@pytest.mark.parametrize("argv,message", [
    (["--tries", "-1"], "--tries: expected 0 .off. or a positive number, got -1"),
    (["--tries", "5", "--min-landings", "6"],
     r"--min-landings: expected 1 to --tries \(5\), got 6"),
    (["--starts", "0"], "--starts: expected a positive number, got 0"),
])
def test_bad_counts_are_refused_by_name(tracking_eval, capsys, argv, message):
    with pytest.raises(SystemExit):
        tracking_eval.main(["never-read.ckpt", "--out", "x.json", *argv])
    assert re.search(message, capsys.readouterr().err)
