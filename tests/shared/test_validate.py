"""The shared argument validators: one rule each, one message format, bool is not an int."""

import math

import numpy as np
import pytest

from lightning_omnilab import validate as v


def test_positive_int_accepts_ints_and_numpy_ints_and_returns_an_int():
    assert v.positive_int("n", 3) == 3
    got = v.positive_int("n", np.int64(4))
    assert got == 4 and type(got) is int


@pytest.mark.parametrize("value,error,match", [
    (True, TypeError, r"^n: expected an int >= 1, got True$"),
    (np.True_, TypeError, r"^n: expected an int >= 1, got np.True_$"),
    (2.0, TypeError, r"^n: expected an int >= 1, got 2.0$"),
    ("2", TypeError, r"^n: expected an int >= 1, got '2'$"),
    (0, ValueError, r"^n: expected an int >= 1, got 0$"),
])
def test_positive_int_refuses_naming_argument_expectation_and_value(value, error, match):
    with pytest.raises(error, match=match):
        v.positive_int("n", value)


def test_a_wrong_type_is_also_a_value_error_for_callers_that_catch_value_errors():
    with pytest.raises(ValueError):
        v.positive_int("n", False)
    assert issubclass(v.ArgumentTypeError, TypeError)
    assert issubclass(v.ArgumentTypeError, ValueError)


def test_bounds_none_and_non_negative():
    assert v.non_negative_int("seed", 0) == 0
    with pytest.raises(ValueError, match=r"^seed: expected an int >= 0, got -1$"):
        v.non_negative_int("seed", -1)
    with pytest.raises(ValueError, match=r"expected an int >= 1 and below 8, got 8"):
        v.positive_int("envs", 8, below=8)
    assert v.positive_int("lag", None, none_ok=True) is None
    with pytest.raises(ValueError, match=r"^lag: expected an int >= 1 or None, got 0$"):
        v.positive_int("lag", 0, none_ok=True)
    with pytest.raises(TypeError, match=r"expected an int >= 2, got None"):
        v.integer("slots", None, minimum=2)


def test_numbers_and_probabilities():
    assert v.probability("gamma", 1) == 1.0 and v.probability("gamma", np.float32(0.5)) == 0.5
    for bad in (-0.1, 1.5, math.nan):
        with pytest.raises(ValueError, match=r"^gamma: expected a number in \[0, 1\], got"):
            v.probability("gamma", bad)
    with pytest.raises(TypeError, match="gamma: expected a number in"):
        v.probability("gamma", True)
    with pytest.raises(ValueError, match=r"^clip: expected a number > 0, got 0$"):
        v.positive_number("clip", 0)
    assert v.positive_number("clip", None, none_ok=True) is None
    with pytest.raises(ValueError, match=r"expected a finite number, got inf"):
        v.number("x", math.inf)
    with pytest.raises(ValueError, match=r"expected a number in \(0, 1\), got 1"):
        v.number("x", 1, low=0, high=1, low_open=True, high_open=True)


def test_one_of_boolean_and_require():
    assert v.one_of("mode", "a", ("a", "b")) == "a"
    with pytest.raises(ValueError, match=r"^mode: expected one of \('a', 'b'\), got 'c'$"):
        v.one_of("mode", "c", ("a", "b"))
    with pytest.raises(ValueError, match=r"^stage: expected 0 or 1, got True$"):
        v.one_of("stage", True, (0, 1), expected="0 or 1")
    assert v.boolean("flag", False) is False
    with pytest.raises(TypeError, match=r"^flag: expected True or False, got 1$"):
        v.boolean("flag", 1)
    v.require(True, "x", "anything", 0)
    with pytest.raises(ValueError, match=r"^x: expected a pair, got \(1,\)$"):
        v.require(False, "x", "a pair", (1,))
