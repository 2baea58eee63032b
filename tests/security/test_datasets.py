"""Attacks on datasets: another team reading a dataset (or naming content it never sent by its
digest), a manifest's path leaving the cache (../, absolute, links), and a job's report token
writing a dataset its owner does not keep."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import HOST_ACCESS, TASK_PY, Server, wait_for
from helpers.app import call, mcp_session
from helpers.web_session import signed_in

from klique._api import KliqueError
from klique.datasets import Cache

ESTATE = (
    "teams:\n  vision: [alice, carol]\n  nlp: [bob]\n"
    "resources:\n  cpu:\n    profile: {cpus: 1, memory: 200M, walltime: 10m, pools: [p]}\n"
    f"pools:\n  p:\n    kind: host\n    slots: 4\n    {HOST_ACCESS}\n"
    "limits:\n  max_artifacts: 1\n"  # a task's share, MiB: a job's dataset uploads count
)
SECRET = b"alice's private rows\n"


def api(server: Server, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=server.url + "/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def digest(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def make_version(http: httpx.Client, name: str, files: dict[str, bytes]) -> httpx.Response:
    """As the SDK does: ask, send what is missing, post the manifest."""
    digests = [digest(c) for c in files.values()]
    missing = http.post("/datasets/blobs/missing", json={"digests": digests}).json()["missing"]
    for content in files.values():
        if digest(content) in missing:
            sent = http.put(f"/datasets/blobs/{digest(content)}", content=content)
            assert sent.status_code == 201, sent.text
    manifest = {p: {"digest": digest(c), "size": len(c)} for p, c in files.items()}
    return http.post(f"/datasets/{name}/versions", json={"files": manifest})


@pytest.fixture(scope="module")
def datasets(module_server_factory):
    """alice's (team vision) dataset `private`; bob's (team nlp) `bobs`; carol is of vision."""
    server = module_server_factory(ESTATE)
    tokens = {user: server.make_token(user) for user in ("alice", "bob", "carol")}
    with api(server, tokens["alice"]) as alice:
        assert make_version(alice, "private", {"rows.csv": SECRET}).status_code == 201
    with api(server, tokens["bob"]) as bob:
        assert make_version(bob, "bobs", {"b.txt": b"bob's data"}).status_code == 201
    return server, tokens


def test_another_team_cannot_read_a_dataset(datasets, tmp_path) -> None:
    server, tokens = datasets
    blob = f"/datasets/private/versions/1/blobs/{digest(SECRET)}"
    with api(server, tokens["bob"]) as bob:
        assert [d["name"] for d in bob.get("/datasets").json()] == ["bobs"]
        for path in ("/datasets/private", "/datasets/private/versions/1", blob):
            refused = bob.get(path)
            assert refused.status_code == 404, path
            assert SECRET not in refused.content
            assert "klique dataset ls" in refused.json()["detail"]
    got = server.cli("dataset", "get", "private", "-o", str(tmp_path / "x"), token=tokens["bob"])
    assert got.exit_code != 0 and "no dataset 'private' that you may read" in got.output
    with api(server, tokens["carol"]) as carol:  # the dataset's team may
        assert carol.get(blob).content == SECRET


def test_another_team_sees_neither_the_datasets_page_nor_the_mcp_answer(datasets) -> None:
    """The web UI and the MCP tools ask the service the API asks: bob (team nlp) gets the
    answer for a dataset that does not exist, word for word."""
    server, tokens = datasets
    bob = signed_in(server, tokens["bob"])
    try:
        listed = bob.get("/datasets").text
        hidden, absent = bob.get("/datasets/private"), bob.get("/datasets/nosuch")
        typed = bob.get("/datasets/%3Cscript%3Ealert(1)")  # not a dataset name
    finally:
        bob.close()
    assert typed.status_code == 404 and "<script>alert" not in typed.text
    assert "&lt;script&gt;alert(1)" in typed.text and "klique dataset ls" in typed.text
    assert 'href="/datasets/bobs"' in listed and "/datasets/private" not in listed
    assert hidden.status_code == absent.status_code == 404
    assert hidden.text.replace("private", "nosuch") == absent.text
    assert "rows.csv" not in hidden.text and "alice" not in hidden.text

    async def as_bob() -> list[tuple[bool, str]]:
        async with mcp_session(server, tokens["bob"]) as session:
            return [
                await call(session, "list_datasets"),
                await call(session, "show_dataset", name="private"),
                await call(session, "show_dataset", name="nosuch"),
            ]

    (_, names), (refused, shown), (_, nothing) = asyncio.run(as_bob())
    assert [d["name"] for d in json.loads(names)] == ["bobs"]
    assert refused and shown.replace("private", "nosuch") == nothing
    assert "klique dataset ls" in shown
    carol = signed_in(server, tokens["carol"])  # the dataset's team sees it
    try:
        assert 'href="/datasets/private"' in carol.get("/datasets").text
        assert carol.get("/datasets/private").status_code == 200
    finally:
        carol.close()


def test_knowing_a_digest_does_not_read_another_teams_content(datasets) -> None:
    server, tokens = datasets
    stolen = {"rows.csv": {"digest": digest(SECRET), "size": len(SECRET)}}
    with api(server, tokens["bob"]) as bob:
        missing = bob.post("/datasets/blobs/missing", json={"digests": [digest(SECRET)]})
        assert missing.json()["missing"] == [digest(SECRET)]  # not "the server has it"
        made = bob.post("/datasets/heist/versions", json={"files": stolen})
        assert made.status_code == 400 and "never sent" in made.json()["detail"], made.text
        assert bob.get("/datasets/heist").status_code == 404
        # nor can a manifest misstate a size (a client would read past the content, or short)
        mine = b"bob's own"
        assert bob.put(f"/datasets/blobs/{digest(mine)}", content=mine).status_code == 201
        lying = {"x": {"digest": digest(mine), "size": 2**62}}
        made = bob.post("/datasets/bobs/versions", json={"files": lying})
        assert made.status_code == 400 and "its content is 9 bytes" in made.text, made.text
        # a parent is read as any version: another team's is not found
        parent = bob.post("/datasets/private/versions", json={"parent": 1, "files": stolen})
        assert parent.status_code == 404, parent.text


@pytest.mark.parametrize(
    "path", ["../x", "/etc/passwd", "a/../../x", ".ssh/authorized_keys", "a//b"]
)
def test_a_manifest_path_never_leaves_the_version(datasets, path: str) -> None:
    server, tokens = datasets
    with api(server, tokens["alice"]) as alice:
        made = make_version(alice, "paths", {path: b"planted"})
        assert made.status_code in (400, 422), made.text
        assert "dataset file" in made.text
        assert alice.get("/datasets/paths").status_code == 404  # nothing made


class FakeApi:
    """A server that answers every blob with `content` (a malicious or broken one)."""

    def __init__(self, content: bytes) -> None:
        self.content = content

    def download(self, path: str, dest: Any) -> None:
        dest.write(self.content)


@pytest.mark.parametrize("path", ["../escape", "/tmp/escape", "a/../../escape", "a/./b", ""])
def test_a_local_copy_never_writes_outside_the_cache(tmp_path, path: str) -> None:
    cache = Cache(str(tmp_path / "cache"))
    entry = {"digest": digest(b"x"), "size": 1}
    with pytest.raises(KliqueError, match="dataset file"):
        cache.version(FakeApi(b"x"), "d", 1, {path: entry})
    assert not (tmp_path / "escape").exists() and not Path("/tmp/escape").exists()
    assert not (tmp_path / "cache" / "versions" / "d" / "v1").exists()


def test_links_planted_in_the_cache_are_never_followed(tmp_path) -> None:
    cache = Cache(str(tmp_path / "cache"))
    outside = tmp_path / "outside"
    outside.write_bytes(b"y")  # the right size: only its being a link gives it away
    blob = tmp_path / "cache" / "blobs" / digest(b"x")[:2] / digest(b"x")
    blob.parent.mkdir(parents=True)
    blob.symlink_to(outside)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    version = tmp_path / "cache" / "versions" / "d" / "v1"
    version.parent.mkdir(parents=True)
    version.symlink_to(elsewhere)
    folder = cache.version(FakeApi(b"x"), "d", 1, {"f": {"digest": digest(b"x"), "size": 1}})
    assert folder == str(version) and not version.is_symlink()
    assert (version / "f").read_bytes() == b"x"
    assert outside.read_bytes() == b"y" and list(elsewhere.iterdir()) == []


def running_token(server: Server, token: str) -> tuple[int, str]:
    """A running task of the token's user, and its job's report token."""
    with api(server, token) as http:
        made = http.post(
            "/tasks", json={"command": [TASK_PY, "-c", "import time; time.sleep(300)"]}
        )
        assert made.status_code == 201, made.text
    task_id = made.json()["id"]

    def started() -> dict[str, Any] | None:
        task = server.task(task_id, token)
        return task if task["state"] == "running" and task.get("job_dir") else None

    task = wait_for(started, 90, "the task to run")
    report = json.loads((Path(task["job_dir"]) / "task.json").read_text())["report"]
    return task_id, str(report["token"])


def test_a_jobs_token_writes_and_reads_only_its_owners_datasets(datasets) -> None:
    server, tokens = datasets
    task_id, job_token = running_token(server, tokens["alice"])
    try:
        with api(server, job_token) as job:
            made = make_version(job, "private", {"rows.csv": SECRET, "more.csv": b"from the job"})
            assert made.status_code == 201, made.text
            assert (made.json()["created_by"], made.json()["task_id"]) == ("alice", task_id)
            assert job.get("/datasets/private/versions/2").status_code == 200
            written = make_version(job, "bobs", {"b.txt": b"overwritten by alice's job"})
            assert written.status_code == 403, written.text
            assert job.get("/datasets/bobs/versions/1").status_code == 404
            # what a job sends counts against its task's share, as its artifacts do
            first, second = os.urandom(600 * 1024), os.urandom(600 * 1024)
            assert job.put(f"/datasets/blobs/{digest(first)}", content=first).status_code == 201
            sent = job.put(f"/datasets/blobs/{digest(second)}", content=second)
            assert sent.status_code == 413 and "limits.max_artifacts" in sent.text, sent.text
            asked = job.post("/datasets/blobs/missing", json={"digests": [digest(second)]})
            assert asked.json()["missing"] == [digest(second)]  # nothing kept of it
        with api(server, tokens["bob"]) as bob:
            assert bob.get("/datasets/bobs").json()["latest"] == 1  # nothing changed
        assert server.task(task_id, tokens["alice"])["datasets"][0]["version"] == 2
    finally:
        with api(server, tokens["alice"]) as http:
            http.post(f"/tasks/{task_id}/cancel")
