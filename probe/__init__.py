"""The probe: runs inside the training process, judges every optimizer step, writes records.

``watch()`` attaches to given optimizers; ``gradwatch run`` (:mod:`.runner`) attaches to every
optimizer a script creates. See :mod:`gradwatch.probe.tracker` for how it stays cheap.

Names are loaded on first use, so torch-free submodules (:mod:`.stream`, used by
``gradwatch replay``) import without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gradwatch.probe.api import WatchHandle as WatchHandle
    from gradwatch.probe.api import watch as watch

__all__ = ["WatchHandle", "watch"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from gradwatch.probe import api

        return getattr(api, name)
    raise AttributeError(f"module 'gradwatch.probe' has no attribute {name!r}")
