"""Datasets end to end on the host pool: a version from a folder, the next with one file changed
sends only that file; two tasks on one node read it and the server serves its files once (the
node's cache, under its lock); the tasks' records list the version, and so do the Datasets pages
and the MCP tools (with the tasks that read it). And the S3 store's round trip against a local
S3 (moto's server mode)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest
from conftest import HOST_ACCESS, TASK_PY, wait_for
from helpers.app import call, mcp_session
from helpers.batch import open_folder, pool_yaml, remove_tree
from helpers.web_session import signed_in
from prometheus_client.parser import text_string_to_metric_families

from broker.artifacts import ArtifactStore
from broker.datasets.blobs import S3Blobs, blobs_for
from broker.errors import TooLarge
from broker.estate import parse_estate

TEAMS = "teams:\n  vision: [alice]\n  nlp: [bob]\n"
RESOURCE = "resources:\n  cpu:\n    profile: {cpus: 1, memory: 1G, walltime: 1h, pools: [p]}\n"
HOST = TEAMS + RESOURCE + f"pools:\n  p:\n    kind: host\n    slots: 4\n    {HOST_ACCESS}\n"
# A task that reads a version into the node's cache and prints what it found.
READ = """
import hashlib, json, os, sys, klique
ds = klique.Dataset.get(dataset_name=sys.argv[1], dataset_version=2)
folder = ds.get_local_copy()
found = {}
for root, _, files in os.walk(folder):
    for name in files:
        path = os.path.join(root, name)
        with open(path, "rb") as f:
            found[os.path.relpath(path, folder)] = hashlib.sha256(f.read()).hexdigest()
