"""MkDocs hook: the ``--help`` of the project's commands, captured when the site is built.

A page asks for a command's help with a comment, invisible on GitHub:

    <!-- help: lightning_unilab.train --help -->

(a module run as ``python -m`` and its arguments). The hook runs every such command of the
site in one Python process (the imports are paid once), each as ``python -m`` would, and puts
its output in place of the comment. A command that fails or prints nothing is a warning, so
``mkdocs build --strict`` fails. The outputs are cached under ``build/docs_cli_help/`` by a
hash of the commands and of every Python source of the packages, so a rebuild with unchanged
code runs nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import Files
from mkdocs.structure.pages import Page

log = logging.getLogger("mkdocs.hooks.cli_help")

_MARKER = re.compile(r"^<!-- help: (?P<module>[\w.]+)(?P<args>(?: [^ >]+)*) -->[ \t]*$", re.M)
PACKAGES = ("lightning_omni", "lightning_unilab", "lightning_omnilab")
COLUMNS = "100"  # argparse's width: the same output on every terminal

# runs in the child: each command as `python -m module args`, stdout captured
_RUNNER = r"""
import contextlib, io, json, runpy, sys, traceback, warnings
warnings.simplefilter("ignore")
out = {}
for key, (module, args) in json.loads(sys.argv[1]).items():
    buf, code = io.StringIO(), 0
    sys.argv = [module, *args]
    try:
        with contextlib.redirect_stdout(buf):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:
        code, buf = 1, io.StringIO(traceback.format_exc())
    out[key] = {"code": code, "text": buf.getvalue()}
sys.stdout.write(json.dumps(out))
"""

_outputs: dict[str, dict] = {}


def _key(module: str, args: str) -> str:
    return f"{module}{args}"


def _source_hash(root: Path, commands: dict[str, tuple[str, list[str]]]) -> str:
    digest = hashlib.sha256(json.dumps(commands, sort_keys=True).encode())
    digest.update(_RUNNER.encode())
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def on_files(files: Files, config: MkDocsConfig) -> Files:
    root = Path(config.config_file_path).resolve().parent
    commands = {}
    for page in files.documentation_pages():
        for m in _MARKER.finditer(Path(page.abs_src_path).read_text(encoding="utf-8")):
            commands[_key(m["module"], m["args"])] = (m["module"], m["args"].split())
    _outputs.clear()
    if not commands:
        return files
    cache = root / "build" / "docs_cli_help" / f"{_source_hash(root, commands)}.json"
    if cache.exists():
        _outputs.update(json.loads(cache.read_text()))
        return files
    env = {**os.environ, "COLUMNS": COLUMNS, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-c", _RUNNER, json.dumps(commands)], cwd=root,
                          env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        log.warning(f"the --help runner failed ({done.returncode}): {done.stderr[-2000:]}")
        return files
    _outputs.update(json.loads(done.stdout))
    if all(o["code"] == 0 and o["text"].strip() for o in _outputs.values()):
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(_outputs))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    def replace(m: re.Match) -> str:
        key = _key(m["module"], m["args"])
        got = _outputs.get(key)
        if got is None or got["code"] != 0 or not got["text"].strip():
            detail = "not run" if got is None else f"exit {got['code']}: {got['text'][-1500:]}"
            log.warning(f"{page.file.src_uri}: python -m {key} failed ({detail})")
            return ""
        body = "\n".join("    " + line if line else "" for line in
                         ["```text", *got["text"].rstrip().splitlines(), "```"])
        return f'??? example "Output of `python -m {key}`"\n\n{body}\n'

    return _MARKER.sub(replace, markdown)
