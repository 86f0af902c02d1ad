"""Griffe extension: document a re-exported object once, where users import it from.

``lightning_unilab`` re-exports ``BatchEnvPool`` from ``lightning_unilab.envs.pool``; rendered
as it is, the API reference would show the class twice (at the package, and again in its
module). For every package named in ``faces``, each name of its ``__all__`` that comes from one
of its own submodules is documented at the package only: the alias is marked public and the
object in its defining module private, so the ``filters: public`` of mkdocstrings skips it
there. A package's ``__main__`` (its command, documented with its ``--help`` on the Commands
page) is left out too. Everything else keeps griffe's rules (``__all__``, underscores, imports
are private).
"""

from __future__ import annotations

from typing import Any

import griffe


class Faces(griffe.Extension):
    def __init__(self, faces: list[str]) -> None:
        super().__init__()
        self.faces = list(faces)

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        _hide_main(pkg)
        for path in self.faces:
            if path.split(".")[0] != pkg.name:
                continue
            face = pkg if path == pkg.path else pkg[path[len(pkg.name) + 1:]]
            for name in face.exports or ():
                member = face.members.get(name if isinstance(name, str) else name.name)
                if member is None or not member.is_alias:
                    continue
                try:
                    target = member.final_target
                except griffe.AliasResolutionError:
                    continue
                if target.path.startswith(face.path + "."):
                    member.public = True
                    target.public = False


def _hide_main(module: griffe.Module) -> None:
    for member in module.members.values():
        if not member.is_alias and member.is_module:
            if member.name == "__main__":
                member.public = False
            else:
                _hide_main(member)
