"""/healthz and /readyz answer anyone, with no token: they must carry nothing an attacker could
use: not the store's address, user, password or database name, not a token, not the text of
a database error (which names the database's host), whether the store answers or not."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from helpers.postgres import fresh_schema

from broker.app import create_app
from broker.control.lease import Leadership
from broker.control.loop import ControlLoop
from broker.estate import builtin_estate
from broker.store.leases import LeaseStore, lease_engine
from broker.store.repository import Store

from .conftest import RESOURCE

SECRETS_OF_THE_STORE = ("db-secret.invalid", "user-secret", "password-secret", "dbname-secret")
UNREACHABLE = "postgresql://user-secret:password-secret@db-secret.invalid:5432/dbname-secret"


def test_readyz_says_the_store_is_unreachable_without_its_address_or_error(tmp_path: Path) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'k.db'}")
    leases = LeaseStore(lease_engine(UNREACHABLE, 2.0))
    control = ControlLoop(
        store, builtin_estate(), {}, tmp_path, leadership=Leadership(leases, "replica-1")
    )
    try:
        with TestClient(create_app(control)) as client:
            ready = client.get("/readyz")
            alive = client.get("/healthz")
    finally:
        leases.close()
        store.close()
    assert ready.status_code == 503
    assert ready.json()["store"] == "unreachable" and ready.json()["ready"] is False
    assert alive.status_code == 200
    for answer in (ready, alive):
        said = answer.text + str(answer.headers)
        for word in (*SECRETS_OF_THE_STORE, "psycopg", "resolve", "5432"):
            assert word not in said, word


@pytest.mark.postgres
def test_a_replicas_health_and_readiness_name_no_store_and_no_token(
    module_server_factory, postgres_url: str
) -> None:
    url = fresh_schema(postgres_url)
    estate = RESOURCE + "pools:\n  p:\n    kind: host\n    slots: 1\n"
    server = module_server_factory(estate, KLIQUE_DB=url)
    schema = url.rsplit("%3D", 1)[1]
    for path in ("/healthz", "/readyz"):
        answer = httpx.get(server.url + path, timeout=10)  # no token: anyone may ask
        assert answer.status_code == 200, answer.text
        for word in ("klique_test", "54329", "postgres", schema, server.token, "search_path"):
            assert word not in answer.text, (path, word)
    assert httpx.get(server.url + "/readyz", timeout=10).json()["role"] == "leader"


def test_a_request_that_meets_an_unreachable_store_is_503_without_its_address() -> None:
    store = Store(UNREACHABLE)  # never opened: every query fails to connect
    control = ControlLoop(store, builtin_estate(), {}, Path("/nonexistent"))
    try:
        with TestClient(create_app(control), raise_server_exceptions=False) as client:
            answer = client.get("/api/v1/tasks", headers={"Authorization": "Bearer nothing"})
    finally:
        store.close()
    assert answer.status_code == 503, answer.text
    assert "try again" in answer.json()["detail"]
    for word in (*SECRETS_OF_THE_STORE, "psycopg", "Traceback"):
        assert word not in answer.text, word