listed = json.dumps(found, sort_keys=True).encode()
print(json.dumps({"files": len(found), "digest": hashlib.sha256(listed).hexdigest()}))
"""
FILES = 20


def submit_readers(server, token: str, name: str, count: int) -> list[int]:
    """The ids of `count` tasks sent to cpu, each reading version 2 of dataset `name` (READ)."""
    argv = ["submit", "--no-code", "--json", "-r", "cpu", "--", TASK_PY, "-c", READ, name]
    ids = []
    for _ in range(count):
        sent = server.cli(*argv, token=token)
        assert sent.exit_code == 0, sent.output
        ids.append(json.loads(sent.output)["id"])
    return ids


def make_folder(root: Path, tag: str) -> Path:
    folder = root / "data"
    for i in range(FILES):
        sub = folder / ("train" if i % 2 else "test")
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"{i:03d}.bin").write_bytes(f"{tag} file {i}\n".encode() * 500)
    return folder


def requests(server, method: str, route: str) -> int:
    """Requests the server answered on a route (its /metrics count, 2xx)."""
    text = httpx.get(server.url + "/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if (
                sample.name.endswith("_count")
                and labels.get("method") == method
                and labels.get("route") == "/api/v1/datasets" + route
                and labels.get("status") == "2xx"
            ):
                return int(sample.value)
    return 0


BLOB_GET = "/{name}/versions/{version}/blobs/{digest}"
BLOB_PUT = "/blobs/{digest}"


@pytest.fixture(scope="module")
def host(module_server_factory):
    return module_server_factory(HOST)


def test_a_version_sends_only_what_changed_and_a_node_fetches_it_once(host, tmp_path):
    server = host
    alice = server.make_token("alice")
    name = f"data-{uuid.uuid4().hex[:8]}"
    tag = uuid.uuid4().hex  # content no earlier run's cache holds
    folder = make_folder(tmp_path, tag)
    total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())

    first = server.cli("dataset", "create", name, "--from", str(folder), token=alice)
    assert first.exit_code == 0, first.output
    assert f"dataset {name}@1: {FILES} files, {total} bytes; {total} bytes sent" in first.output
    assert requests(server, "PUT", BLOB_PUT) == FILES

    changed = folder / "train" / "001.bin"
    changed.write_bytes(b"edited " + changed.read_bytes())
    second = server.cli(
        "dataset", "create", name, "--from", str(folder), "--parent", "1", token=alice
    )
    assert second.exit_code == 0, second.output
    size = changed.stat().st_size
    assert f"; {size} bytes sent" in second.output, second.output
    assert requests(server, "PUT", BLOB_PUT) == FILES + 1  # that file and no other
    shown = json.loads(server.cli("dataset", "show", name, "--json", token=alice).output)
    assert [(v["version"], v["parent"], v["new_size"]) for v in shown["versions"]] == [
        (1, None, total),
        (2, 1, size),
    ]

    served = requests(server, "GET", BLOB_GET)
    ids = submit_readers(server, alice, name, 2)
    outputs = []
    for task_id in ids:
        task = server.wait_state(task_id, timeout=120, token=alice)
        console = server.cli("logs", str(task_id), token=alice).output
        assert task["state"] == "completed", console
        assert task["datasets"] == [
            {"name": name, "version": 2, "time": task["datasets"][0]["time"]}
        ]
        outputs.append(json.loads(console.strip().splitlines()[-1]))
    assert outputs[0] == outputs[1] and outputs[0]["files"] == FILES
    # two tasks, one node: each file served once
    assert requests(server, "GET", BLOB_GET) - served == FILES
    show = server.cli("show", str(ids[0]), token=alice).output
    assert f"datasets:   {name}@2" in show, show
    browser = signed_in(server, alice)
    try:
        page = browser.get(f"/tasks/{ids[0]}").text
        listed_page = browser.get("/datasets").text
        dataset_page = browser.get(f"/datasets/{name}").text
    finally:
        browser.close()
    assert "Datasets read" in page and f'href="/datasets/{name}#v2">{name}@2</a>' in page
    newest = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    assert_pages_show_the_versions(listed_page, dataset_page, name, (total, newest), ids)
    assert_mcp_shows_the_versions(server, alice, name, (total, newest), size, ids)

    fetched = tmp_path / "got"
    got = server.cli("dataset", "get", name, "--version", "2", "-o", str(fetched), token=alice)
    assert got.exit_code == 0, got.output
    assert (fetched / "train" / "001.bin").read_bytes() == changed.read_bytes()
    listed = json.loads(server.cli("dataset", "ls", "--json", token=alice).output)
    assert any(d["name"] == name and d["latest"] == 2 for d in listed)


def assert_pages_show_the_versions(
    listed: str, page: str, name: str, sizes: tuple[int, int], readers: list[int]
) -> None:
    """The Datasets page lists the dataset (newest version, files, size); its page lists each
    version with a link to its parent, its files and size, its maker and the tasks that read
    it."""
    row = re.search(rf'<tr><td><a href="/datasets/{re.escape(name)}">.*?</tr>', listed)
    assert row, listed
    assert '#v2">2</a>' in row[0] and f"<td>{FILES}</td>" in row[0]
    assert f'title="{sizes[1]} bytes"' in row[0] and "<td>vision</td>" in row[0]
    versions = {v: re.search(rf'<tr id="v{v}">.*?</tr>', page, re.S) for v in (1, 2)}
    assert versions[1] and versions[2], page
    second, first = versions[2][0], versions[1][0]
    assert f"<code>{name}@2</code>" in second and '<a href="#v1">1</a>' in second
    assert f"<td>{FILES}</td>" in second and "<td>alice</td>" in second
    assert f'title="{sizes[1]} bytes"' in second
    for task_id in readers:
        assert f'<a href="/tasks/{task_id}">task {task_id}</a>' in second
    assert f'title="{sizes[0]} bytes"' in first and "/tasks/" not in first  # none read v1


def assert_mcp_shows_the_versions(
    server, token: str, name: str, sizes: tuple[int, int], added: int, readers: list[int]
) -> None:
    """list_datasets and show_dataset answer what the API does: each version's files, bytes,
    parent, maker, and the tasks that read it."""

    async def ask() -> list[tuple[bool, str]]:
        async with mcp_session(server, token) as session:
            return [
                await call(session, "list_datasets"),
                await call(session, "show_dataset", name=name),
            ]

    (listed_refused, listed), (shown_refused, shown) = asyncio.run(ask())
    assert not listed_refused and not shown_refused, (listed, shown)
    mine = [d for d in json.loads(listed) if d["name"] == name]
    assert [(d["latest"], d["files"], d["size"]) for d in mine] == [(2, FILES, sizes[1])]
    versions = json.loads(shown)["versions"]
    summary = [
        (v["version"], v["parent"], v["files"], v["new_size"], v["created_by"], v["reads"])
        for v in versions
    ]
    assert summary == [(1, None, FILES, sizes[0], "alice", 0), (2, 1, FILES, added, "alice", 2)]
    assert versions[1]["read_by"] == sorted(readers)


def api_version(server, token: str, name: str, files: dict[str, bytes]) -> None:
    """A version made as the SDK makes it: ask, send what is missing, post the manifest."""
    digests = {p: hashlib.sha256(c).hexdigest() for p, c in files.items()}
    with server.api(token) as http:
        asked = {"digests": sorted(set(digests.values()))}
        missing = set(http.post("/datasets/blobs/missing", json=asked).json()["missing"])
        for path, content in files.items():
            if digests[path] in missing:
                missing.discard(digests[path])
                assert http.put(f"/datasets/blobs/{digests[path]}", content=content).is_success
        manifest = {p: {"digest": digests[p], "size": len(c)} for p, c in files.items()}
        made = http.post(f"/datasets/{name}/versions", json={"files": manifest})
        assert made.status_code == 201, made.text


SWEEP = 8


@pytest.mark.slurm
def test_a_slurm_sweep_fetches_a_version_once_into_the_job_roots_cache(server_factory, request):
    """Tasks of a sweep on the real Slurm cluster read one version through the pool's
    cache_dir on the job root's filesystem: the server serves each of its files once."""
    cluster = request.getfixturevalue("slurm_cluster")
    job_root = open_folder(cluster.work / f"datasets-{uuid.uuid4().hex[:8]}")
    cache = open_folder(job_root / "cache")
    pool = pool_yaml("slurm", job_root, None, uv="stage", cache_dir=str(cache))
    server = server_factory(TEAMS + RESOURCE + "pools:\n" + pool.replace("  batch:", "  p:"))
    try:
        alice = server.make_token("alice")
        name = f"sweep-{uuid.uuid4().hex[:8]}"
        tag = uuid.uuid4().hex
        files = {f"f{i:02d}.txt": f"{tag} {i}\n".encode() * 100 for i in range(FILES)}
        api_version(server, alice, name, files)
        files["f00.txt"] = b"changed " + files["f00.txt"]
        api_version(server, alice, name, files)
        ids = submit_readers(server, alice, name, SWEEP)
        digests = set()
        for task_id in ids:
            task = server.wait_state(task_id, timeout=180, token=alice)
            console = server.cli("logs", str(task_id), token=alice).output
            assert task["state"] == "completed", console
            assert [d["version"] for d in task["datasets"]] == [2]
            digests.add(json.loads(console.strip().splitlines()[-1])["digest"])
        assert len(digests) == 1  # every task saw the same files
        assert requests(server, "GET", BLOB_GET) == FILES  # fetched once for the whole sweep
        assert (cache / "alice" / "datasets" / "versions" / name / "v2").is_dir()
    finally:
        remove_tree(job_root)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """moto's S3 server on a free port, as a separate process the server reaches over HTTP,
    and a bucket in it (a fixture: no script to leave running between tests)."""
    moto = shutil.which("moto_server", path=str(Path(sys.executable).parent))
    if moto is None:
        pytest.skip("moto[server] is not installed (the dev extra)")
    port = free_port()
    process = subprocess.Popen(
        [moto, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    import boto3  # the dev extra's; only this fixture needs it

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="test",
        aws_secret_access_key="test",
        region_name="us-east-1",
    )

    def up() -> bool:
        try:
            client.create_bucket(Bucket="klique-data")
        except Exception:  # noqa: BLE001 (not listening yet)
            return False
        return True

    wait_for(up, timeout=30)
    credentials = tmp_path_factory.mktemp("s3") / "credentials"
    credentials.write_text("[default]\naws_access_key_id = test\naws_secret_access_key = test\n")
    yield endpoint, credentials, client
    process.terminate()
    process.wait(timeout=10)


def test_versions_keep_their_files_in_an_s3_bucket(s3, tmp_path):
    """The estate's `datasets:` section makes the S3 store (the server's own wiring,
    broker/api/mount.py's blobs_for), and its blobs go to the bucket and back whole."""
    endpoint, credentials, bucket = s3
    estate = load_estate_text(
        HOST.replace("$JOB_ROOT", str(tmp_path))
        + f"datasets:\n  store: s3\n  endpoint: {endpoint}\n  bucket: klique-data\n"
        f"  region: us-east-1\n  credentials_file: {credentials}\n"
    )
    artifacts = ArtifactStore(None, tmp_path, max_bytes=1 << 20)
    blobs = blobs_for(estate.datasets, artifacts)
    assert isinstance(blobs, S3Blobs)
    content = uuid.uuid4().bytes * 100_000  # 1.6 MB: past one chunk, under no limit

    async def chunks():
        for start in range(0, len(content), 1 << 16):
            yield content[start : start + (1 << 16)]

    blobs.max_bytes = 1 << 30
    found, size = asyncio.run(blobs.put(chunks()))
    assert (found, size) == (hashlib.sha256(content).hexdigest(), len(content))
    keys = {o["Key"] for o in bucket.list_objects_v2(Bucket="klique-data")["Contents"]}
    assert f"sha256/{found[:2]}/{found}" in keys
    assert blobs.exists(found) and not blobs.exists("0" * 64)
    assert b"".join(blobs.read(found)) == content
    assert not (tmp_path / "artifacts" / "sha256").exists()  # nothing in the artifact store
    blobs.max_bytes = 1000
    with pytest.raises(TooLarge):
        asyncio.run(blobs.put(chunks()))


def load_estate_text(text: str):
    return parse_estate(text)
