"""/metrics is scraped without a user's token: it must carry nothing of any user (no user names,
no task names or ids, no path a caller typed), and no caller may grow its number of series."""

from __future__ import annotations

import secrets

import httpx
import pytest
from conftest import HOST_ACCESS

from .conftest import RESOURCE

ESTATE = RESOURCE + f"pools:\n  p:\n    kind: host\n    slots: 1\n    {HOST_ACCESS}\n"


@pytest.fixture(scope="module")
def server(module_server_factory):
    return module_server_factory(ESTATE)


def scrape(server) -> str:
    answer = httpx.get(server.url + "/metrics", timeout=30)
    assert answer.status_code == 200
    return answer.text


def series(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def test_metrics_name_no_user_no_task_and_no_typed_path(server) -> None:
    user = f"victim{secrets.token_hex(4)}"
    name = f"secret-project-{secrets.token_hex(6)}"
    with server.api(server.make_token(user)) as api:
        task = api.post("/tasks", json={"command": ["true"], "name": name}).json()
        api.get(f"/tasks/{task['id']}")
        api.get(f"/tasks/{task['id']}/logs")
    # An anonymous caller puts its own words in paths, methods and queries.
    typed = f"typed{secrets.token_hex(6)}"
    httpx.get(f"{server.url}/api/v1/tasks/{typed}", timeout=30)
    httpx.get(f"{server.url}/{typed}/{user}?name={name}", timeout=30)
    httpx.request(typed.upper(), f"{server.url}/api/v1/tasks", timeout=30)
    text = scrape(server)
    for word in (user, name, typed, typed.upper(), f"/tasks/{task['id']}"):
        assert word not in text, word


def test_no_caller_grows_the_number_of_series(server) -> None:
    def flood(n: int) -> None:
        for _ in range(n):
            word = secrets.token_hex(6)
            httpx.get(f"{server.url}/api/v1/{word}", timeout=30)
            httpx.get(f"{server.url}/api/v1/tasks/{secrets.randbelow(10**9) + 1}", timeout=30)
            httpx.request(word.upper(), f"{server.url}/{word}", timeout=30)

    flood(3)  # every label value a flood can reach, seen once
    before = series(scrape(server))
    flood(30)
    assert series(scrape(server)) == before
