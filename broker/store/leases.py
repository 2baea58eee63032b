"""The store's side of the scheduler's lease (the rules are broker/control/lease.py's): read the
row and the database's clock, write what the rules decided, in one transaction that locks the
row; and the fence that a leader's write carries.

Every replica reads one clock, the database's, so that the replicas' own clocks never have to
agree. The lease has an engine of its own, with few connections and a short TCP timeout: a
renewal never queues behind the API's queries, and a replica cut from the database learns it
in seconds rather than after the kernel's retransmissions (minutes)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, create_engine, insert, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from broker.errors import Fenced
from broker.store.engine import normalise_url
from broker.store.tables import LeaderLeaseRow

SCHEDULER = "scheduler"  # the one lease: who runs the placement cycle and the in-server agents
CONNECT_TIMEOUT_S = 3  # libpq's connect_timeout: a database that does not answer, in seconds
CLAIM_WAIT_S = 2.0  # a claim's longest wait for the row, and its longest silence holding it
FENCE_IDLE_S = 3.0  # a fenced write's longest silence holding the row (shared)


@dataclass(frozen=True)
class LeaseRecord:
    """The lease as the row holds it: its holder, its fencing term, and until when it holds
    (seconds since the epoch, on the database's clock)."""

    holder: str
    term: int
    expires_at: float


# What the rules make of the row as it is, at the database's time: the row to write, or None.
Rule = Callable[[LeaseRecord | None, float], LeaseRecord | None]


@dataclass(frozen=True)
class LeaseView:
    """The row after a claim, and the database's time when it was read."""

    record: LeaseRecord | None
    now: float


def lease_engine(url: str, timeout_s: float) -> Engine:
    """An engine for the lease alone: one connection, and on PostgreSQL a connection that gives
    up on a silent peer after `timeout_s` (tcp_user_timeout) rather than the kernel's minutes."""
    url = normalise_url(url)
    if url.startswith("sqlite"):
        return create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})
    millis = max(1000, int(timeout_s * 1000))
    args = {
        "connect_timeout": CONNECT_TIMEOUT_S,
        "tcp_user_timeout": millis,
        "keepalives": 1,
        "keepalives_idle": 1,
        "keepalives_interval": 1,
        "keepalives_count": 3,
    }
    return create_engine(url, pool_size=1, max_overflow=1, pool_pre_ping=True, connect_args=args)


def quick(connection: Connection, lock_s: float | None, idle_s: float) -> None:
    """On PostgreSQL, this transaction waits at most `lock_s` for a lock, and the server ends
    it, with its locks, once its client has been silent for `idle_s` (a cut network)."""
    if connection.dialect.name != "postgresql":
        return
    if lock_s is not None:
        connection.exec_driver_sql(f"SET LOCAL lock_timeout = '{int(lock_s * 1000)}ms'")
    connection.exec_driver_sql(
        f"SET LOCAL idle_in_transaction_session_timeout = '{int(idle_s * 1000)}ms'"
    )


def database_now(connection: Connection) -> float:
    """The database's clock, the one every replica reads (SQLite: this host's, one server)."""
    if connection.dialect.name == "postgresql":
        return float(connection.scalar(text("SELECT EXTRACT(EPOCH FROM clock_timestamp())")))
    return float(connection.scalar(text("SELECT (julianday('now') - 2440587.5) * 86400.0")))


class LeaseStore:
    """The lease row of one database."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def claim(self, rule: Rule) -> LeaseView:
        """Apply `rule` to the row as it is now, locked, and write what it decided. Two
        replicas that find no row both insert: one wins, the other reads the winner's row."""
        try:
            return self._claim(rule)
        except IntegrityError:
            return self.read()

    def _claim(self, rule: Rule) -> LeaseView:
        with self.engine.begin() as connection:
            # Never wait long for the row (a replica cut mid-write may hold it until the server
            # ends its transaction), nor hold it if this replica is cut now.
            quick(connection, lock_s=CLAIM_WAIT_S, idle_s=CLAIM_WAIT_S)
            now = database_now(connection)
            query = select(LeaderLeaseRow).where(LeaderLeaseRow.name == SCHEDULER)
            row = connection.execute(query.with_for_update()).first()
            current = None if row is None else LeaseRecord(row.holder, row.term, row.expires_at)
            new = rule(current, now)
            if new is None:
                return LeaseView(current, now)
            values = {"holder": new.holder, "term": new.term, "expires_at": new.expires_at}
            if row is None:
                connection.execute(
                    insert(LeaderLeaseRow).values(name=SCHEDULER, renewed_at=now, **values)
                )
            else:
                connection.execute(
                    update(LeaderLeaseRow)
                    .where(LeaderLeaseRow.name == SCHEDULER)
                    .values(renewed_at=now, **values)
                )
            return LeaseView(new, now)

    def read(self) -> LeaseView:
        """The row as it is, without a lock (what /readyz shows)."""
        with self.engine.connect() as connection:
            now = database_now(connection)
            query = select(LeaderLeaseRow).where(LeaderLeaseRow.name == SCHEDULER)
            row = connection.execute(query).first()
        record = None if row is None else LeaseRecord(row.holder, row.term, row.expires_at)
        return LeaseView(record, now)

    def release(self, holder: str, term: int) -> None:
        """End this holder's term now (a clean stop): the next replica need not wait out the
        lease."""
        with self.engine.begin() as connection:
            connection.execute(
                update(LeaderLeaseRow)
                .where(
                    LeaderLeaseRow.name == SCHEDULER,
                    LeaderLeaseRow.holder == holder,
                    LeaderLeaseRow.term == term,
                )
                .values(expires_at=0.0)
            )

    def close(self) -> None:
        self.engine.dispose()


def check_term(session: Session, term: int) -> None:
    """Refuse the session's writes unless `term` is still the lease's. The row stays locked
    (shared) until the transaction ends, so that no replica can take the lease between this
    check and the commit: a take waits for the write, and the write is then behind it."""
    quick(session.connection(), lock_s=None, idle_s=FENCE_IDLE_S)
    query = select(LeaderLeaseRow.term).where(LeaderLeaseRow.name == SCHEDULER)
    found = session.scalar(query.with_for_update(read=True))
    if found != term:
        raise Fenced(
            f"this replica led under term {term}, and the lease's term is now {found}: "
            "another replica leads; the write was refused"
        )
