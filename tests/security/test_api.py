"""Bad input gets a 4xx with a reason, never a 5xx: size limits, ids, states, values; the
whole API fuzzed against its own OpenAPI document as a plain user and as an admin."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from conftest import HOST_ACCESS

from .conftest import RESOURCE

LIMITED = (
    RESOURCE
    + f"pools:\n  p:\n    kind: host\n    slots: 1\n    {HOST_ACCESS}\n"
    + "limits: {max_request: 2M, max_diff: 1M}\n"
)


@pytest.fixture
def limited(server_factory):
    return server_factory(LIMITED)


@pytest.fixture(scope="module")
def limited_shared(module_server_factory):
    """One server for the bad-input cases, which change nothing."""
    return module_server_factory(LIMITED)


def test_a_body_over_the_limit_is_refused_with_the_limit_and_the_fix(limited) -> None:
    with limited.api() as api:
        big = api.post("/tasks", json={"command": ["true"], "name": "x" * (3 << 20)})
        assert big.status_code == 413
        assert "limit of 2097152 bytes" in big.json()["detail"]
        assert "limits.max_request" in big.json()["detail"]
        chunked = api.post(
            "/tasks",
            content=iter([b'{"command": ["true"], "name": "', b"x" * (3 << 20), b'"}']),
            headers={"Content-Type": "application/json"},
        )
        assert chunked.status_code == 413 and "limits.max_request" in chunked.json()["detail"]
        assert api.get("/tasks").json() == []


def test_a_diff_over_the_limit_is_refused_with_the_limit_and_the_fix(limited) -> None:
    code = {"repo": "/srv/repo", "commit": "a" * 40, "diff": "+" * (1536 << 10)}
    with limited.api() as api:
        answer = api.post("/tasks", json={"command": ["true"], "code": code})
        assert answer.status_code == 413
        assert "limit of 1048576" in answer.text and "limits.max_diff" in answer.text
        assert api.get("/tasks").json() == []


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("GET", "/tasks?state=bogus", None, 400),
        ("GET", "/tasks?state=running,bogus", None, 400),
        ("GET", "/tasks?limit=0", None, 422),
        ("GET", "/tasks/99999999999999999999", None, 422),
        ("GET", "/tasks/0", None, 422),
        ("GET", "/tasks/123456", None, 404),
        ("GET", "/tasks/1/logs?offset=-1", None, 422),
        ("POST", "/tasks", {"command": []}, 422),
        ("POST", "/tasks", {"command": ["a\u0000b"]}, 422),
        ("POST", "/tasks", {"command": ["true"], "env": {"A": {"x": 1}}}, 422),
        ("POST", "/tasks", {"command": ["true"], "env": {"1BAD": "x"}}, 422),
        ("POST", "/tasks", {"command": ["true"], "code": {"repo": "--upload-pack=id"}}, 422),
        ("POST", "/tasks", {"command": ["true"], "surprise": 1}, 422),
        ("POST", "/tasks/1/report", {"exit": {"exit_code": 2**70, "outcome": "completed"}}, 422),
        ("POST", "/tasks/1/report", {"exit": {"outcome": {"a": 1}}}, 422),
        ("POST", "/tasks/1/report", {"scalars": [{"name": "x", "value": "nan"}]}, 422),
        ("POST", "/tasks/1/report", {"exit": {"exit_code": 0, "outcome": "completed"}}, 401),
        ("POST", "/tokens", {"user": "bob\nroot"}, 422),
        ("POST", "/tasks/batch", {"tasks": []}, 422),
        ("POST", "/tasks/batch", {"tasks": [{"command": ["true"], "owner": "bob"}]}, 422),
        ("POST", "/sweeps", {"tasks": [{"command": ["true"]}], "name": "a\nb"}, 422),
        ("POST", "/sweeps", {"tasks": [{"command": ["true"], "resource": "gpu"}]}, 404),
        ("GET", "/sweeps/0", None, 422),
        ("GET", "/sweeps/123456", None, 404),
        ("POST", "/sweeps/123456/cancel", None, 404),
    ],
)
def test_bad_input_is_a_4xx_with_a_reason(limited_shared, method, path, body, status) -> None:
    with limited_shared.api() as api:
        answer = api.request(method, path, json=body)
    assert answer.status_code == status, answer.text
    assert answer.json()["detail"]


def test_listings_page_through_the_tasks_newest_first(limited) -> None:
    with limited.api() as api:
        ids = [api.post("/tasks", json={"command": ["true"]}).json()["id"] for _ in range(5)]
        first = api.get("/tasks", params={"limit": 2}).json()
        second = api.get("/tasks", params={"limit": 2, "before": first[-1]["id"]}).json()
        third = api.get("/tasks", params={"limit": 2, "before": second[-1]["id"]}).json()
    assert [t["id"] for t in first + second + third] == sorted(ids, reverse=True)


def _schemathesis() -> str:
    found = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    assert found, "schemathesis is a test dependency: pip install -e '.[dev]'"
    return found


@pytest.mark.long
@pytest.mark.separate  # each fuzzing run is long: the two run on different workers
@pytest.mark.parametrize("who", ["user", "admin"])
def test_the_api_fuzzed_against_its_own_schema_answers_no_5xx(
    server_factory, who, tmp_path: Path
) -> None:
    """Every operation, with generated valid and invalid input: no 5xx, no response outside
    the documented schema. Nothing may run: the one team's limit is 0. Revoking a token is
    left out (the fuzzer would revoke its own and test nothing after; test_sign_on.py attacks
    it), and so is Hypothesis's check of how fast it generates data, which measures this
    machine's load, not the API. The coverage phase (each parameter's boundaries, about 40 %
    of a run's CPU) runs once, as the admin, who reaches every operation; the user's run
    fuzzes the same operations where ownership and scopes answer instead."""
    server = server_factory(
        "teams:\n  vision: [alice, admin]\n"
        + RESOURCE
        + f"pools:\n  p:\n    kind: host\n    slots: 1\n    {HOST_ACCESS}\n"
        + "policies:\n  vision: {resources: [cpu], limit: {cpu: 0}}\n"
    )
    token = server.token if who == "admin" else server.make_token("alice")
    done = subprocess.run(
        [
            _schemathesis(),
            "run",
            f"{server.url}/openapi.json",
            "--header",
            f"Authorization: Bearer {token}",
            "--checks",
            "not_a_server_error,response_schema_conformance,status_code_conformance,"
            "content_type_conformance",
            "--phases",
            "coverage,fuzzing,stateful" if who == "admin" else "fuzzing,stateful",
            "--max-examples",
            "15",
            "--seed",
            "1",
            "--generation-deterministic",
            "--exclude-path-regex",
            "/revoke$",
            # How fast examples are generated is the machine's load, not the API's behaviour.
            "--suppress-health-check=too_slow",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=tmp_path,  # its cache of findings stays out of the checkout
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    with httpx.Client(base_url=server.url + "/api/v1") as api:
        assert api.get("/health").status_code == 200  # still up
