"""The database engine: PostgreSQL by URL, or SQLite tuned so that readers never wait and two
writers never deadlock."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event


def normalise_url(url: str) -> str:
    """Accept plain `postgresql://` URLs and use the psycopg 3 driver for them."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url.removeprefix(prefix)
    return url


WRITER = "klique_writer"  # an execution option: this transaction will write


def make_engine(url: str) -> Engine:
    """The engine for a URL; on SQLite, with WAL and a write lock taken at a writer's start."""
    url = normalise_url(url)
    if not url.startswith("sqlite"):
        return create_engine(url, pool_pre_ping=True)
    engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        # pysqlite's own transaction handling would defeat BEGIN IMMEDIATE below.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        # Writers take the write lock at the start so two never deadlock on upgrade; readers
        # read a snapshot (WAL) and wait for no one.
        writer = conn.get_execution_options().get(WRITER, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if writer else "BEGIN")

    return engine
