"""What one replica's writes tell the others, on PostgreSQL: each transaction that writes task
rows sends their ids with NOTIFY, delivered at its commit (and never for a rollback), and each
replica's listener adds them to its store's changes (broker/store/changes.py), so that the
leader's scheduler learns of a task created on a follower at once, as it does of its own.

A listener that loses its connection says "anything may have changed" when it is back
(the scheduler then reads everything once): nothing sent meanwhile is lost."""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable
from types import ModuleType

from sqlalchemy import make_url, text
from sqlalchemy.orm import Session

from broker.store.changes import TOUCHED, Changes

log = logging.getLogger("klique.store")

CHANNEL = "klique_tasks"
EVERYTHING = "*"  # too many ids for one notification (8,000 bytes): read everything
_MOST_BYTES = 7000
# This process's name on the channel: its own writes are in its changes already.
SENDER = secrets.token_hex(8)


def announces(url: str) -> bool:
    """Whether a store at `url` tells other replicas of its writes (PostgreSQL; SQLite serves
    one server)."""
    return url.startswith("postgresql")


def payload(ids: set[int]) -> str:
    """The notification's text: the sender, then the ids, or EVERYTHING when too many."""
    listed = ",".join(str(i) for i in sorted(ids))
    return f"{SENDER} {listed if len(listed) <= _MOST_BYTES else EVERYTHING}"


def parse(text_: str) -> tuple[str, set[int] | None]:
    """A notification's sender and its ids (None: everything may have changed)."""
    sender, _, listed = text_.partition(" ")
    if listed == EVERYTHING:
        return sender, None
    return sender, {int(i) for i in listed.split(",") if i.isdigit()}


def announce(session: Session) -> None:
    """Send the ids of the task rows this transaction wrote; delivered when it commits."""
    session.flush()
    ids = session.info.get(TOUCHED)
    if ids:
        session.execute(
            text("SELECT pg_notify(:channel, :payload)"),
            {"channel": CHANNEL, "payload": payload(ids)},
        )


class ChangeListener:
    """A thread that hears the other replicas' writes and hands them to `changes`, then calls
    `heard` (the control loop's wake)."""

    def __init__(self, url: str, changes: Changes, heard: Callable[[], None]) -> None:
        self.conninfo = make_url(url).set(drivername="postgresql").render_as_string(False)
        self.changes = changes
        self.heard = heard
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="klique-listener", daemon=True)
        self._failure = ""

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        import psycopg  # the postgres extra is optional: only a PostgreSQL store listens

        while not self._stop.is_set():
            try:
                self._listen(psycopg)
            except psycopg.Error as exc:
                if str(exc) != self._failure:  # logged once per run of failures
                    log.warning("cannot hear other replicas' writes (retrying): %s", exc)
                    self._failure = str(exc)
                self._stop.wait(1.0)

    def _listen(self, psycopg: ModuleType) -> None:
        with psycopg.connect(self.conninfo, autocommit=True, connect_timeout=3) as connection:
            connection.execute(f"LISTEN {CHANNEL}")
            self._failure = ""
            self.changes.forget()  # what was sent while no one listened: read everything
            self.heard()
            while not self._stop.is_set():
                for note in connection.notifies(timeout=1.0):
                    sender, ids = parse(note.payload)
                    if sender == SENDER:
                        continue
                    if ids is None:
                        self.changes.forget()
                    else:
                        self.changes.add(ids)
                    self.heard()
