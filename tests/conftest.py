"""Shared fixtures: a Klique home, a real server on loopback, the CLI in-process."""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result

sys.path.insert(0, str(Path(__file__).parent))

from conftest_services import (  # noqa: E402, F401
    SERVICE_MARKERS,
    accounting_slurm_cluster,
    ldap_url,
    multinode_slurm_cluster,
    oidc_url,
    podman,
    postgres_url,
    services_on,
    site_slurm_cluster,
    skip_reason,
    slurm_cluster,
    sshd,
    test_users,
)

from broker.cli import main  # noqa: E402
from broker.store.repository import Store  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each file's tests stay together on one worker of a parallel run (`-n N --dist
    loadgroup`), or each instance's where the file has a parametrized module-scoped fixture
    (one server per scheduler), except that every test on the shared Slurm cluster joins one
    group, so that
    cluster sees one test at a time, as in a serial run, the tests of a private cluster (a
    `*_slurm_cluster` fixture) join its group, so that one worker starts and stops it, and a
    test marked `separate` is a group of its own.
    In a parallel run the groups go longest first (_longest_first).
    Tests of an opt-in marker are skipped, saying why in one line, unless turned on."""
    groups = {item.nodeid: _group(item) for item in items}
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[item.nodeid]))
    if hasattr(config, "workerinput"):  # a worker of a parallel run: its order is the run's
        items[:] = _longest_first(items, groups)
    if services_on():
        return
    for item in items:
        needs = [what for marker, what in SERVICE_MARKERS.items() if marker in item.keywords]
        if needs:
            item.add_marker(pytest.mark.skip(reason=skip_reason(" and ".join(needs))))


def _longest_first(items: list[pytest.Item], groups: dict[str, str]) -> list[pytest.Item]:
    """The tests, their groups in the order a parallel run should start them (scripts/run-tests
    keeps it, with --no-loadscope-reorder): the shared cluster's group, whose tests run one
    after another, then the groups with a test marked `long`, then the rest, most tests first;
    each group's tests in their own order. Each worker takes a group when it has run its last,
    so no long test is left to run alone at the end."""
    members: dict[str, list[pytest.Item]] = {}
    for item in items:
        members.setdefault(groups[item.nodeid], []).append(item)

    def rank(group: str) -> tuple[int, int]:
        tests = members[group]
        long = any(item.get_closest_marker("long") for item in tests)
        return (0 if group == "slurm-cluster" else 1 if long else 2, -len(tests))

    return [item for group in sorted(members, key=rank) for item in members[group]]


def _group(item: pytest.Item) -> str:
    if _on_shared_slurm(item):
        return "slurm-cluster"
    if item.get_closest_marker("separate"):
        return item.nodeid
    fixtures = getattr(item, "fixturenames", ())
    private = sorted(name for name in fixtures if name.endswith("_slurm_cluster"))
    if private:
        return private[0]
    return item.nodeid.split("::", 1)[0] + _module_instance(item)


def _module_instance(item: pytest.Item) -> str:
    """Which instance of the file's parametrized module-scoped fixtures the test uses ("" for
    none): the tests of one instance (one server per scheduler, say) share a worker, and the
    instances spread over the workers."""
    callspec = getattr(item, "callspec", None)
    info = getattr(item, "_fixtureinfo", None)
    if callspec is None or info is None:
        return ""
    shared = [
        f"{name}={index}"
        for name, index in sorted(callspec.indices.items())
        if any(d.scope == "module" for d in info.name2fixturedefs.get(name, ()))
    ]
    # No "]" at the end: xdist takes a group name ending with one for a test's parameters.
    return "::" + ",".join(shared) if shared else ""


def _on_shared_slurm(item: pytest.Item) -> bool:
    """The test uses the shared cluster: through the `slurm_cluster` fixture, or marked slurm
    (or chaos) without a private cluster's fixture (it asks for the cluster as it runs)."""
    fixtures = getattr(item, "fixturenames", ())
    if "slurm_cluster" in fixtures:
        return True
    marked = any(item.get_closest_marker(name) for name in ("slurm", "chaos"))
    return marked and not any(name.endswith("_slurm_cluster") for name in fixtures)


FINAL = {"completed", "failed", "cancelled", "timeout", "lost"}
# Tasks run as the mapped accounts (alice, bob), which cannot enter a private venv: their
# commands use the system's interpreter, as a task on a real node would.
TASK_PY = "/usr/bin/python3"
# A host pool's access lines: the test accounts, and a shared job root made per server.
HOST_ACCESS = "user_map: {admin: alice, alice: alice, bob: bob}\n    job_root: $JOB_ROOT"
# The same as settings, for an estate built of Python values (helpers.estates).
HOST_ACCESS_SETTINGS = {
    "user_map": {"admin": "alice", "alice": "alice", "bob": "bob"},
    "job_root": "$JOB_ROOT",
}
# Git, told to trust checkouts that another account owns (the tests' are alice's).
TRUST_CHECKOUTS = {
    "GIT_CONFIG_COUNT": "1",
    "GIT_CONFIG_KEY_0": "safe.directory",
    "GIT_CONFIG_VALUE_0": "*",
}


@pytest.fixture(scope="session")
def installed_klique(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Klique as `pip install 'klique[server]'` gives it: built as a wheel (not editable) and
    installed into a virtual environment of the system's python3 that every account can run.
    Returns the environment's bin folder."""
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    assert uv, "uv is a test dependency"
    folder = Path(tempfile.mkdtemp(prefix="klique-installed-", dir="/tmp"))
    folder.chmod(0o755)
    dist = folder / "dist"
    steps = [
        # the wheel is built from the sdist, as a package index serves it: never from a
        # stale build/ folder left in the checkout
        [uv, "build", "--out-dir", str(dist), str(ROOT)],
        [uv, "venv", "--quiet", "--python", TASK_PY, str(folder / "venv")],
    ]
    for argv in steps:
        subprocess.run(argv, check=True, capture_output=True, timeout=600)
    wheel = next(dist.glob("klique-*.whl"))
    python = folder / "venv" / "bin" / "python"
    subprocess.run(
        [uv, "pip", "install", "--quiet", "--python", str(python), f"{wheel}[server]"],
        check=True,
        capture_output=True,
        timeout=600,
    )
    subprocess.run(["chmod", "-R", "a+rX", str(folder)], check=True)
    return folder / "venv" / "bin"


def shared_folder(prefix: str = "klique-test-") -> Path:
    """A folder every account can use, with the sticky bit (like /tmp): a job root."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o1777)
    return path


# httpx builds a new SSL context for every client it makes (about 50 ms of CPU), even for plain
# HTTP; the tests make a client for each request they poll with, so they share one context.
HTTP_TLS = ssl.create_default_context()


def wait_for(
    condition: Callable[[], Any],
    timeout: float = 30.0,
    what: str = "condition",
    interval: float = 0.05,
) -> Any:
    """Poll until `condition()` is truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    url: str
    home: Path
    token: str
    process: subprocess.Popen[bytes]
    job_root: Path | None = None  # the shared job root made for `$JOB_ROOT` in its estate
    routes_url: str = ""  # the routes' own origin (the routes listener)

    def env(self, token: str | None = None) -> dict[str, str]:
        return {
            "KLIQUE_API": self.url,
            "KLIQUE_HOME": str(self.home),
            "KLIQUE_TOKEN": token or self.token,
        }

    def cli(self, *args: str, token: str | None = None, cwd: Path | None = None) -> Result:
        """Run `klique ARGS` in-process against this server."""
        runner = CliRunner()
        old = Path.cwd()
        if cwd is not None:
            os.chdir(cwd)
        try:
            return runner.invoke(main, list(args), env=self.env(token), catch_exceptions=False)
        finally:
            os.chdir(old)

    def api(self, token: str | None = None) -> httpx.Client:
        return httpx.Client(
            base_url=self.url + "/api/v1",
            timeout=30,
            verify=HTTP_TLS,
            headers={"Authorization": f"Bearer {token or self.token}"},
        )

    def task(self, task_id: int, token: str | None = None) -> dict[str, Any]:
        with self.api(token) as api:
            return api.get(f"/tasks/{task_id}").json()  # type: ignore[no-any-return]

    def wait_state(
        self,
        task_id: int,
        states: set[str] | None = None,
        timeout: float = 60.0,
        token: str | None = None,
    ) -> dict[str, Any]:
        states = states or FINAL
        found: dict[str, Any] = {}

        def reached() -> bool:
            found.update(self.task(task_id, token))
            return found["state"] in states

        try:
            wait_for(reached, timeout, f"task {task_id} to reach {sorted(states)}", interval=0.1)
        except AssertionError as exc:
            log = (self.home / "server.log").read_text()[-3000:]
            raise AssertionError(f"{exc}; last seen: {found}\nserver log:\n{log}") from None
        return found

    def make_token(self, user: str) -> str:
        with self.api() as api:
            return str(api.post("/tokens", json={"user": user}).json()["token"])


def start_server(
    home: Path,
    estate: Path | None,
    extra_env: dict[str, str] | None = None,
    extra_args: list[str] | None = None,
) -> Server:
    """A server on a free port, once it answers as itself: a free port can be taken by another
    test's server before this one binds it; then this one exits, and starts on another."""
    home.mkdir(parents=True, exist_ok=True)
    for _attempt in range(3):
        started = _start_server(home, estate, extra_env, extra_args)
        if started is not None:
            return started
    raise AssertionError(f"no free port for the server: {(home / 'server.log').read_text()}")


def _start_server(
    home: Path,
    estate: Path | None,
    extra_env: dict[str, str] | None,
    extra_args: list[str] | None = None,
) -> Server | None:
    port, routes_port = free_port(), free_port()
    args = [sys.executable, "-m", "broker", "server", "--port", str(port)]
    # The test clusters' nodes are this machine: loopback reaches the server from their jobs.
    args += ["--public-url", f"http://127.0.0.1:{port}"]
    args += ["--routes-port", str(routes_port), *(extra_args or [])]
    if estate is not None:
        args += ["--estate", str(estate)]
    env = {**os.environ, "KLIQUE_HOME": str(home), **(extra_env or {})}
    log_file = home / "server.log"
    logged = log_file.stat().st_size if log_file.exists() else 0
    with log_file.open("ab") as log:
        process = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    token_file = home / "admin.token"

    def up() -> bool:
        if process.poll() is not None:
            return True
        if not token_file.exists():
            return False
        # Asked with this home's admin token: another server on the port does not know it.
        headers = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
        try:
            answer = httpx.get(url + "/api/v1/whoami", headers=headers, timeout=1, verify=HTTP_TLS)
        except httpx.TransportError:
            return False
        return answer.status_code == 200

    wait_for(up, 60, "the server to answer")
    if process.poll() is not None:
        said = log_file.read_bytes()[logged:].decode(errors="replace")
        if "address already in use" in said.lower():
            return None
        raise AssertionError(f"server exited: {said}")
    routes_url = f"http://127.0.0.1:{routes_port}"
    return Server(url, home, token_file.read_text().strip(), process, routes_url=routes_url)


def stop_process(process: subprocess.Popen[Any], grace_s: float = 20) -> None:
    """SIGTERM, then SIGKILL if `process` has not ended within `grace_s` seconds."""
    process.terminate()
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def stop_server(server: Server) -> None:
    stop_process(server.process)


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """Servers on loopback for one test; `$JOB_ROOT` in an estate becomes a new shared job
    root."""
    with _servers(tmp_path) as make:
        yield make


@pytest.fixture(scope="module")
def module_server_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., Server]]:
    """The same, for servers that the tests of one module share where isolation is not the
    point (each start costs seconds)."""
    with _servers(tmp_path_factory.mktemp("servers")) as make:
        yield make


@contextmanager
def _servers(folder: Path) -> Iterator[Callable[..., Server]]:
    started: list[Server] = []
    roots: list[Path] = []

    def make(
        estate_text: str | None = None, server_args: Sequence[str] = (), **extra_env: str
    ) -> Server:
        home = folder / f"home{len(started)}"
        estate = job_root = None
        if estate_text is not None:
            if "$JOB_ROOT" in estate_text:
                job_root = shared_folder("klique-jobs-")
                roots.append(job_root)
                estate_text = estate_text.replace("$JOB_ROOT", str(job_root))
            estate = folder / f"estate{len(started)}.yaml"
            estate.write_text(estate_text)
        server = start_server(home, estate, extra_env, list(server_args))
        server.job_root = job_root
        started.append(server)
        return server

    try:
        yield make
    finally:
        for server in started:
            stop_server(server)
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)


HOST_ESTATE = f"""
resources:
  cpu:
    profile: {{cpus: 1, memory: 1G, walltime: 1h, pools: [local]}}
pools:
  local:
    kind: host
    slots: 4
    {HOST_ACCESS}
"""


@pytest.fixture
def host_server(server_factory: Callable[..., Server]) -> Server:
    return server_factory(HOST_ESTATE)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A new SQLite store in the test's folder, closed after the test."""
    opened = Store.open(f"sqlite:///{tmp_path / 'klique.db'}")
    yield opened
    opened.close()


def submitted_id(result: Result) -> int:
    assert result.exit_code == 0, result.output
    return int(json.loads(result.output)["id"])
