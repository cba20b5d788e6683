"""Who a run is and where it writes: run id, rank, world size, step log and spool paths.

Thread: training (read once, when a watch session starts).
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

from gradwatch.wire import RUN_ID_CHARS

_BAD = re.compile(f"[^{RUN_ID_CHARS}]+")


def run_id(explicit: str | None = None) -> str:
    """``run_id=``, else ``GRADWATCH_RUN_ID``, else ``TORCHELASTIC_RUN_ID``, else random.

    The id is shared by every rank of a job; it is cleaned to the wire's character set.
    """
    raw = (explicit or os.environ.get("GRADWATCH_RUN_ID")
           or os.environ.get("TORCHELASTIC_RUN_ID") or uuid.uuid4().hex[:16])
    clean = _BAD.sub("-", raw).strip("-")[:64]
    return clean or uuid.uuid4().hex[:16]


def rank_world() -> tuple[int, int]:
    """``(rank, world_size)`` from torch.distributed when initialised, else the env."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:  # noqa: BLE001 - a broken backend must not stop training
        pass

    def _int(name: str, default: int) -> int:
        try:
            return int(os.environ.get(name, default))
        except ValueError:
            return default

    return max(_int("RANK", 0), 0), max(_int("WORLD_SIZE", 1), 1)


def log_path(path: str | os.PathLike[str], rank: int, world: int) -> Path:
    """The step log path of this rank: ``<stem>.rank<R><suffix>`` when world_size > 1."""
    p = Path(path)
    if world > 1:
        p = p.with_name(f"{p.stem}.rank{rank}{p.suffix}")
    return p


def spool_path(run: str, rank: int) -> Path:
    """Where a streamed run's step log (its spool) goes when no ``log`` is given."""
    base = os.environ.get("GRADWATCH_SPOOL_DIR")
    root = Path(base) if base else Path.home() / ".cache" / "gradwatch" / "spool"
    return root / f"{run}-rank{rank}.jsonl"
