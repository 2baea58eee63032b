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
_GIVE_UP = {"connect_timeout": 10, "tcp_user_timeout": 20_000}  # libpq's: seconds; ms


def _forget_silent_clients(dbapi_connection: Any, _record: Any) -> None:
    """A transaction whose client went silent (a replica cut from the database, its connection
    still open to the server) is ended by the server after this long, with its row locks:
    another replica waits no longer for them."""
    with dbapi_connection.cursor() as cursor:
        cursor.execute(f"SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION_S}s'")
    dbapi_connection.commit()


IDLE_IN_TRANSACTION_S = 15


def make_engine(url: str) -> Engine:
    """The engine for a URL; on SQLite, with WAL and a write lock taken at a writer's start."""
    url = normalise_url(url)
    if not url.startswith("sqlite"):
        # A database that does not answer (a cut network) fails a request within these, rather
        # than after the kernel's retransmissions (minutes): a replica's API answers an error
        # and a load balancer tries another. tcp_user_timeout counts only unacknowledged bytes
        # sent, so a long query is not cut short.
        engine = create_engine(url, pool_pre_ping=True, connect_args=_GIVE_UP)
        event.listen(engine, "connect", _forget_silent_clients)
        return engine
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
