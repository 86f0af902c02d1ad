"""A command's argument errors end in one line, as argparse's do: the flag, what was expected
and what came, exit code 2, no traceback.

Two kinds reach a LightningCLI user. jsonargparse's own (a value of the wrong type) end in a
message spread over lines whose last one does not name the flag (``Parser key "model.lr":`` /
``Expected a <class 'float'>. Got value: abc``): :func:`one_line` joins it into
``--model.lr: expected a float, got 'abc'``. And the constructors' (``num_envs: expected an int
>= 1, got -3``), raised while the CLI instantiates the classes, would end in a traceback:
:class:`OneLineErrorsCLI` reports them as parser errors naming the flag (``--data.num_envs``).
Only ValueError, TypeError and Lightning's MisconfigurationException raised while the classes
are built count; an error once training runs keeps its traceback.
"""

from __future__ import annotations

import inspect
import re
import types
from collections.abc import Iterable
from typing import Any, NoReturn

from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

__all__ = ["ARGUMENT_ERRORS", "OneLineErrorParser", "OneLineErrorsCLI", "constructor_error",
           "one_line"]

# what a constructor raises for a bad value (the house validators: lightning_omnilab.validate)
ARGUMENT_ERRORS = (ValueError, TypeError, MisconfigurationException)

_PARSER_KEY = re.compile(r'^Parser key "([\w.]+)"(?: element (\d+))?:\s*', re.S)
_EXPECTED = re.compile(r"Expected an? (?:<class '([\w.]+)'>|([^.\n]+?))(?:\.|\n|$)")
_GOT = re.compile(r"(?:Got value|Given value): (.*?)\s*$", re.M)
_ARTICLE = {"int": "an int", "float": "a float", "str": "a string", "bool": "a bool",
            "NoneType": "None"}


def one_line(message: str) -> str:
    """jsonargparse's message for a bad value (``Parser key "a.b":`` over several lines) as
    ``--a.b: expected ..., got ...``; other messages with their lines joined."""
    match = _PARSER_KEY.match(message)
    if match is None:
        return " ".join(message.split())
    flag = f"--{match.group(1)}" + (f" (element {match.group(2)})" if match.group(2) else "")
    rest = message[match.end():]
    expected = []
    for cls, text in _EXPECTED.findall(rest):
        name = _ARTICLE.get(cls.rpartition(".")[2], f"a {cls}") if cls else text.strip()
        if name not in expected:
            expected.append(name)
    got = _GOT.findall(rest)
    if expected and got:
        return f"{flag}: expected {' or '.join(expected)}, got {got[0]!r}"
    return f"{flag}: " + " ".join(rest.replace("\n- ", "; ").split())


class OneLineErrorParser(LightningArgumentParser):
    """LightningCLI's parser whose errors end in one line (:func:`one_line`)."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        super().error(one_line(message), ex)


def _built_class(err: BaseException) -> type | None:
    """The class whose constructor was running when ``err`` was raised: the outermost
    ``__init__`` frame of its traceback (a data module's, not that of a config it builds)."""
    tb: types.TracebackType | None = err.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "__init__" and "self" in frame.f_locals:
            return type(frame.f_locals["self"])
        tb = tb.tb_next
    return None


def _flag(name: str, built: type | None, groups: dict[str, type | None]) -> str | None:
    """``--group.name`` where ``built`` is (a subclass of) the group's class and takes
    ``name``; None where no group claims it."""
    if built is None:
        return None
    for group, cls in groups.items():
        if cls is None or not issubclass(built, cls):
            continue
        try:
            parameters = inspect.signature(built).parameters
        except (TypeError, ValueError):
            return None
        return f"--{group}.{name}" if name in parameters else None
    return None


def constructor_error(err: BaseException, groups: dict[str, type | None],
                      flags: Iterable[str] = ()) -> str:
    """``err`` (raised by a constructor the CLI called) as one line naming its flag.

    ``groups``: the CLI's config groups and their classes (``{"model": APPOModule, ...}``).
    The message's leading ``name:`` becomes the flag of the group whose class raised it
    (``num_envs: ...`` from the data module: ``--data.num_envs: ...``) where that class takes
    an argument of that name, or the command's own flag of that name among ``flags``
    (``--learner_threads``); else the class is named (``Trainer: ...``)."""
    message = " ".join(str(err).split())
    built = _built_class(err)
    name = re.match(r"([A-Za-z_]\w*):", message)
    flag = _flag(name.group(1), built, groups) if name is not None else None
    if name is not None and flag is None and f"--{name.group(1)}" in set(flags):
        flag = f"--{name.group(1)}"
    if flag is not None:
        return f"{flag}:{message[name.end():]}"
    return f"{built.__name__}: {message}" if built is not None else message


class OneLineErrorsCLI(LightningCLI):
    """LightningCLI whose argument errors end in one line and exit code 2 (argparse's way).

    ``exit_on_argument_error=False`` lets the constructors' errors propagate instead (a
    caller in Python gets the exception); jsonargparse's own errors exit either way."""

    def __init__(self, *args: Any, exit_on_argument_error: bool = True, **kwargs: Any) -> None:
        self.exit_on_argument_error = exit_on_argument_error
        kwargs.setdefault("parser_class", OneLineErrorParser)
        super().__init__(*args, **kwargs)

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except ARGUMENT_ERRORS as err:
            self.argument_error(err)

    def argument_error(self, err: BaseException) -> None:
        """Exit with ``err`` as a parser error naming its flag (unless
        ``exit_on_argument_error`` is False: then re-raise it)."""
        if not self.exit_on_argument_error:
            raise err
        groups = {"model": self.model_class, "data": self.datamodule_class,
                  "trainer": self.trainer_class}
        # argparse keeps its flags only in this mapping (no public accessor)
        flags = self.parser._option_string_actions
        self.parser.error(constructor_error(err, groups, flags))
