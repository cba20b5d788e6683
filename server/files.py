"""The data directory is its owner's alone: the directory 0700, its files 0600.

Runs hold file paths, host names and command lines of training jobs. The directory is
made (or tightened) before the database opens, the database file is created 0600 before
SQLite opens it (SQLite gives its -wal and -shm files the database file's mode), and files
an older gradwatch left readable are tightened at start. Plain module: no FastAPI.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from gradwatch.server.db import DB_NAME

log = logging.getLogger(__name__)


def private_dir(path: Path) -> None:
    """Create ``path`` (0700), or tighten it to 0700 if it is ours; then
    :func:`private_files`.

    Raises:
        OSError: it cannot be created.
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    _tighten(path, 0o700)
    db = path / DB_NAME
    if not db.exists():  # an empty file is an empty SQLite database
        os.close(os.open(db, os.O_WRONLY | os.O_CREAT, 0o600))
    private_files(path)


def private_files(path: Path) -> None:
    """Tighten every regular file directly in ``path`` that we own to 0600."""
    try:
        entries = list(os.scandir(path))
    except OSError:
        return
    for e in entries:
        if e.is_file(follow_symlinks=False):
            _tighten(Path(e.path), 0o600)


def _tighten(p: Path, mode: int) -> None:
    if not hasattr(os, "getuid"):  # pragma: no cover - Windows: no POSIX modes
        return
    try:
        st = p.lstat()
        if st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & ~mode:
            p.chmod(stat.S_IMODE(st.st_mode) & mode)
    except OSError as e:  # a read-only mount, a file owned by another user: say so, go on
        log.warning("could not make %s private to its owner: %s", p, e.strerror or e)
