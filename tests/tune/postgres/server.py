"""A throwaway PostgreSQL server for the ``postgres`` test tier: ``initdb`` into a fresh directory, ``pg_ctl start``
on a free loopback port (and a Unix socket in that directory), trust authentication for its one superuser.

    python tests/tune/postgres/server.py start DIR   # prints the server's URL (postgresql://USER@127.0.0.1:PORT)
    python tests/tune/postgres/server.py stop DIR

The binaries are Debian's (``/usr/lib/postgresql/VERSION/bin``, the ``postgresql`` package; the newest version
there), or ``PFLX_PG_BIN``, or ``initdb`` on PATH. PostgreSQL refuses to run as root: as root the server runs as
the ``postgres`` user the package creates (``runuser``), in a directory that user owns.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
from pathlib import Path


def bindir() -> Path:
    if os.environ.get("PFLX_PG_BIN"):
        return Path(os.environ["PFLX_PG_BIN"])
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    if on_path is None:
        raise RuntimeError("no PostgreSQL server binaries (initdb): apt-get install postgresql, or set PFLX_PG_BIN")
    return Path(on_path).parent


def _as_user() -> tuple[list[str], str]:
    """The prefix that runs a server binary, and the database superuser's name."""
    if os.geteuid() != 0:
        return [], pwd.getpwuid(os.geteuid()).pw_name
    return ["runuser", "-u", "postgres", "--"], "postgres"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(directory: Path) -> str:
    """Start a server whose data lives in ``directory`` (created; must not exist yet); returns its URL."""
    directory = Path(directory)
    directory.mkdir(parents=True)
    prefix, user = _as_user()
    if prefix:
        ids = pwd.getpwnam("postgres")
        os.chown(directory, ids.pw_uid, ids.pw_gid)
        directory.chmod(0o755)
    bins, data, port = bindir(), directory / "data", _free_port()
    subprocess.run([*prefix, str(bins / "initdb"), "-D", str(data), "-U", user, "--auth=trust", "-E", "UTF8",
                    "--no-sync"], check=True, capture_output=True, text=True)
    opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {directory} -c fsync=off"
    subprocess.run([*prefix, str(bins / "pg_ctl"), "-D", str(data), "-l", str(directory / "server.log"), "-o", opts,
                    "-w", "-t", "60", "start"], check=True, capture_output=True, text=True)
    url = f"postgresql://{user}@127.0.0.1:{port}"
    (directory / "url").write_text(url + "\n")
    return url


def stop(directory: Path) -> None:
    prefix, _ = _as_user()
    data = Path(directory) / "data"
    if (data / "postmaster.pid").exists():
        subprocess.run([*prefix, str(bindir() / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                       check=True, capture_output=True, text=True)
    shutil.rmtree(directory, ignore_errors=True)


def create_database(url: str, name: str) -> str:
    """A fresh, empty database ``name`` on the server at ``url``; returns its URL."""
    import psycopg

    with psycopg.connect(url + "/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{url}/{name}"


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("start", "stop"):
        sys.exit("usage: server.py start|stop DIR")
    if sys.argv[1] == "start":
        print(start(Path(sys.argv[2])))
    else:
        stop(Path(sys.argv[2]))
