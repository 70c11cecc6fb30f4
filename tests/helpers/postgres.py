"""A throwaway PostgreSQL server for tests: Debian's binaries, a temporary data folder, a free port.

Why a real server: the job store's PostgreSQL code (SKIP LOCKED claims, LISTEN/NOTIFY, the pool's
recovery after a restart) cannot be checked against anything else. initdb and postgres refuse to
run as root, so under root (CI) they run as Debian's `postgres` user, in a folder that user owns
under /tmp (reachable by it, unlike a pytest tmp_path under /root).
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from tests.helpers.ports import PORT_TRIES, free_port, port_taken

MISSING_REASON = (
    "needs the PostgreSQL server binaries (/usr/lib/postgresql/*/bin/initdb and postgres): "
    "install the Debian package postgresql (bash scripts/install.sh does)"
)


def find_postgres_bin() -> Path | None:
    """The bin folder of the newest PostgreSQL installed the Debian way, else one on PATH, else None."""

    def version(path: str) -> tuple[int, ...]:
        m = re.search(r"/postgresql/([\d.]+)/bin", path)
        return tuple(int(p) for p in m.group(1).split(".")) if m else (0,)

    found = [
        p for p in glob.glob("/usr/lib/postgresql/*/bin") if Path(p, "initdb").exists() and Path(p, "postgres").exists()
    ]
    if found:
        return Path(max(found, key=version))
    initdb = shutil.which("initdb")
    if initdb and Path(initdb).with_name("postgres").exists():
        return Path(initdb).parent
    return None


def missing_reason() -> str | None:
    """Why a PostgreSQL server cannot be started here (a skip reason), or None when it can."""
    if find_postgres_bin() is None:
        return MISSING_REASON
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root, PostgreSQL must run as another user, and there is no 'postgres' user (the Debian package postgresql creates it)"
    return None


class PostgresServer:
    """`with PostgresServer() as pg: pg.url` -- a fresh cluster (user `lipline`, trust auth) on 127.0.0.1.

    `restart()` stops it (fast shutdown: clients are disconnected) and starts it again on the same
    port and data, as a database restart in production would; `stop()` ends it and removes its files.
    """

    user = "lipline"

    def __init__(self, start_timeout: float = 30.0) -> None:
        bindir = find_postgres_bin()
        if bindir is None:
            raise RuntimeError(MISSING_REASON)
        self.bindir = bindir
        self.start_timeout = start_timeout
        self.port = free_port()
        self._served = False  # once it has accepted connections, its port stays (restart)
        self._proc: subprocess.Popen | None = None
        self._run_as: pwd.struct_passwd | None = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        # Under root: /tmp (mode 1777) is reachable by the postgres user; our own folder is handed over.
        self.base = Path(tempfile.mkdtemp(prefix="lipline-pg-", dir="/tmp" if self._run_as else None))
        self.data = self.base / "data"
        self.sockets = self.base / "sockets"
        self.log = self.base / "postgres.log"
        self.sockets.mkdir()
        if self._run_as:
            os.chmod(self.base, 0o755)
            for path in (self.base, self.sockets):
                os.chown(path, self._run_as.pw_uid, self._run_as.pw_gid)

    # -- the URL clients use ------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return self.url_for("postgres")

    def url_for(self, dbname: str) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, name: str) -> str:
        """CREATE DATABASE `name` (an identifier); returns its URL."""
        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url_for(name)

    # -- lifecycle ----------------------------------------------------------------------------------
    def _run(self, args: list[str], **kwargs) -> subprocess.Popen:
        """Start a PostgreSQL program, as the postgres user when we are root (setuid in the child)."""
        if self._run_as:
            kwargs.update(user=self._run_as.pw_uid, group=self._run_as.pw_gid, extra_groups=[])
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
        return subprocess.Popen(args, cwd=self.base, env=env, **kwargs)

    def _initdb(self) -> None:
        with open(self.log, "ab") as log:
            os.chmod(self.log, 0o666)
            proc = self._run(
                [
                    str(self.bindir / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    self.user,
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-sync",
                    "--no-instructions",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            if proc.wait(timeout=120) != 0:
                raise RuntimeError(f"initdb failed ({proc.returncode}):\n{self.log_tail()}")

    def start(self) -> PostgresServer:
        """Start (initdb first if needed) and wait for connections. A first start whose port a parallel
        test took meanwhile tries another; a restart keeps its port (clients hold URLs with it)."""
        if not self.data.exists():
            self._initdb()
        for _ in range(PORT_TRIES):
            log_start = self.log.stat().st_size if self.log.exists() else 0
            self._launch()
            try:
                self._wait_ready()
                break
            except RuntimeError:
                if self._served or not port_taken(self.log_tail_since(log_start)):
                    raise
                self.port = free_port()
        else:
            raise RuntimeError(f"postgres found no free port in {PORT_TRIES} tries:\n{self.log_tail()}")
        self._served = True
        return self

    def _launch(self) -> None:
        log = open(self.log, "ab")
        try:
            self._proc = self._run(
                [
                    str(self.bindir / "postgres"),
                    "-D",
                    str(self.data),
                    "-p",
                    str(self.port),
                    "-k",
                    str(self.sockets),
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    "fsync=off",
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    "full_page_writes=off",
                    "-c",
                    "max_connections=200",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        finally:
            log.close()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"postgres exited with {self._proc.returncode}:\n{self.log_tail()}")
            try:
                with psycopg.connect(self.url, connect_timeout=2) as conn:
                    row = conn.execute("SHOW data_directory").fetchone()
                # Another test's server on a port both probed answers too: ours fails to bind and exits.
                if row is not None and Path(row[0]).resolve() == self.data.resolve():
                    return
            except psycopg.OperationalError:
                pass
            if time.monotonic() > deadline:
                self._terminate()
                raise RuntimeError(f"postgres did not accept connections in {self.start_timeout} s:\n{self.log_tail()}")
            time.sleep(0.05)

    def _terminate(self) -> None:
        """Fast shutdown (SIGINT: roll back, disconnect clients, checkpoint); kill if it lingers."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGQUIT)  # immediate shutdown
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def shut_down(self) -> None:
        """Stop the server (fast shutdown) and keep its data: `start()` brings it back on the same port."""
        self._terminate()

    def restart(self) -> None:
        """Stop (fast) and start again on the same port with the same data."""
        self._terminate()
        self.start()

    def stop(self) -> None:
        """Stop the server and delete its files."""
        self._terminate()
        shutil.rmtree(self.base, ignore_errors=True)

    def log_tail_since(self, offset: int) -> str:
        """The log written after byte `offset` (one start's lines)."""
        try:
            with open(self.log, "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def __enter__(self) -> PostgresServer:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
