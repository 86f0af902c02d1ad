"""SHA-256 digests beside files: the one format and the one check.

A file ``x`` that the project writes has ``x.sha256`` beside it, in the format ``sha256sum``
writes and checks (``<hex>  x``), so ``cd dir && sha256sum -c x.sha256`` checks it without this
package. While ``lightning_omnilab.durable`` swaps a file the digest file names both the old
and the new file's digest (two lines): whichever file a kill leaves there passes ``check``, and
``sha256sum -c`` then reports one line OK and one FAILED.

``check`` is the reader's side: a file whose digest file does not name its SHA-256 raises
``DigestMismatchError`` naming the file and both digests. A file without a digest file
(written by an older version of the project or by plain Lightning) is read with its reader's
own checks only; that is logged once per file at INFO. A link is checked against the digest
beside the file it points to (Lightning's ``save_last="link"``). No torch here: motion clips
and exported weights use it too.
"""

from __future__ import annotations

import hashlib
import logging
import os
import string
from typing import IO

__all__ = ["CorruptCheckpointError", "DigestMismatchError", "check", "digest_path", "expected",
           "file_digest", "format_lines"]

log = logging.getLogger(__name__)
_HEX = frozenset(string.hexdigits.lower())
_unchecked: set[str] = set()  # files already logged as read without a digest


class CorruptCheckpointError(ValueError):
    """A checkpoint file that cannot be read: truncated (an interrupted copy) or corrupted."""


class DigestMismatchError(CorruptCheckpointError):
    """A file's SHA-256 is not one its digest file names: the bytes changed after the save."""

    def __init__(self, path: str, expected: list[str], found: str, digest_file: str) -> None:
        self.path, self.expected, self.found = path, expected, found
        want = expected[0] if len(expected) == 1 else f"one of {', '.join(expected)}"
        super().__init__(f"{path}: not a readable checkpoint (corrupted?): its SHA-256 is "
                         f"{found}, {digest_file} expects {want}. The file changed after it "
                         "was saved (a damaged disk or copy); load another checkpoint or "
                         "restore this one")


def digest_path(path: str | os.PathLike) -> str:
    return f"{os.fspath(path)}.sha256"


def file_digest(file: str | os.PathLike | IO[bytes]) -> str:
    """The SHA-256 (hex) of a file, named or open for reading at its start."""
    if not hasattr(file, "read"):
        with open(file, "rb") as f:
            return file_digest(f)
    h = hashlib.sha256()
    for block in iter(lambda: file.read(1 << 20), b""):
        h.update(block)
    return h.hexdigest()


def format_lines(name: str, digests: list[str]) -> str:
    """``sha256sum``'s lines for ``name`` (a name with a backslash or a line break escaped as
    GNU coreutils does)."""
    if any(c in name for c in "\\\n\r"):
        name = name.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
        return "".join(f"\\{d}  {name}\n" for d in digests)
    return "".join(f"{d}  {name}\n" for d in digests)


def expected(path: str | os.PathLike) -> tuple[list[str], str] | None:
    """The digests the digest file beside ``path`` (beside its target, for a link) accepts,
    and that digest file; None where there is none. A digest file that is not one raises
    ``CorruptCheckpointError`` naming it."""
    file = digest_path(os.path.realpath(path))
    try:
        with open(file) as f:
            text = f.read()
    except FileNotFoundError:
        return None
    digests = []
    for line in text.splitlines():
        word = line.split(maxsplit=1)[0].lstrip("\\") if line.strip() else ""
        if not word or line.startswith("#"):
            continue
        if len(word) != 64 or not set(word) <= _HEX:
            raise CorruptCheckpointError(f"{file}: not a SHA-256 digest file (a line reads "
                                         f"{line[:80]!r})")
        digests.append(word)
    if not digests:
        raise CorruptCheckpointError(f"{file}: not a SHA-256 digest file (no digest in it)")
    return digests, file


def check(path: str | os.PathLike) -> bool:
    """Raise ``DigestMismatchError`` where ``path``'s digest file does not name its SHA-256;
    True where it was checked, False where it has no digest file (read unchecked)."""
    want = expected(path)
    if want is None:
        name = os.fspath(path)
        if name not in _unchecked:
            _unchecked.add(name)
            log.info("%s: no digest file beside it (written by plain Lightning or an older "
                     "version?): read with the reader's own checks only", name)
        return False
    digests, file = want
    found = file_digest(os.path.realpath(path))
    if found not in digests:
        raise DigestMismatchError(os.fspath(path), digests, found, file)
    return True
