"""The key that makes a streamed run's (run, rank) stream its probe's alone.

The probe makes a random key for its step log and keeps it beside the log, in
``<log>.key`` (created 0600): the streamer sends it in every ``hello``, and the server lets
only connections that sent it add records to the stream, end it or move it forward
(``server/API.md``). ``gradwatch replay --resume`` reads the same file, which is how a
resume proves it continues that stream; a copied log without its key file cannot resume a
keyed stream (the server answers 4403). The key never enters the log itself: a log is
exported, imported and shared, and the server keeps only a hash. Imports neither torch nor
fastapi.

A key file is trusted only when it is the current user's own: a regular file (never
followed through a symlink), owned by the current user, with no group or other bits.
Another user who could plant one beside a log (a shared directory) would otherwise own the
stream, and could end it; one who planted a symlink would have the key written where they
chose. New key files are created with ``O_EXCL | O_NOFOLLOW``, mode 0600.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
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


class UnsafeKeyFile(Exception):
    """A key file that is not the current user's own private regular file: the message
    names the file and says why."""


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _read_own(path: Path) -> str | None:
    """The text of ``path`` if it exists; ``None`` if it does not.

    Raises:
        UnsafeKeyFile: it is a symlink, not a regular file, another user's, or readable or
            writable by group or others.
        OSError: it cannot be read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        if path.is_symlink():  # a dangling link: creating the key would follow it
            raise UnsafeKeyFile(f"{path} is a symlink") from None
        return None
    except OSError as e:
        if path.is_symlink():
            raise UnsafeKeyFile(f"{path} is a symlink") from None
        raise e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeKeyFile(f"{path} is not a regular file")
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise UnsafeKeyFile(f"{path} belongs to another user (uid {st.st_uid})")
        if st.st_mode & 0o077:
            raise UnsafeKeyFile(f"{path} is open to other users (mode "
                                f"{stat.S_IMODE(st.st_mode):04o}; a key file is 0600)")
        data = os.read(fd, 1024)
    finally:
        os.close(fd)
    try:
        return data.decode("ascii").strip()
    except UnicodeDecodeError:
        return ""


def read_key(log_path: str | os.PathLike[str]) -> str | None:
    """The key kept beside a step log, or ``None`` if it has none (or an unreadable one).

    Raises:
        UnsafeKeyFile: the key file is there but not the current user's own private file.
    """
    path = key_file(log_path)
    try:
        text = _read_own(path)
    except OSError:
        return None
    if text is None:
        return None
    try:
        return _KEY.validate_python(text)
    except ValidationError:
        log.warning("gradwatch: ignoring the malformed stream key in %s", path)
        return None


def own_key(log_path: str | os.PathLike[str]) -> str:
    """The key of a step log the probe writes: the one beside it (a log appended to keeps
    its stream), else a new one written there (0600; a malformed one of our own is
    replaced).

    Raises:
        UnsafeKeyFile: a key file is there that is not the current user's own private
            regular file (nothing is written to it, nothing should be streamed with it).
        OSError: the key file cannot be written.
    """
    key = read_key(log_path)
    if key is not None:
        return key
    key = new_key()
    path = key_file(log_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:  # a malformed key of our own (checked above), or a race
        if _read_own(path) is not None:
            path.unlink()
        fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(key + "\n")
    return key
