"""One validator per argument rule, shared by lightning_omni and lightning_unilab.

Every check raises an error that names the argument, says what was expected and shows what came
(``"num_envs: expected an int >= 1, got 0"``), and returns the value normalized (a numpy integer
becomes an ``int``). ``bool`` is not an int here although Python says it is:
``pipeline_parallel=True`` is a mistake, not a 1. Standard library only, so that the pure planner
can use it too.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Collection
from typing import Any, NoReturn, TypeVar

T = TypeVar("T")


class ArgumentTypeError(TypeError, ValueError):
    """A value of the wrong type. A TypeError, and also a ValueError so that callers written
    against the earlier ``ValueError`` (e.g. omni-plan's exit status 2) still catch it."""


def fail(name: str, expected: str, got: object, error: type[Exception] = ValueError) -> NoReturn:
    """Raise ``error`` in the house format: ``"{name}: expected {expected}, got {got!r}"``."""
    raise error(f"{name}: expected {expected}, got {got!r}")


def require(condition: bool, name: str, expected: str, got: object) -> None:
    """The general rule, for checks no named validator covers: ValueError unless ``condition``."""
    if not condition:
        fail(name, expected, got)


def integer(name: str, value: Any, *, minimum: int | None = None, below: int | None = None,
            none_ok: bool = False, why: str | None = None) -> Any:
    """An int (or numpy integer, returned as ``int``), never a bool, in ``[minimum, below)``;
    ``why`` explains the bound in the message."""
    if value is None and none_ok:
        return None
    parts = ["an int"]
    if minimum is not None:
        parts.append(f">= {minimum}")
    if below is not None:
        parts.append(f"{'and ' if minimum is not None else ''}below {below}")
    expected = " ".join(parts) + (f" ({why})" if why else "") + (" or None" if none_ok else "")
    number = _as_int(value)
    if number is None:
        fail(name, expected, value, ArgumentTypeError)
    if not _within(number, minimum, below):
        fail(name, expected, value)
    return number


def is_int(value: Any, *, minimum: int | None = None, below: int | None = None) -> bool:
    """Whether ``integer`` would accept ``value``: for checks over a collection whose message
    shows the whole collection."""
    number = _as_int(value)
    return number is not None and _within(number, minimum, below)


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)  # int and numpy integers; not floats, not numpy bools
    except TypeError:
        return None


def _within(number: int, minimum: int | None, below: int | None) -> bool:
    return (minimum is None or number >= minimum) and (below is None or number < below)


def positive_int(name: str, value: Any, *, below: int | None = None, none_ok: bool = False,
                 why: str | None = None) -> Any:
    """An int >= 1 (a count: stages, microbatches, envs, threads)."""
    return integer(name, value, minimum=1, below=below, none_ok=none_ok, why=why)


def non_negative_int(name: str, value: Any, *, none_ok: bool = False,
                     why: str | None = None) -> Any:
    """An int >= 0 (a seed, a lag, an optional count where 0 means "off")."""
    return integer(name, value, minimum=0, none_ok=none_ok, why=why)


def number(name: str, value: Any, *, low: float | None = None, high: float | None = None,
           low_open: bool = False, high_open: bool = False, none_ok: bool = False) -> Any:
    """A finite real number (int or float, never a bool) in the given interval, as a float."""
    if value is None and none_ok:
        return None
    if low is not None and high is not None:
        expected = f"a number in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    elif low is not None:
        expected = f"a number {'>' if low_open else '>='} {low}"
    elif high is not None:
        expected = f"a number {'<' if high_open else '<='} {high}"
    else:
        expected = "a finite number"
    expected += " or None" if none_ok else ""
    try:
        real = float(value) if not isinstance(value, bool | str | bytes) else None
    except (TypeError, ValueError):
        real = None
    if real is None:
        fail(name, expected, value, ArgumentTypeError)
    if not math.isfinite(real) or (low is not None and (real <= low if low_open else real < low)) \
            or (high is not None and (real >= high if high_open else real > high)):
        fail(name, expected, value)
    return real


def positive_number(name: str, value: Any, *, none_ok: bool = False) -> Any:
    """A finite number > 0 (a clip, a rate, a size limit)."""
    return number(name, value, low=0, low_open=True, none_ok=none_ok)


def probability(name: str, value: Any) -> float:
    """A number in [0, 1] (a discount, a GAE lambda, a share)."""
    return number(name, value, low=0, high=1)


def one_of(name: str, value: T, choices: Collection[Any], *, expected: str | None = None) -> T:
    """``value`` if it is one of ``choices``; a bool never passes for 0 or 1."""
    if not any(c == value and isinstance(c, bool) == isinstance(value, bool) for c in choices):
        fail(name, expected or f"one of {tuple(choices)}", value)
    return value


def boolean(name: str, value: Any) -> bool:
    """True or False, not a truthy stand-in (``1``, ``"no"``)."""
    if not isinstance(value, bool):
        fail(name, "True or False", value, ArgumentTypeError)
    return value
