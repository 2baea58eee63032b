"""The task list's live stream on a real SQLite store: rows it shows follow their tasks, new
matching tasks arrive on the first page only, a reconnect redraws live rows in place, and a
burst of changes larger than a batch never holds the stream in place."""

from __future__ import annotations

from types import SimpleNamespace
from urllib.parse import urlencode

import pytest
from starlette.requests import Request

from broker.domain import TaskSpec, TaskState
from broker.store.repository import Store
from broker.web import live
from broker.web.live import TaskListStream
from broker.web.ui import Viewer


@pytest.fixture
def web(tmp_path):
    store = Store.open(f"sqlite:///{tmp_path / 'k.db'}")
    yield SimpleNamespace(store=store, control=SimpleNamespace(store=store, pending={}))
    store.close()


def _request(params: dict[str, str], last_event_id: str = "") -> Request:
    headers = [(b"last-event-id", last_event_id.encode())] if last_event_id else []
    scope = {"type": "http", "method": "GET", "path": "/events/tasks", "headers": headers}
    return Request({**scope, "query_string": urlencode(params).encode()})


def _task(web, owner: str = "alice", name: str = "run") -> int:
    return web.store.create_task(TaskSpec(("true",), "cpu", name=name), owner, None).id


def _names(events: list[str]) -> list[str]:
    return [e.split("\n", 1)[0].removeprefix("event: ") for e in events]


ALICE = Viewer("alice", False, "x")


def test_shown_rows_follow_and_new_matching_tasks_come_in_on_the_first_page(web) -> None:
    shown = _task(web)
    page = {"ids": str(shown), "page": "first", "top": str(shown), "since": "0", "q": "run"}
    stream = TaskListStream(web, _request(page), ALICE)
    stream.tick()  # what was there when the page was drawn
    web.store.change_state(shown, TaskState.CANCELLED)
    new = _task(web, name="run 2")
    _task(web, name="other")  # does not match the search
    _task(web, owner="bob", name="run 3")  # not alice's
    assert _names(stream.tick()) == [f"task-{shown}", "task-new"]
    later = TaskListStream(web, _request({**page, "page": "", "since": "0"}), ALICE)
    assert f"task-{new}" not in "".join(later.tick())  # not on a later page


def test_a_reconnect_redraws_rows_that_came_live_in_place(web) -> None:
    first = _task(web)
    page = {"ids": str(first), "page": "first", "top": str(first)}
    stream = TaskListStream(web, _request({**page, "since": "0"}), ALICE)
    stream.tick()
    came = _task(web)
    assert _names(stream.tick()) == ["task-new"]
    again = TaskListStream(web, _request(page, last_event_id=stream.cursor()), ALICE)
    web.store.change_state(came, TaskState.CANCELLED)
    names = _names(again.tick())  # rows changed just before the cursor may be drawn again too
    assert f"task-{came}" in names and "task-new" not in names


def test_a_burst_larger_than_a_batch_is_sent_in_full(web, monkeypatch) -> None:
    monkeypatch.setattr(live, "CHANGES", 5)
    ids = [_task(web) for _ in range(12)]
    stream = TaskListStream(
        web, _request({"ids": ",".join(map(str, ids)), "page": "first", "since": "0"}), ALICE
    )
    sent: set[str] = set()
    for _ in range(5):
        sent.update(_names(stream.tick()))
    assert sent == {f"task-{i}" for i in ids}
