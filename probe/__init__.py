"""The probe: runs inside the training process, judges every optimizer step, writes records.

Thread: training (:mod:`.api` is loaded on first use).

``watch()`` attaches to given optimizers; ``gradwatch run`` (:mod:`.runner`) attaches to every
optimizer a script creates. Per optimizer step: the tracker (:mod:`.tracker`) routes torch's
events to one ledger per optimizer (:mod:`.ledger`), which counts the step and hands its facts
(:mod:`.facts`) to the writer thread (:mod:`.writer`), which builds the step record
(:mod:`.records`) and writes it.

Every module here runs on torch: without it, importing any of them raises
:class:`gradwatch.extras.TorchMissingError`, one sentence that says to install torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gradwatch.extras import require_torch

require_torch()

if TYPE_CHECKING:
    from gradwatch.probe.api import WatchHandle as WatchHandle
    from gradwatch.probe.api import watch as watch

__all__ = ["WatchHandle", "watch"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from gradwatch.probe import api

        return getattr(api, name)
    raise AttributeError(f"module 'gradwatch.probe' has no attribute {name!r}")
