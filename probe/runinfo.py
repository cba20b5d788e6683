"""Who a run is and where it writes: run id, rank, world size, step log and spool paths.

Thread: training (read once, when a watch session starts).
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import sys
import time
import uuid
from pathlib import Path

from gradwatch import __version__
from gradwatch.wire import RUN_ID_CHARS, Header, bounded_argv

_BAD = re.compile(f"[^{RUN_ID_CHARS}]+")


def run_id(explicit: str | None = None) -> str:
    """``run_id=``, else ``GRADWATCH_RUN_ID``, else torchrun's job (:func:`torchrun_id`),
    else random.

    The id is shared by every rank of a job; it is cleaned to the wire's character set.
    """
    raw = (explicit or os.environ.get("GRADWATCH_RUN_ID") or torchrun_id()
           or uuid.uuid4().hex[:16])
    clean = _BAD.sub("-", raw).strip("-")[:64]
    return clean if clean not in ("", ".", "..") else uuid.uuid4().hex[:16]


def torchrun_id() -> str | None:
    """The run id of the torchrun job this process is a worker of, or None outside one.

    ``TORCHELASTIC_RUN_ID`` is the job's ``--rdzv-id``, but torchrun sets it to ``none``
    when none is given: every such job would share one id. Then the id comes from what the
    local agent gives all its workers and no other job: the folder it made for the job's
    error files, else its process id and master address. Ranks on other machines get
    other ids that way: multi-machine jobs pass ``--rdzv-id`` (or ``GRADWATCH_RUN_ID``).
    """
    rid = os.environ.get("TORCHELASTIC_RUN_ID")
    if not rid:
        return None
    if rid.lower() != "none":
        return rid
    # <root>/<run id>_<random>/attempt_<n>/<local rank>/error.json
    err = Path(os.environ.get("TORCHELASTIC_ERROR_FILE") or "")
    job = err.parents[2].name if len(err.parents) > 3 else ""
    key = job or "|".join((socket.gethostname(), str(os.getppid()),
                           os.environ.get("MASTER_ADDR", ""),
                           os.environ.get("MASTER_PORT", "")))
    return "torchrun-" + hashlib.sha256(key.encode()).hexdigest()[:12]


def header(run: str, run_name: str | None, rank: int, world: int, norms_every: int,
           worker: int | None = None) -> Header:
    """The header of this process's step log, made now."""
    now = time.time()
    torch = sys.modules.get("torch")
    if torch is not None:
        version = str(torch.__version__)
    else:  # a process that never imported torch does not start now
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as dist_version

        try:
            version = dist_version("torch")
        except PackageNotFoundError:
            version = ""
    return Header(seq=0, t=now, run=run, run_name=(run_name or run)[:200], rank=rank,
                  world_size=world, torch_version=version[:64], gradwatch_version=__version__,
                  started=now, host=socket.gethostname()[:255], pid=os.getpid(),
                  argv=bounded_argv(sys.argv), norms_every=norms_every,
                  worker=worker)


def rank_world() -> tuple[int, int]:
    """``(rank, world_size)`` from torch.distributed when initialised, else the env."""
    # Only if the script imported it: a process without torch must not load it here.
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
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


def worker_log_path(path: str | os.PathLike[str], worker: int) -> Path:
    """The step log of worker process ``worker`` of the process writing ``path``:
    ``<stem>.worker<N><suffix>``."""
    p = Path(path)
    return p.with_name(f"{p.stem}.worker{worker}{p.suffix}")


def spool_path(run: str, rank: int) -> Path:
    """Where a streamed run's step log (its spool) goes when no ``log`` is given."""
    base = os.environ.get("GRADWATCH_SPOOL_DIR")
    root = Path(base) if base else Path.home() / ".cache" / "gradwatch" / "spool"
    return root / f"{run}-rank{rank}.jsonl"
