"""A Klique token is read from the store once for a burst of requests, and a revocation
through the server forgets it at once, even one whose read was under way."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from broker.estate import builtin_estate
from broker.identity import resolve
from broker.identity.resolve import Identities, Refused
from broker.store.repository import Store


@pytest.fixture
def identities(tmp_path) -> Iterator[Identities]:
    store = Store.open(f"sqlite:///{tmp_path / 'k.db'}")
    yield Identities(store, builtin_estate)
    store.close()


def test_a_token_read_once_is_remembered_and_a_revocation_forgets_it(identities) -> None:
    token, info = identities.store.add_token("alice", scopes=("read", "submit"))
    assert identities.remembered(token) is None  # never read: the store must be asked
    assert identities.from_token(token).user == "alice"
    remembered = identities.remembered(token)
    assert remembered is not None and (remembered.user, remembered.scopes) == (
        "alice",
        {"read", "submit"},
    )
    assert identities.remembered(token + "x") is None and identities.remembered("") is None
    identities.revoke(info.id)
    assert identities.remembered(token) is None
    with pytest.raises(Refused, match="was revoked"):
        identities.from_token(token)


def test_a_token_is_read_again_after_a_few_seconds(identities, monkeypatch) -> None:
    token, _ = identities.store.add_token("alice")
    identities.from_token(token)
    clock = resolve.time.monotonic() + resolve.TOKEN_MEMORY_S + 1
    monkeypatch.setattr(resolve.time, "monotonic", lambda: clock)
    assert identities.remembered(token) is None


def test_a_read_under_way_during_a_revocation_is_not_remembered(identities, monkeypatch) -> None:
    token, info = identities.store.add_token("alice")
    read = identities.store.token

    def read_then_revoked(asked: str):
        found = read(asked)  # the row as it was: in force
        identities.revoke(info.id)  # another request revokes it before this read returns
        return found

    monkeypatch.setattr(identities.store, "token", read_then_revoked)
    assert identities.from_token(token).user == "alice"  # the request already under way
    assert identities.remembered(token) is None
    monkeypatch.undo()
    with pytest.raises(Refused, match="was revoked"):
        identities.from_token(token)


def test_an_expired_token_is_not_answered_from_memory(identities, monkeypatch) -> None:
    token, _ = identities.store.add_token("alice", expires_at=resolve.time.time() + 60)
    identities.from_token(token)
    later = resolve.time.time() + 61
    monkeypatch.setattr(resolve.time, "time", lambda: later)
    assert identities.remembered(token) is None
    with pytest.raises(Refused, match="has expired"):
        identities.from_token(token)
