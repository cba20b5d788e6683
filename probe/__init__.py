"""The probe: runs inside the training process, judges every optimizer step, writes records.

Thread: training (importing it loads nothing; :mod:`.api` is loaded on first use).

``watch()`` attaches to given optimizers; ``gradwatch run`` (:mod:`.runner`) attaches to every
optimizer a script creates. Per optimizer step: the tracker (:mod:`.tracker`) routes torch's
events to one ledger per optimizer (:mod:`.ledger`), which counts the step and hands its facts
(:mod:`.facts`) to the writer thread (:mod:`.writer`), which builds the step record
(:mod:`.records`) and writes it.

Names are loaded on first use, so ``import gradwatch`` stays torch-free until ``watch`` is
used.
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
