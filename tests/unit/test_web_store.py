"""The task list's queries on a real SQLite store: keyset pages, filters, a bounded search
that says where it stopped, changes since a time; and a browser session signed in with a token."""

from __future__ import annotations

import time

import pytest

from broker.domain import TaskSpec, TaskState
from broker.estate import builtin_estate
from broker.identity.resolve import Identities, Refused
from broker.store import web
from broker.store.repository import Store
from broker.store.web import TaskFilter, task_page


def _fill(store: Store, n: int) -> list[int]:
    ids = []
    for i in range(n):
        spec = TaskSpec(
            ("true",),
            "cpu",
            name=f"run {i}" + (" needle" if i % 10 == 3 else ""),
            project=f"p{i % 3}",
        )
        ids.append(store.create_task(spec, "alice" if i % 2 else "bob", None).id)
    return ids


def _all_pages(store: Store, where: TaskFilter, limit: int) -> list[int]:
    seen, before = [], None
    while True:
        page = task_page(store, where, before, limit)
        seen += [t.id for t in page.tasks]
        if page.next_before is None:
            return seen
        before = page.next_before


def test_pages_walk_every_matching_task_once_newest_first(store) -> None:
    ids = _fill(store, 30)
    assert _all_pages(store, TaskFilter(), 7) == sorted(ids, reverse=True)
    alices = [t.id for t in store.tasks(owner="alice")]
    assert _all_pages(store, TaskFilter(owner="alice", project="p1"), 4) == sorted(
        [i for i in alices if store.get(i).spec.project == "p1"], reverse=True
    )
    store.change_state(ids[0], TaskState.CANCELLED)
    assert _all_pages(store, TaskFilter(states=(TaskState.CANCELLED,)), 4) == [ids[0]]


def test_a_search_reads_a_bounded_window_and_goes_on_from_where_it_stopped(
    store, monkeypatch
) -> None:
    ids = _fill(store, 40)
    monkeypatch.setattr(web, "SEARCH_WINDOW", 8)
    needles = sorted((i for n, i in enumerate(ids) if n % 10 == 3), reverse=True)
    first = task_page(store, TaskFilter(search="NEEDLE"), None, 10)
    assert [t.id for t in first.tasks] == [i for i in needles if i > ids[-8] - 1]
    assert first.searched_to == ids[-8] and first.next_before == ids[-8]
    assert _all_pages(store, TaskFilter(search="needle"), 10) == needles
    assert task_page(store, TaskFilter(search="50%_"), None, 10).tasks == []  # LIKE's own signs


def test_changes_since_a_time_are_the_tasks_written_after_it(store) -> None:
    ids = _fill(store, 4)
    mark = time.time()
    store.change_state(ids[1], TaskState.CANCELLED)
    changed = web.changed_since(store, mark, None)
    assert [t.id for t, _ in changed] == [ids[1]]
    assert web.changed_since(store, mark, "bob") == []  # the second task is alice's
    assert [t.id for t, _ in web.changed_since(store, mark, "alice")] == [ids[1]]


def test_a_session_signed_in_with_a_token_is_that_token_while_it_is_in_force(store) -> None:
    identities = Identities(store, builtin_estate)
    token, info = identities.store.add_token("alice", scopes=("read",))
    cookie, csrf = identities.store.add_session(
        "alice", (), "", time.time() + 60, time.time() + 60, token_id=info.id
    )
    who = identities.from_session(cookie, True, csrf)
    assert (who.user, who.admin, who.scopes, who.via) == ("alice", False, {"read"}, "session")
    with pytest.raises(Refused):
        identities.from_session(cookie, True, csrf[:-1] + ("A" if csrf[-1] != "A" else "B"))
    identities.store.revoke(info.id)
    with pytest.raises(Refused, match="has ended"):
        identities.from_session(cookie, False, None)
    assert identities.store.session(cookie) is None  # and the record is gone
