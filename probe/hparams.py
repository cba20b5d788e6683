"""The hyperparameters of an optimizer's param groups, as ``OptimizerInfo.hparams`` carries
them: read once when the optimizer is announced (attach, ``add_param_group``), on the
training thread, never inside a hook.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

log = logging.getLogger(__name__)

_MAX_KEYS = 32
"""Entries kept per group (an optimizer with a long tail of options keeps its first)."""
_MAX_STR = 200


def _value(v: Any) -> bool | int | float | str | list[float] | None:
    """A group entry as the wire carries it, or raise ValueError when it has no such form
    (a callable, a nested structure)."""
    if v is None or isinstance(v, (bool, int, str)):
        return v[:_MAX_STR] if isinstance(v, str) else v
    if isinstance(v, float):
        return v
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        # A tensor lr (capturable optimizers): read once here, at announce time, not per step.
        return float(v.detach().to("cpu", torch.float64))
    if isinstance(v, (tuple, list)) and len(v) <= 16 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        return [float(x) for x in v]
    raise ValueError(type(v).__name__)


def group_hparams(opt: Any) -> list[dict[str, Any]]:
    """Per param group of ``opt``, its settings (lr, momentum, betas, weight_decay, ...)
    without its parameters; an entry with no plain form is left out. Never raises: an
    optimizer without ``param_groups`` has none."""
    out: list[dict[str, Any]] = []
    try:
        for group in getattr(opt, "param_groups", None) or []:
            kept: dict[str, Any] = {}
            for k, v in group.items():
                if k == "params" or not isinstance(k, str) or len(kept) >= _MAX_KEYS:
                    continue
                try:
                    val = _value(v)
                except ValueError:
                    continue
                if isinstance(val, float) and not math.isfinite(val):
                    continue
                kept[k[:64]] = val
            out.append(kept)
    except Exception as e:  # noqa: BLE001 - a strange optimizer must not stop the probe
        log.warning("gradwatch: could not read the optimizer's param groups (%s)", e)
        return []
    return out
