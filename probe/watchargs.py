"""What ``gradwatch.watch()`` accepts, checked at once, before anything attaches: a
``TypeError``/``ValueError`` with a sentence a user can act on. The framework callbacks
check their options here too, when they are built.

Thread: training (the caller of ``watch()`` or of a callback's constructor).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from gradwatch.steplog import log_path_problem

_SCHEMES = ("ws://", "wss://", "http://", "https://")


def unwrap(opt: Any) -> torch.optim.Optimizer | None:
    """The real ``torch.optim.Optimizer`` inside a wrapper (Accelerate, Lightning, and SAM
    and its copies, which step through their ``base_optimizer``), or None."""
    for _ in range(8):
        inner = getattr(opt, "optimizer", None)
        if inner is None:
            inner = getattr(opt, "_optimizer", None)
        if inner is None:
            inner = getattr(opt, "base_optimizer", None)
        if isinstance(opt, torch.optim.Optimizer) and not isinstance(
                inner, torch.optim.Optimizer):
            return opt
        if inner is None or inner is opt:
            return None
        opt = inner
    return None


def validate_options(log_: Any, server: Any, run_name: Any, norms_every: Any) -> None:
    """Check ``watch()``'s ``log``, ``server``, ``run_name`` and ``norms_every`` (the framework
    callbacks check theirs when built, long before an optimizer exists).

    Raises:
        TypeError, ValueError: an argument is wrong; the message says how to fix it.
    """
    if log_ is not None:
        if not isinstance(log_, (str, os.PathLike)):
            raise TypeError(f"log= must be a file path (str or pathlib.Path); got "
                            f"{type(log_).__name__}.")
        why = log_path_problem(log_, streamed=server is not None)
        if why is not None:
            raise ValueError(f"log={str(log_)!r} {why}.")
        folder = next(p for p in Path(log_).absolute().parents if p.exists())
        if not folder.is_dir():  # missing folders are made; one that is a file cannot be
            raise ValueError(f"log={str(log_)!r} cannot be written: {str(folder)!r} is a "
                             f"file, not a folder.")
    if server is not None and (not isinstance(server, str) or not server.startswith(_SCHEMES)):
        raise ValueError(f"server= must be a URL starting with ws://, wss://, http:// or "
                         f"https://, e.g. 'http://127.0.0.1:8765'; got {server!r}.")
    if server is not None:
        _check_server_urls(server)
    if run_name is not None and (not isinstance(run_name, str) or len(run_name) > 200):
        raise TypeError("run_name= must be a string of at most 200 characters.")
    if isinstance(norms_every, bool) or not isinstance(norms_every, int) or norms_every < 0:
        raise ValueError(f"norms_every= must be an int >= 0 (1 = every step, N = every Nth "
                         f"step, 0 = never); got {norms_every!r}.")


def _check_server_urls(server: str) -> None:
    """A host and port the streamer can use in every URL of ``server``, checked at the call
    rather than failing on the streamer's thread.

    Raises:
        ValueError: a URL without a host or with a port outside 1-65535.
    """
    try:  # websockets: only when streaming
        from gradwatch.stream import ingest_urls
    except ImportError:  # a broken install: the handle says it cannot stream, and logs
        return
    try:
        ingest_urls(server)
    except ValueError as e:
        raise ValueError(f"server=: {e}.") from None


def validate(optimizer_or_list: Any, model: Any, log_: Any, server: Any, run_name: Any,
              norms_every: Any, names_: Any) -> tuple[list[torch.optim.Optimizer],
                                                     list[str | None]]:
    """Check every argument of ``watch()``: the real optimizers (unwrapped, each once) and
    their display names (None where not given).

    Raises:
        TypeError, ValueError: an argument is wrong; the message says how to fix it.
    """
    if optimizer_or_list is None:  # a loop that updates its parameters by hand
        items = []
    else:
        items = (list(optimizer_or_list) if isinstance(optimizer_or_list, (list, tuple))
                 else [optimizer_or_list])
        if not items:
            raise ValueError("gradwatch.watch() got an empty list: pass at least one "
                             "optimizer, e.g. gradwatch.watch([g_opt, d_opt]), or none for "
                             "a loop that updates its parameters by hand: "
                             "gradwatch.watch(model=model).")
    opts: list[torch.optim.Optimizer] = []
    for x in items:
        o = unwrap(x)
        if o is None:
            hint = (" For a loop that updates the module's parameters by hand, pass it as "
                    "model=: gradwatch.watch(model=model)." if isinstance(x, torch.nn.Module)
                    else "")
            raise TypeError(f"gradwatch.watch() needs torch.optim.Optimizer objects (or a "
                            f"list of them); got {type(x).__name__}. Pass the optimizer you "
                            f"call .step() on, e.g. gradwatch.watch(optimizer).{hint}")
        if any(o is p for p in opts):
            raise ValueError(f"gradwatch.watch() got the same {type(o).__name__} twice; "
                             f"pass each optimizer once.")
        opts.append(o)
    if model is not None and not isinstance(model, torch.nn.Module):
        raise TypeError(f"model= must be a torch.nn.Module (used for parameter names); got "
                        f"{type(model).__name__}.")
    validate_options(log_, server, run_name, norms_every)
    labels: list[str | None] = [None] * len(opts)
    if names_ is not None:
        if isinstance(names_, Mapping):
            for k, v in names_.items():
                o = unwrap(k)
                idx = [i for i, p in enumerate(opts) if p is o]
                if not idx:
                    raise ValueError("names= has a key that is not one of the watched "
                                     "optimizers.")
                labels[idx[0]] = str(v)
        elif isinstance(names_, Sequence) and not isinstance(names_, str):
            if len(names_) != len(opts):
                raise ValueError(f"names= has {len(names_)} names for {len(opts)} "
                                 f"optimizers; give one name per optimizer.")
            labels = [str(n) for n in names_]
        else:
            raise TypeError("names= must be a list of names (one per optimizer) or a dict "
                            "{optimizer: name}.")
        if len({x for x in labels if x}) != len([x for x in labels if x]):
            raise ValueError("names= must be unique.")
    return opts, labels
