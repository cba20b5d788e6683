"""Keeping the probe's hooks out of ``torch.compile``: cheaper stand-ins for
``torch.compiler.disable``, each falling back to the public call.

Thread: training (called where hooks and wrappers are installed; the wrappers they make run
in the training thread).

The step pre-hook runs once per optimizer step and the backward wrapper once per backward;
both must stay out of Dynamo's tracing. :func:`no_compile` turns frame evaluation off around
the call, keeps its own frame out of Dynamo, and carries the markers Dynamo's tracer reads
to graph-break instead of inlining the hook. The backward wrapper only takes the last two
(:func:`skip_tracing`): the user's own code that the backward runs may be compiled.
"""

# ``torch.compiler.disable`` does the same with a generic wrapper (a stance lookup, an
# export check and four frame-evaluation switches per call): too much for every step.

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def no_compile(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` wrapped so that TorchDynamo neither traces into it nor compiles under it."""
    try:
        from torch._C._dynamo.eval_frame import set_eval_frame
    except ImportError:  # another torch layout: the public, slower way
        return torch.compiler.disable(fn)

    def call(*args: Any) -> Any:
        prior = set_eval_frame(None)
        try:
            return fn(*args)
        finally:
            set_eval_frame(prior)

    return skip_tracing(call, "gradwatch's optimizer step hook", fn)


def skip_tracing(fn: Callable[..., Any], why: str,
                 orig: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """Mark ``fn`` so that Dynamo never compiles its frame and graph-breaks at a call to it
    instead of inlining it; frames it calls compile as usual. Returns ``fn``."""
    try:
        _skip_code(fn.__code__)
    except ImportError:  # another torch layout: Dynamo traces it like user code
        return fn
    fn._torchdynamo_disable = True  # type: ignore[attr-defined]
    fn._torchdynamo_disable_msg = why  # type: ignore[attr-defined]
    fn._torchdynamo_orig_callable = orig or fn  # type: ignore[attr-defined]
    return fn


def _skip_code(code: Any) -> None:
    """``torch._dynamo.eval_frame.skip_code`` through the C extension it calls: importing
    ``torch._dynamo`` takes longer than the rest of ``gradwatch run``'s start, and a program
    that never compiles never needs it.

    Raises:
        ImportError: neither the C calls nor ``torch._dynamo`` have them (another torch).
    """
    try:
        from torch._C._dynamo.eval_frame import (
            _FrameAction,
            _FrameExecStrategy,
            set_code_exec_strategy,
        )
    except ImportError:
        from torch._dynamo.eval_frame import skip_code

        skip_code(code)
        return
    set_code_exec_strategy(code, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.DEFAULT))
