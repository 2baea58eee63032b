"""The server's image (deploy/Containerfile), built with Podman from this checkout's wheel and
run against the test PostgreSQL: it answers its health check and runs as an account that is not
root. No registry is reachable here, so the image's base is made from the tests' Python image
with the server's dependencies copied in, and pip installs the wheel with `--no-index`."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import httpx
import pytest
import sqlalchemy
from conftest import ROOT
from packaging.requirements import Requirement

from broker.store import migrate
from broker.store.engine import normalise_url

pytestmark = [pytest.mark.podman, pytest.mark.postgres, pytest.mark.long]

BASE = "localhost/klique-server-base:test"
IMAGE = "localhost/klique-server:test"
EXTRAS = {"server", "postgres"}
# Debian marks its python3 as managed by apt (PEP 668); the python:3.11-slim image, the
# Containerfile's default base, does not.
BASE_FILE = """FROM {python}
COPY overlay/ /
RUN rm -f /usr/lib/python3*/EXTERNALLY-MANAGED
"""


def _closure() -> set[str]:
    """The distributions `klique[server,postgres]` needs, as installed in this environment."""
    found: set[str] = set()
    todo = [("klique", frozenset(EXTRAS))]
    while todo:
        name, extras = todo.pop()
        dist = metadata.distribution(name)
        if name != "klique":
            found.add(dist.metadata["Name"])
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker and not any(req.marker.evaluate({"extra": e}) for e in {"", *extras}):
                continue
            if req.name.lower() != "klique" and req.name not in found:
                todo.append((req.name, frozenset(req.extras)))
    return found


def _overlay(dest: Path) -> None:
    """The closure and pip as files under /usr/local/lib/python3.11/dist-packages, with the
    shared libraries their extension modules load."""
    site = Path(sysconfig.get_paths()["purelib"])
    target = dest / "usr/local/lib/python3.11/dist-packages"
    libraries: set[str] = set()
    for name in _closure() | {"pip"}:
        for file in metadata.distribution(name).files or []:
            if str(file).startswith(".."):  # console scripts: pip writes the image's own
                continue
            source = site / file
            if source.is_file():
                (target / file).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target / file)
                if source.suffix == ".so" or ".so." in source.name:
                    libraries |= _system_libraries(source)
    for library in libraries:
        copy = dest / library.lstrip("/")
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(library, copy)


def _system_libraries(binary: Path) -> set[str]:
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
    return {
        parts[2]
        for parts in (line.split() for line in out.splitlines())
        if "=>" in parts and len(parts) > 2 and parts[2].startswith(("/lib", "/usr/lib"))
    }


def _build(podman, argv: list[str]) -> None:
    done = subprocess.run(
        ["podman", "build", *podman.run_args, "--network=host", *argv],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.fixture(scope="module")
def image(podman) -> Iterator[str]:
    with tempfile.TemporaryDirectory() as work:
        base = Path(work) / "base"
        _overlay(base / "overlay")
        (base / "Containerfile").write_text(BASE_FILE.format(python=podman.image))
        _build(podman, ["--tag", BASE, str(base)])
        uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
        assert uv, "uv is a test dependency"
        context = Path(work) / "context"
        subprocess.run(
            [uv, "build", "--wheel", "--out-dir", str(context / "dist"), str(ROOT)],
            check=True,
            capture_output=True,
            timeout=600,
        )
        _build(
            podman,
            [
                "--file",
                str(ROOT / "deploy" / "Containerfile"),
                "--build-arg",
                f"BASE={BASE}",
                "--build-arg",
                "PIP_OPTIONS=--no-index",
                "--tag",
                IMAGE,
                str(context),
            ],
        )
    yield IMAGE
    subprocess.run(["podman", "rmi", "--force", IMAGE, BASE], capture_output=True, check=False)


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.fixture
def database(postgres_url) -> Iterator[str]:
    """A schema of the test's own on the test PostgreSQL server: its URL."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    engine = sqlalchemy.create_engine(normalise_url(postgres_url))
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
    engine.dispose()
    yield f"{postgres_url}?options=-csearch_path%3D{schema}"


def test_the_image_serves_the_api_as_an_account_that_is_not_root(podman, image, database):
    api, routes = _free_ports(2)
    name = f"klique-server-{uuid.uuid4().hex[:8]}"
    run = [
        "podman",
        "run",
        "--detach",
        "--name",
        name,
        *podman.run_args,
        "--network=host",  # the test PostgreSQL listens on this host's loopback
        "--env",
        f"KLIQUE_DB={database}",
        image,
        "--host",
        "127.0.0.1",
        "--port",
        str(api),
        "--routes-port",
        str(routes),
    ]
    started = subprocess.run(run, capture_output=True, text=True, check=False)
    assert started.returncode == 0, started.stderr
    try:
        health = _wait_healthy(f"http://127.0.0.1:{api}/api/v1/health", name)
        assert health.status_code == 200, health.text
        status = subprocess.run(
            ["podman", "exec", name, "cat", "/proc/1/status"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
        assert uids == ["10001"] * 4, status  # real, effective, saved, file-system
        command = subprocess.run(
            ["podman", "exec", name, "cat", "/proc/1/cmdline"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\0")
        assert "server" in command, command
        engine = sqlalchemy.create_engine(normalise_url(database))
        assert migrate.current(engine) == migrate.head()  # the store is PostgreSQL's, outside
        engine.dispose()
    finally:
        subprocess.run(["podman", "rm", "--force", name], capture_output=True, check=False)


def _wait_healthy(url: str, container: str) -> httpx.Response:
    deadline = time.monotonic() + 120
    while True:
        try:
            return httpx.get(url, timeout=5)
        except httpx.TransportError:
            if time.monotonic() > deadline:
                logs = subprocess.run(
                    ["podman", "logs", container], capture_output=True, text=True, check=False
                )
                pytest.fail(f"no answer from {url} in 120 s; the server said:\n{logs.stderr}")
            running = subprocess.run(
                ["podman", "inspect", "--format", "{{.State.Running}}", container],
                capture_output=True,
                text=True,
                check=False,
            )
            if running.stdout.strip() == "false":
                logs = subprocess.run(
                    ["podman", "logs", container], capture_output=True, text=True, check=False
                )
                pytest.fail(f"the server stopped:\n{logs.stdout}{logs.stderr}")
            time.sleep(0.5)
