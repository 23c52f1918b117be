"""Where a study lives: Optuna's RDB storage (``sqlite:///PATH``, ``postgresql://USER@HOST/DB``), opened so that
several ``pflx tune`` processes, on one machine or several, can share one study.

Two things Optuna's RDBStorage does not guard when processes start at the same moment on a fresh database:

- its schema creation: every process runs SQLAlchemy's ``metadata.create_all`` (check, then ``CREATE TYPE`` /
  ``CREATE TABLE``), then inserts the one ``version_info`` row and stamps Alembic's revision; two processes that
  check before either creates fail one of them (PostgreSQL: ``type "studydirection" already exists``);
- pflx's study identity (:func:`pfl_cli.tune.study.open_study`): the first process creates the study and stores
  its identity one user attribute at a time; a second process that reads the study in between finds a partial
  identity and refuses it as another search.

On PostgreSQL both run under one advisory lock (``pg_advisory_lock``, a lock the server releases when the session
ends, so a killed process never leaves it held): the processes create the schema and open the study one at a time,
and only there; the trials run in parallel. SQLite's own file lock serializes writers on one machine.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
from typing import Iterator

from pfl_cli.errors import InputError

# The advisory lock's key: one 64-bit integer that pflx alone uses on a server (its own name, hashed).
LOCK_KEY = int.from_bytes(hashlib.sha256(b"pflx tune: schema and study creation").digest()[:8], "big", signed=True)
DRIVERS = ("psycopg", "psycopg2")  # PostgreSQL's DBAPI modules that SQLAlchemy 2 loads, in pflx's order


def storage_url(url: str) -> str:
    """``url`` with the PostgreSQL driver made explicit where it names none: ``postgresql://`` is psycopg (v3,
    the ``postgres`` extra) when it is installed, else psycopg2 when that is; SQLAlchemy's own default for a bare
    ``postgresql://`` differs between its versions (2.0: psycopg2, 2.1: psycopg)."""
    scheme, sep, rest = url.partition("://")
    if scheme != "postgresql" or not sep:
        return url
    for driver in DRIVERS:
        if importlib.util.find_spec(driver) is not None:
            return f"postgresql+{driver}://{rest}"
    return url


def _shown(url: str) -> str:
    return url.split("@")[-1] if "@" in url else url  # never echo a password


def open_storage(url: str):
    """An Optuna RDB storage at ``url``, its schema created under the lock; InputError if it cannot open."""
    import optuna

    resolved = storage_url(url)
    try:
        if resolved.startswith("sqlite"):
            return optuna.storages.RDBStorage(resolved, engine_kwargs={"connect_args": {"timeout": 120}})
        with _advisory_lock(_lock_engine(resolved)):
            return optuna.storages.RDBStorage(resolved)
    except Exception as err:  # noqa: BLE001 - a driver missing, a host down, a bad URL: all one answer
        reason = " ".join(str(err).split())[:200]
        raise InputError(f"--storage {_shown(url)}: cannot open the study storage ({type(err).__name__}: {reason}); "
                         "give a URL Optuna can open (sqlite:///PATH, or postgresql://USER@HOST/DB with its driver "
                         "installed: pip install \"pflx[postgres]\").") from None


@contextlib.contextmanager
def exclusive(storage) -> Iterator[None]:
    """While the block runs, no other pflx process opens a study in ``storage``'s database (PostgreSQL; elsewhere
    a no-op)."""
    engine = getattr(storage, "engine", None)
    if engine is None or engine.dialect.name != "postgresql":
        yield
        return
    with _advisory_lock(engine):
        yield


def _lock_engine(url: str):
    """An engine for the lock alone, before Optuna's storage (and its engine) exists; None where none is needed."""
    import sqlalchemy

    if not url.startswith("postgresql"):
        return None
    return sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)


@contextlib.contextmanager
def _advisory_lock(engine) -> Iterator[None]:
    if engine is None:
        yield
        return
    import sqlalchemy

    with engine.connect() as conn:
        conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:key)"), {"key": LOCK_KEY})
        try:
            yield
        finally:
            conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:key)"), {"key": LOCK_KEY})
            conn.rollback()
