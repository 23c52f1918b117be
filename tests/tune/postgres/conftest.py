"""The ``postgres`` tier: `pflx tune --storage postgresql://...` against a real PostgreSQL server.

Not in the default tier: its tests are deselected unless the ``-m`` expression names ``postgres``
(``make test-postgres``, which .ci/run runs after ``make test``). The server is the one ``PFLX_TEST_POSTGRES``
names (a superuser URL without a database, ``postgresql://USER@HOST:PORT``: ``make test-postgres`` starts one with
``tests/tune/postgres/server.py`` and stops it after the tier), or else one this session starts and stops itself.
Each test gets a fresh, empty database on it.
"""

from __future__ import annotations

import os
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import server  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if "postgres" in (config.option.markexpr or ""):
        return
    dropped = [item for item in items if item.get_closest_marker("postgres")]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if not item.get_closest_marker("postgres")]


@pytest.fixture(scope="session")
def pg_server():
    """The server's superuser URL (no database)."""
    given = os.environ.get("PFLX_TEST_POSTGRES")
    if given:
        yield given.rstrip("/")
        return
    home = Path(tempfile.mkdtemp(prefix="pflx-pg-"))
    home.chmod(0o755)  # the server runs as the postgres user when the tests run as root
    url = server.start(home / "server")
    try:
        yield url
    finally:
        server.stop(home / "server")
        home.rmdir()


@pytest.fixture
def database(pg_server):
    """A fresh, empty database: its URL as pflx's docs write it (``postgresql://USER@HOST:PORT/DB``)."""
    return server.create_database(pg_server, f"pflx_{uuid.uuid4().hex[:12]}")
