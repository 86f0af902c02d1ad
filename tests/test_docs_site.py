"""The documentation site: ``mkdocs build --strict`` passes (every link, anchor, docstring and
command's --help checked), the API reference renders every public class and function, and the
site's hooks catch what they are there to catch."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

for _module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
    pytest.importorskip(_module, reason="the docs extra is not installed: pip install -e '.[docs]'")

import griffe  # noqa: E402  (installed with mkdocstrings)

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("lightning_omni", "lightning_unilab", "lightning_omnilab")


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(config), "--site-dir", str(site)], cwd=config.parent,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def _problems(done: subprocess.CompletedProcess) -> str:
    return "\n".join(line for line in (done.stdout + done.stderr).splitlines()
                     if "WARNING" in line or "ERROR" in line or "Error" in line)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = _build(ROOT / "mkdocs.yml", out)
    assert done.returncode == 0, _problems(done) or done.stderr[-4000:]
    return out


def test_the_site_builds_strict(site: Path) -> None:
    pages = list(site.rglob("index.html"))
    assert len(pages) > 20
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert cli.count("usage:") >= 10, "every command's --help is on the page"


def _rendered_ids(site: Path) -> set[str]:
    heading = re.compile(r'<h[1-6] id="([\w.]+)" class="doc doc-heading')
    return {m for page in (site / "reference").rglob("index.html")
            for m in heading.findall(page.read_text())}


def _public_modules(module: griffe.Module):
    yield module
    for member in module.members.values():
        if not member.is_alias and member.is_module and not member.name.startswith("_"):
            yield from _public_modules(member)


def test_every_public_class_and_function_is_documented(site: Path) -> None:
    loader = griffe.GriffeLoader(search_paths=[str(ROOT)], allow_inspection=False)
    packages = [loader.load(name) for name in PACKAGES]
    loader.resolve_aliases(implicit=False, external=False)
    rendered = set()
    for path in _rendered_ids(site):
        try:
            obj = loader.modules_collection[path]
            rendered.add(obj.final_target.path if obj.is_alias else obj.path)
        except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            rendered.add(path)
    missing = [member.path for package in packages for module in _public_modules(package)
               for member in module.members.values()
               if not member.is_alias and (member.is_class or member.is_function)
               and member.is_public and not member.name.startswith("_")
               and member.path not in rendered]
    missing += [module.path for package in packages for module in _public_modules(package)
                if module.path not in rendered]
    assert not missing, f"not in the API reference (add them to a docs/reference page): {missing}"


def _tiny_project(tmp_path: Path, page: str) -> Path:
    """A repository with the site's hooks, one page and a recipe outside docs/."""
    hooks = ROOT / "docs" / "_hooks"
    (tmp_path / "docs").mkdir()
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "walk.yaml").write_text("seed_everything: 0\n")
    (tmp_path / "docs" / "index.md").write_text(textwrap.dedent(page))
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n## A section\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text(textwrap.dedent(f"""\
        site_name: t
        hooks: [{hooks / 'repo_links.py'}, {hooks / 'cli_help.py'}]
        not_in_nav: /repo/
        markdown_extensions: [pymdownx.details, pymdownx.superfences]
        validation: {{omitted_files: warn, absolute_links: warn, unrecognized_links: warn,
                     anchors: warn}}
        """))
    return config


def test_links_outside_docs_are_served_and_checked(tmp_path: Path) -> None:
    config = _tiny_project(tmp_path, """\
        # Home

        [the recipe](../recipes/walk.yaml), [a section](other.md#a-section),
        `[in code](../nowhere.yaml)`
        """)
    done = _build(config, tmp_path / "site")
    assert done.returncode == 0, _problems(done)
    home = (tmp_path / "site" / "index.html").read_text()
    assert 'href="repo/recipes/walk.yaml"' in home
    assert (tmp_path / "site" / "repo" / "recipes" / "walk.yaml").is_file()


BROKEN = {  # link -> what the build says about it
    "../recipes/run.yaml": "no file recipes/run.yaml in the repository",
    "../recipes/": "is a directory",
    "other.md#no-such-section": "does not contain an anchor '#no-such-section'",
    "missing.md": "not found among documentation files",
}


def test_a_broken_link_or_command_fails_the_build(tmp_path: Path) -> None:
    links = "\n".join(f"[broken]({link})" for link in BROKEN)
    page = f"# Home\n\n{links}\n\n<!-- help: lightning_omnilab.no_such_module --help -->\n"
    done = _build(_tiny_project(tmp_path, page), tmp_path / "site")
    assert done.returncode != 0
    problems = _problems(done)
    for link, says in BROKEN.items():
        assert any(link in line and says in line for line in problems.splitlines()), \
            (link, problems)
    assert "python -m lightning_omnilab.no_such_module --help failed" in problems
