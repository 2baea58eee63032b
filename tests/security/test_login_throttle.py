"""The brake on password guessing (broker/identity/throttle.py): failures per key in a
sliding window, in a table whose size a flood of distinct names cannot grow. A clock of the
test's own, so no test waits."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from broker.api.identity import identity_router
from broker.identity import ldap
from broker.identity.throttle import Throttle, retry_after
from broker.identity_settings import IdentityFile, LdapFile


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_a_key_waits_after_its_limit_until_its_oldest_failure_leaves_the_window(clock) -> None:
    throttle = Throttle(limit=3, window_s=60, clock=clock)
    for _ in range(3):
        assert throttle.wait("alice") == 0
        throttle.add("alice")
        clock.now += 10
    assert throttle.wait("alice") == pytest.approx(30)  # the first failure was at 1000
    assert throttle.wait("bob") == 0  # another key is not slowed
    clock.now += 30
    assert throttle.wait("alice") == 0
    assert retry_after(0.2) == "1" and retry_after(30.0) == "30" and retry_after(59.1) == "60"


def test_the_table_stays_bounded_under_50000_distinct_names(clock) -> None:
    throttle = Throttle(limit=5, window_s=60, size=10_000, clock=clock)
    largest = 0
    for n in range(50_000):
        throttle.add(f"name-{n}")
        largest = max(largest, len(throttle))
    assert largest == 10_000 and len(throttle) == 10_000
    # The least recently failed made room; the most recent are still counted.
    assert throttle.wait("name-49999") == 0 and "name-0" not in throttle._failures
    for _ in range(4):
        throttle.add("name-49999")
    assert throttle.wait("name-49999") > 0


def test_entries_leave_the_table_with_their_window(clock) -> None:
    throttle = Throttle(limit=5, window_s=60, size=10_000, clock=clock)
    for n in range(3000):
        throttle.add(f"name-{n}")
    clock.now += 61
    throttle.add("late")
    assert len(throttle) == 1  # the others' failures left the window: nothing is kept of them


def test_a_key_keeps_at_most_its_limit_of_failure_times(clock) -> None:
    throttle = Throttle(limit=5, window_s=60, clock=clock)
    for _ in range(10_000):
        throttle.add("alice")
    assert len(throttle._failures["alice"]) == 5


def test_tries_made_at_once_cannot_all_pass_the_check(clock) -> None:
    throttle = Throttle(limit=5, window_s=60, clock=clock)
    with ThreadPoolExecutor(32) as pool:
        waits = list(pool.map(lambda _: throttle.take("alice"), range(200)))
    assert sum(1 for wait in waits if wait == 0) == 5
    throttle.forgive("alice")  # one of them succeeded: it does not count
    assert throttle.take("alice") == 0 and throttle.take("alice") > 0


def ldap_api(
    monkeypatch: pytest.MonkeyPatch, directory: Callable[[LdapFile, str, str], ldap.Person]
) -> TestClient:
    """The API's identity routes, in-process, with `directory` answering their LDAP logins."""
    monkeypatch.setattr(ldap, "login", directory)
    settings = LdapFile(url="ldaps://dir", user_dn="uid={user},dc=x", group_base="dc=x")
    identities = SimpleNamespace(identity=IdentityFile(ldap=settings))
    app = FastAPI()
    app.include_router(identity_router(identities, "/api/v1"))  # type: ignore[arg-type]
    return TestClient(app)


def test_a_throttled_ldap_login_never_reaches_the_directory(monkeypatch) -> None:
    """The API's LDAP login, in-process, with a directory that counts the binds it is asked."""
    asked: list[str] = []

    def refuse(settings: LdapFile, user: str, password: str) -> ldap.Person:
        asked.append(user)
        raise ldap.LdapRefused("wrong user name or password")

    with ldap_api(monkeypatch, refuse) as client:
        codes = [
            client.post("/api/v1/auth/ldap", json={"user": name, "password": "x"}).status_code
            for name in ["alice", "ALICE", " alice", "Alice ", "ａｌｉｃｅ", "alice", "ALICE"]
        ]
    assert codes == [401] * 5 + [429] * 2
    assert asked == ["alice"] * 5  # the normalised name, and never once it is throttled


def test_ldap_guesses_sent_at_once_reach_the_directory_at_most_the_limit(monkeypatch) -> None:
    """30 guesses in flight together, against a directory that takes its time to refuse."""
    asked: list[str] = []
    lock = threading.Lock()

    def slow_refusal(settings: LdapFile, user: str, password: str) -> ldap.Person:
        with lock:
            asked.append(user)
        threading.Event().wait(0.3)  # a directory's round trip
        raise ldap.LdapRefused("wrong user name or password")

    with ldap_api(monkeypatch, slow_refusal) as client, ThreadPoolExecutor(30) as pool:
        answers = list(
            pool.map(
                lambda n: (
                    client.post(
                        "/api/v1/auth/ldap", json={"user": "alice", "password": f"guess{n}"}
                    ).status_code
                ),
                range(30),
            )
        )
    assert len(asked) == 5 and answers.count(401) == 5 and answers.count(429) == 25
