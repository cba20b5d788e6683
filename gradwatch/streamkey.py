"""The key that makes a streamed run's (run, rank) stream its probe's alone.

The probe makes a random key for its step log and keeps it beside the log, in
``<log>.key`` (created 0600): the streamer sends it in every ``hello``, and the server lets
only connections that sent it add records to the stream, end it or move it forward
(``server/API.md``). ``gradwatch replay --resume`` reads the same file, which is how a
resume proves it continues that stream; a copied log without its key file cannot resume a
keyed stream (the server answers 4403). The key never enters the log itself: a log is
exported, imported and shared, and the server keeps only a hash. Imports neither torch nor
fastapi.
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from gradwatch.frames import StreamKey

log = logging.getLogger(__name__)

_KEY: TypeAdapter[str] = TypeAdapter(StreamKey)


def new_key() -> str:
    """A fresh random stream key (256 bits)."""
    return secrets.token_urlsafe(32)


def key_file(log_path: str | os.PathLike[str]) -> Path:
    """Where the key of the step log ``log_path`` is kept."""
    p = Path(log_path)
    return p.with_name(p.name + ".key")


def read_key(log_path: str | os.PathLike[str]) -> str | None:
    """The key kept beside a step log, or ``None`` if it has none (or an unreadable one)."""
    try:
        text = key_file(log_path).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    try:
        return _KEY.validate_python(text)
    except ValidationError:
        log.warning("gradwatch: ignoring the malformed stream key in %s", key_file(log_path))
        return None


def own_key(log_path: str | os.PathLike[str]) -> str:
    """The key of a step log the probe writes: the one beside it (a log appended to keeps
    its stream), else a new one written there (0600).

    Raises:
        OSError: the key file cannot be written.
    """
    key = read_key(log_path)
    if key is not None:
        return key
    key = new_key()
    path = key_file(log_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(key + "\n")
    return key
