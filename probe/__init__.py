"""The probe: runs inside the training process, judges every optimizer step, writes records.

``watch()`` attaches to given optimizers; ``gradwatch run`` (:mod:`.runner`) attaches to every
optimizer a script creates. See :mod:`gradwatch.probe.tracker` for how it stays cheap.
"""

from __future__ import annotations

from gradwatch.probe.api import WatchHandle, watch

__all__ = ["WatchHandle", "watch"]
