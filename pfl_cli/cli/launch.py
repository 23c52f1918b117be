"""`pflx train --nproc N`: start N ranks of the same command on this machine, as torchrun would.

Each rank is ``python -m pfl_cli <the same arguments without --nproc>`` with the environment
torchrun sets (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT`` on a free local port). When a rank fails the others are stopped (they would
wait for it in a collective), and the exit status is the failing rank's.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

# The arguments of the running invocation, set by ``pfl_cli.cli.app.main`` (``pflx train --nproc N`` relaunches
# them once per rank); here, not in app.py, so that train.py never imports the app that imports it.
INVOCATION: list[str] = []


def without_nproc(args: list[str]) -> list[str]:
    """``args`` with ``--nproc N`` / ``--nproc=N`` removed."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            out.append(a)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(args: list[str], nproc: int) -> int:
    """Run ``pflx <args>`` as ``nproc`` ranks; return the first failing rank's exit code, else 0."""
    port = str(_free_port())
    procs = []
    # A SIGTERM to the launcher must stop the ranks too (the default handler would orphan them).
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    for rank in range(nproc):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc),
               "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        procs.append(subprocess.Popen([sys.executable, "-m", "pfl_cli", *args], env=env))
    code = 0
    try:
        while any(p.poll() is None for p in procs):
            failed = [p for p in procs if p.returncode not in (None, 0)]
            if failed:
                code = failed[0].returncode
                break
            time.sleep(0.05)
        else:
            code = next((p.returncode for p in procs if p.returncode != 0), 0)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            p.wait()
        signal.signal(signal.SIGTERM, previous)
    return code


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)
