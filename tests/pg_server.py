"""A real, throwaway PostgreSQL server for the tests: a cluster made with ``initdb`` in a temp
folder, started with ``pg_ctl`` on a free local port (and a Unix socket in the same folder),
stopped and deleted afterwards. As root the cluster belongs to the ``postgres`` user (the
server refuses to run as root), through ``runuser`` or ``su``.

:func:`start` returns a :class:`Server` or raises :class:`Unavailable` with the reason (no
PostgreSQL binaries: ``apt-get install postgresql``; no driver: ``pip install
"traceview[postgres]"``; the server would not start), which the fixture turns into a skip.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


class Unavailable(Exception):
    """PostgreSQL cannot be started here; the message says why."""


@dataclass
class Server:
    url: str  #: postgresql+psycopg://USER@127.0.0.1:PORT/postgres
    root: Path
    bin_dir: Path
    as_user: list[str]

    def stop(self) -> None:
        subprocess.run([*self.as_user, str(self.bin_dir / "pg_ctl"), "-D",
                        str(self.root / "data"), "-m", "immediate", "-w", "stop"],
                       capture_output=True, timeout=60)
        shutil.rmtree(self.root, ignore_errors=True)

    def create_database(self, name: str) -> str:
        """A fresh database on this server; its URL."""
        import psycopg

        with psycopg.connect(self.url.replace("+psycopg", ""), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url.rsplit("/", 1)[0] + f"/{name}"


def bin_dir() -> Path | None:
    """Where ``initdb`` and ``pg_ctl`` are: PATH, else Debian's /usr/lib/postgresql/N/bin
    (newest first)."""
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return Path(os.path.realpath(on_path)).parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                   key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start() -> Server:
    if importlib.util.find_spec("psycopg") is None:
        raise Unavailable('no PostgreSQL driver: pip install "traceview[postgres]"')
    where = bin_dir()
    if where is None:
        raise Unavailable("no PostgreSQL server binaries (initdb, pg_ctl): "
                          "apt-get install postgresql")
    root = Path(tempfile.mkdtemp(prefix="traceview-pg-"))
    as_user: list[str] = []
    user = pwd.getpwuid(os.getuid()).pw_name
    if os.getuid() == 0:  # the server will not run as root
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(root, ignore_errors=True)
            raise Unavailable("running as root and there is no 'postgres' user") from None
        os.chown(root, pw.pw_uid, pw.pw_gid)
        runuser = shutil.which("runuser")
        as_user = [runuser, "-u", "postgres", "--"] if runuser else None  # type: ignore
        if as_user is None:
            as_user = ["su", "postgres", "-s", "/bin/sh", "-c"]
        user = "postgres"
    port = _free_port()
    data = root / "data"

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        cmd = list(argv)
        if as_user and as_user[0] == "su":  # su takes one command line
            cmd = [*as_user, " ".join(f"'{a}'" for a in argv)]
        elif as_user:
            cmd = [*as_user, *argv]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    steps = [
        (str(where / "initdb"), "-D", str(data), "-U", user, "--auth=trust", "-E", "UTF8",
         "--no-locale", "--no-sync"),
        (str(where / "pg_ctl"), "-D", str(data), "-l", str(root / "log"), "-w", "-t", "60",
         "-o", f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off", "start"),
    ]
    for argv in steps:
        done = run(*argv)
        if done.returncode != 0:
            log = (root / "log").read_text() if (root / "log").exists() else ""
            shutil.rmtree(root, ignore_errors=True)
            raise Unavailable(f"{Path(argv[0]).name} failed: "
                              f"{(done.stderr or done.stdout or log).strip()[-400:]}")
    return Server(f"postgresql+psycopg://{user}@127.0.0.1:{port}/postgres", root, where,
                  as_user)
