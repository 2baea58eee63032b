"""Tokens and sessions in the store, on SQLite and PostgreSQL, and the identity migration
over a database that already holds tokens."""

from __future__ import annotations

import time

import pytest
import sqlalchemy
from alembic import command
from alembic.script import ScriptDirectory
from test_store import _fresh_schema

from broker.store.engine import normalise_url
from broker.store.identity import IdentityStore, token_digest
from broker.store.migrate import config
from broker.store.repository import Store


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'k.db'}"
    return _fresh_schema(request.getfixturevalue("postgres_url"))


def test_tokens_keep_kind_scopes_team_expiry_revocation_and_last_use(url) -> None:
    store = Store.open(url)
    ids = IdentityStore(store)
    token, info = ids.add_token(
        "ci-bot", kind="service", scopes=["submit"], team="vision", expires_at=time.time() + 60
    )
    assert (info.kind, info.scopes, info.team) == ("service", frozenset({"submit"}), "vision")
    assert info.id == token_digest(token)[:16] and ids.is_service_user("ci-bot")
    seen = ids.token(token)
    assert seen is not None and ids.token(token).last_used_at is not None  # type: ignore[union-attr]
    assert (seen.user, seen.admin) == ("ci-bot", False)  # in force: neither revoked nor expired
    assert not seen.revoked and not seen.expired(time.time())
    ids.revoke(info.id)
    assert ids.token(token).revoked  # type: ignore[union-attr]
    gone, _ = ids.add_token("alice", expires_at=time.time() - 1)
    assert ids.token(gone).expired(time.time())  # type: ignore[union-attr]
    assert token not in str([vars(t) for t in ids.tokens()])
    store.close()


def test_sessions_are_kept_as_digests_and_ended(url) -> None:
    store = Store.open(url)
    ids = IdentityStore(store)
    cookie, csrf = ids.add_session("alice", ["cv-lab"], "refresh-1", time.time(), time.time() + 60)
    found = ids.session(cookie)
    assert found is not None and found.groups == ("cv-lab",)
    assert found.digest == token_digest(cookie) and found.csrf_digest == token_digest(csrf)
    ids.refresh_session(found.digest, ["nlp-lab"], "refresh-2", time.time() + 300)
    again = ids.session(cookie)
    assert again is not None and (again.groups, again.refresh_token) == (("nlp-lab",), "refresh-2")
    ids.end_session(found.digest)
    assert ids.session(cookie) is None
    store.close()


def _before_identity() -> str:
    """The revision the identity migration follows, wherever the chain puts it."""
    before = ScriptDirectory.from_config(config()).get_revision("0008_identity").down_revision
    assert isinstance(before, str)
    return before


def test_the_migration_keeps_existing_tokens_and_its_downgrade_drops_narrowed_ones(url) -> None:
    engine = sqlalchemy.create_engine(normalise_url(url))
    command.upgrade(config(engine), _before_identity())
    with engine.begin() as conn:
        for user, admin in (("alice", False), ("admin", True)):
            conn.execute(
                sqlalchemy.text(
                    'INSERT INTO tokens (digest, "user", admin, created_at) VALUES (:d, :u, :a, 0)'
                ),
                {"d": token_digest(user), "u": user, "a": admin},
            )
    engine.dispose()
    store = Store.open(url)  # to the head
    ids = IdentityStore(store)
    alice, admin = ids.token("alice"), ids.token("admin")
    assert alice is not None and (alice.kind, alice.scopes) == (
        "user",
        frozenset({"read", "submit"}),
    )
    assert admin is not None and admin.kind == "admin" and "admin" in admin.scopes
    ids.add_token("reader", scopes=["read"])
    store.close()
    engine = sqlalchemy.create_engine(normalise_url(url))
    command.downgrade(config(engine), _before_identity())
    with engine.connect() as conn:
        users = {row[0] for row in conn.execute(sqlalchemy.text('SELECT "user" FROM tokens'))}
    engine.dispose()
    assert users == {"alice", "admin"}  # the read-only token would have become a full one
