"""A throwaway PostgreSQL cluster for tests and benches: initdb, pg_ctl, a free port.

Debian's ``postgresql`` package (scripts/test.sh installs it) puts the server in
``/usr/lib/postgresql/<version>/bin``. The cluster lives in a temporary directory owned by
the ``postgres`` user (the server refuses to run as root; the tests run as root, so the
commands run through ``runuser``), listens on 127.0.0.1 only, trusts local connections,
and skips fsync (it is thrown away) unless made ``durable`` (benches). Each test gets a
database of its own
(:meth:`Cluster.new_database`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

PG_ROOT = Path("/usr/lib/postgresql")


def pg_bin() -> Path | None:
    """The newest installed PostgreSQL's bin directory, or None."""
    if not PG_ROOT.is_dir():
        return None
    found = sorted((p for p in PG_ROOT.iterdir() if (p / "bin" / "initdb").exists()),
                   key=lambda p: int(p.name) if p.name.isdigit() else 0)
    return found[-1] / "bin" if found else None


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """A PostgreSQL cluster started in a temporary directory; :meth:`stop` removes it.

    Args:
        durable: keep PostgreSQL's own crash safety (``fsync``, full page writes) and
            commit as the SQLite server does (WAL, ``synchronous=NORMAL``): without
            waiting for the WAL's flush (``synchronous_commit=off``: a crash may lose
            the last commits, never the database). For benches set beside SQLite; by
            default (tests) nothing is flushed, as nothing is kept.
    Raises:
        RuntimeError: PostgreSQL is not installed, or the cluster did not start.
    """

    def __init__(self, durable: bool = False) -> None:
        bin_dir = pg_bin()
        if bin_dir is None:
            raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql)")
        self.bin = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="gradwatch-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self._as: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self._names = itertools.count()
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                  "--locale=C", "-E", "UTF8", "--no-sync")
        opts = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} "
                f"-c synchronous_commit=off -c max_connections=200")
        if not durable:
            opts += " -c fsync=off -c full_page_writes=off"
        try:
            self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-o",
                      opts, "-w", "-t", "60", "start")
        except RuntimeError:
            log = self.root / "log"
            why = log.read_text()[-2000:] if log.exists() else ""
            self.stop()
            raise RuntimeError(f"PostgreSQL did not start: {why}") from None

    def _run(self, tool: str, *args: str) -> None:
        r = subprocess.run([*self._as, str(self.bin / tool), *args], capture_output=True,
                           text=True, cwd=self.root, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"{tool} failed: {r.stderr.strip() or r.stdout.strip()}")

    def restart(self) -> None:
        """Restart the server (its clients' connections break)."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-m", "fast",
                  "-w", "-t", "60", "restart")

    def url(self, database: str = "postgres") -> str:
        """A URL of one of the cluster's databases."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """Create an empty database; its URL."""
        import psycopg

        name = f"t{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.url(), autocommit=True) as c:
            c.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        """Stop the server (immediately: nothing in it is kept) and remove its files."""
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
