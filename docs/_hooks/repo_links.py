"""MkDocs hook: links from the docs to repository files outside ``docs/``.

The pages are written to read on GitHub too, so a page links a recipe or a benchmark script by
its relative path in the repository (``../../recipes/unilab/g1_walk_flat.yaml``). MkDocs only
knows the files under ``docs_dir`` and, under ``--strict``, fails on such a link. This hook
resolves every relative link of every page against the page's place in the repository:

- a target under ``docs/`` is left to MkDocs, which checks the file and the anchor;
- a target elsewhere in the repository must exist (else a warning, so ``--strict`` fails); it is
  served by the site as ``repo/<path>`` (a Markdown file there is rendered as a page, whose own
  links are resolved the same way) and the link is rewritten to it;
- a link to a directory is refused (the site cannot list it): link a file in it.

Links inside code (fenced blocks, inline code) are left alone.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

log = logging.getLogger("mkdocs.hooks.repo_links")

PREFIX = "repo/"  # where repository files outside docs/ live in the site

_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,}).*?^[ \t]*\1[ \t]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"(`+)(?!`).+?(?<!`)\1(?!`)", re.S)
_INLINE = re.compile(r"(\]\()(<[^>]*>|[^)\s]+)((?:\s+\"[^\"]*\")?\))")
_REFERENCE = re.compile(r"^([ ]{0,3}\[[^\]]+\]:[ \t]*)(<[^>]*>|\S+)", re.M)


def _masked(markdown: str) -> str:
    """The text with code blanked out (same length, so offsets stay valid)."""
    def blank(m: re.Match) -> str:
        return re.sub(r"[^\n]", " ", m.group(0))

    return _CODE_SPAN.sub(blank, _FENCE.sub(blank, markdown))


def _links(markdown: str) -> list[tuple[int, int, str]]:
    """(start, end, target) of every inline and reference link outside code."""
    masked = _masked(markdown)
    found = [(m.start(2), m.end(2), markdown[m.start(2):m.end(2)])
             for pattern in (_INLINE, _REFERENCE) for m in pattern.finditer(masked)]
    return sorted(found)


def _repo_path(src_uri: str, docs: str) -> str:
    """A page's path in the repository, from its path in the site's sources."""
    if src_uri.startswith(PREFIX):
        return src_uri[len(PREFIX):]
    return posixpath.join(docs, src_uri)


def _resolve(target: str, page_repo_path: str) -> tuple[str, str] | None:
    """(repository path, '#fragment' or '') of a relative link; None for other links."""
    bare = target[1:-1] if target.startswith("<") else target
    parts = urlsplit(bare)
    if parts.scheme or parts.netloc or not parts.path or parts.path.startswith("/"):
        return None
    path = posixpath.normpath(posixpath.join(posixpath.dirname(page_repo_path),
                                             unquote(parts.path)))
    return path, f"#{parts.fragment}" if parts.fragment else ""


class _Repo:
    def __init__(self, config: MkDocsConfig) -> None:
        self.docs_dir = Path(config.docs_dir).resolve()
        self.root = Path(config.config_file_path).resolve().parent
        self.docs = self.docs_dir.relative_to(self.root).as_posix()

    def outside(self, path: str) -> bool:
        return path != self.docs and not path.startswith(self.docs + "/")

    def site_uri(self, path: str) -> str:
        """Where a repository path lives among the site's sources."""
        return PREFIX + path if self.outside(path) else path[len(self.docs) + 1:]


def _nav_entries(nav: object) -> list[str]:
    """Every file named in the nav."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [e for v in nav.values() for e in _nav_entries(v)]
    if isinstance(nav, list):
        return [e for v in nav for e in _nav_entries(v)]
    return []


def on_files(files: Files, config: MkDocsConfig) -> Files:
    repo = _Repo(config)
    pending = list(files.documentation_pages())
    # (who links it, repository path, the link as written); the nav may name one as
    # repo/<path> (the changelog), as if a page linked it
    wanted = [("mkdocs.yml nav", e[len(PREFIX):], e) for e in _nav_entries(config.nav)
              if e.startswith(PREFIX)]
    added: set[str] = set()
    while pending or wanted:
        if not wanted:
            page = pending.pop()
            text = Path(page.abs_src_path).read_text(encoding="utf-8")
            here = _repo_path(page.src_uri, repo.docs)
            wanted = [(page.src_uri, r[0], t) for _, _, t in _links(text)
                      if (r := _resolve(t, here)) is not None and repo.outside(r[0])]
            continue
        source, path, target = wanted.pop()
        if path in added:
            continue
        full = (repo.root / path).resolve()
        if path.startswith("../") or not full.is_relative_to(repo.root):
            log.warning(f"{source}: link '{target}' leaves the repository")
        elif not full.exists():
            log.warning(f"{source}: link '{target}': no file {path} in the repository")
        elif full.is_dir():
            log.warning(f"{source}: link '{target}' is a directory ({path}); the site cannot "
                        "list one: link a file in it")
        else:
            added.add(path)
            new = File.generated(config, PREFIX + path, abs_src_path=str(full))
            files.append(new)
            if new.is_documentation_page():
                pending.append(new)
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    repo = _Repo(config)
    here = _repo_path(page.file.src_uri, repo.docs)
    out, last = [], 0
    for start, end, target in _links(markdown):
        resolved = _resolve(target, here)
        if resolved is None:
            continue
        path, fragment = resolved
        if not repo.outside(path) and not page.file.src_uri.startswith(PREFIX):
            continue  # a docs page's link into docs/: MkDocs checks it as written
        new = posixpath.relpath(repo.site_uri(path), posixpath.dirname(page.file.src_uri) or ".")
        out += [markdown[last:start], new + fragment]
        last = end
    return "".join(out) + markdown[last:]
