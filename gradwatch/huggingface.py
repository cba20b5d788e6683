"""``gradwatch.huggingface.GradwatchCallback``: the public name of the Hugging Face callback.

::

    from gradwatch.huggingface import GradwatchCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[GradwatchCallback(log="run.jsonl")])

It lives in :mod:`gradwatch.integrations.huggingface` (the layer above the probe); this
module only re-exports it, so the documented import path stays. Without ``transformers``,
importing it raises :class:`gradwatch.extras.MissingPackageError` (an ``ImportError``).
"""

from __future__ import annotations

from gradwatch.integrations.huggingface import GradwatchCallback

__all__ = ["GradwatchCallback"]
