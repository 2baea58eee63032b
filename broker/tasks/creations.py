"""Single creates of concurrent requests, written together. Each `POST /tasks` hands its task
to one writer thread, which takes every task then waiting and writes them in one transaction
(multi-row INSERTs, as a batch is written); each request gets its own task back. A create
that comes alone is written at once; under load, requests share a transaction's cost and
wait for no worker thread of their own."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.domain import Task, TaskSpec
from broker.store.repository import Store

MOST_TOGETHER = 500  # tasks a transaction, at most
IDLE_S = 30.0  # the writer thread ends after this long without work; the next create starts it


@dataclass(frozen=True)
class _Create:
    spec: TaskSpec
    gpus: float
    owner: str
    team: str | None
    done: asyncio.Future[Task]  # on the request's event loop


class Creations:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._waiting: queue.SimpleQueue[_Create] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._writer: threading.Thread | None = None

    async def create(self, spec: TaskSpec, gpus: float, owner: str, team: str | None) -> Task:
        """A queued task, once its transaction has committed."""
        done: asyncio.Future[Task] = asyncio.get_running_loop().create_future()
        with self._lock:
            self._waiting.put(_Create(spec, gpus, owner, team, done))
            if self._writer is None:
                self._writer = threading.Thread(target=self._write, name="klique-creates")
                self._writer.daemon = True
                self._writer.start()
        return await done

    def _write(self) -> None:
        while (batch := self._next()) is not None:
            items = [(c.spec, c.gpus, c.owner, c.team) for c in batch]
            try:
                tasks = self.store.create_queued_each(items)
            except Exception as exc:  # every request of the transaction is told; none lost
                for create in batch:
                    _tell(create, _fail, exc)
                continue
            for create, task in zip(batch, tasks, strict=True):
                _tell(create, _answer, task)

    def _next(self) -> list[_Create] | None:
        """Every create waiting (the first waited for), or None once idle: the thread ends."""
        try:
            batch = [self._waiting.get(timeout=IDLE_S)]
        except queue.Empty:
            with self._lock:
                if self._waiting.empty():
                    self._writer = None
                    return None
            batch = [self._waiting.get()]
        while len(batch) < MOST_TOGETHER:
            try:
                batch.append(self._waiting.get_nowait())
            except queue.Empty:
                break
        return batch


def _tell(create: _Create, how: Callable[[asyncio.Future[Task], Any], None], what: Any) -> None:
    """Settle a request's future on its own event loop, unless that loop has closed (the
    server stopped while the transaction ran: there is no one left to tell)."""
    with contextlib.suppress(RuntimeError):
        create.done.get_loop().call_soon_threadsafe(how, create.done, what)


def _answer(done: asyncio.Future[Task], task: Task) -> None:
    if not done.done():  # a request whose client left was cancelled; its task stays queued
        done.set_result(task)


def _fail(done: asyncio.Future[Task], exc: Exception) -> None:
    if not done.done():
        done.set_exception(exc)
