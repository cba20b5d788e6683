"""``gradwatch.lightning.GradwatchCallback``: the public name of the Lightning callback.

::

    from gradwatch.lightning import GradwatchCallback
    trainer = Trainer(callbacks=[GradwatchCallback(log="run.jsonl")])

It lives in :mod:`gradwatch.integrations.lightning` (the layer above the probe); this
module only re-exports it, so the documented import path stays. Without Lightning, importing
it raises :class:`gradwatch.extras.MissingPackageError` (an ``ImportError``).
"""

from __future__ import annotations

from gradwatch.integrations.lightning import GradwatchCallback

__all__ = ["GradwatchCallback"]
