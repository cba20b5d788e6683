"""The previous release's probe, loaded beside this checkout's in one process, so that the
probe bench can time both in the same interleaved blocks.

Both are the package ``gradwatch``: the previous release is imported from a shadow tree of
its checkout (``gradwatch/`` with ``probe/``, ``server/`` and ``web/`` linked in, as the
installed layout has them), its modules are then moved out of ``sys.modules``, and
:meth:`Previous.active` swaps them back in for the length of a block, so that an import
inside one of its functions finds its own modules. Each release's functions keep the
globals of the modules they were defined in, so outside a block this checkout's code runs.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

_LAYOUT = {"probe": "probe", "server": "server", "web": "web"}
"""Subpackages of ``gradwatch`` kept in folders of their own in a checkout."""


def _ours(name: str) -> bool:
    return name == "gradwatch" or name.startswith("gradwatch.")


class Previous:
    """Another checkout's ``gradwatch``, loaded in this process."""

    def __init__(self, checkout: Path, tmp: Path) -> None:
        if not (checkout / "gradwatch" / "__init__.py").is_file() or not (
                checkout / "probe" / "api.py").is_file():
            raise SystemExit(f"--previous {checkout}: not a gradwatch checkout (no "
                             f"gradwatch/__init__.py and probe/api.py); make one with "
                             f"`git worktree add {checkout} <rev>`")
        root = tmp / "previous"
        pkg = root / "gradwatch"
        pkg.mkdir(parents=True)
        for entry in (checkout / "gradwatch").iterdir():
            (pkg / entry.name).symlink_to(entry.resolve())
        for sub, folder in _LAYOUT.items():
            (pkg / sub).symlink_to((checkout / folder).resolve())
        mine = {k: m for k, m in sys.modules.items() if _ours(k)}
        for k in mine:
            del sys.modules[k]
        sys.path.insert(0, str(root))
        try:
            self.gradwatch: Any = importlib.import_module("gradwatch")
            importlib.import_module("gradwatch.probe.api")
        finally:
            sys.path.remove(str(root))
            self.modules: dict[str, ModuleType] = {
                k: m for k, m in sys.modules.items() if _ours(k)}
            for k in self.modules:
                del sys.modules[k]
            sys.modules.update(mine)
        self.where = str(Path(self.gradwatch.__file__).resolve().parent)

    @contextmanager
    def active(self) -> Iterator[Any]:
        """Its modules in ``sys.modules`` meanwhile; yields its ``gradwatch``."""
        mine = {k: m for k, m in sys.modules.items() if _ours(k)}
        for k in mine:
            del sys.modules[k]
        sys.modules.update(self.modules)
        try:
            yield self.gradwatch
        finally:
            for k in [k for k in sys.modules if _ours(k)]:
                self.modules[k] = sys.modules.pop(k)  # any it imported meanwhile
            sys.modules.update(mine)
