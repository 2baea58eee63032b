"""`klique server --tls-cert --tls-key`: the server serves HTTPS itself, on both listeners, with
a certificate of the test CA (scripts/test-ca); a wrong file is refused at start in one
sentence that names it."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import ROOT, free_port, wait_for


@pytest.fixture(scope="module")
def ca() -> Path:
    """The test CA's folder: ca.pem, and server.pem/server.key for 127.0.0.1 and localhost."""
    made = subprocess.run(
        [str(ROOT / "scripts" / "test-ca")], capture_output=True, text=True, check=True
    )
    return Path(made.stdout.strip())


def server_args(home: Path, *more: str) -> list[str]:
    return [sys.executable, "-m", "broker", "server", *more]


def run_server(home: Path, *more: str) -> subprocess.CompletedProcess[str]:
    """A server that is expected to refuse to start: its exit and what it said."""
    env = {**os.environ, "KLIQUE_HOME": str(home)}
    return subprocess.run(
        server_args(home, *more), env=env, capture_output=True, text=True, timeout=60, cwd=ROOT
    )


@pytest.fixture
def tls_server(ca: Path, tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    """A server over HTTPS on loopback: its API and routes URLs."""
    for attempt in range(3):
        started = start_tls_server(ca, tmp_path / f"home{attempt}")
        if started is not None:
            break
    else:
        raise AssertionError("no free ports for the server")
    process, url, routes, home = started
    try:
        yield url, routes, home
    finally:
        process.terminate()
        process.wait(30)


def start_tls_server(ca: Path, home: Path) -> tuple[subprocess.Popen[bytes], str, str, Path] | None:
    """A server once it answers over HTTPS; None when another took a free port first."""
    port, routes_port = free_port(), free_port()
    home.mkdir()
    args = ["--port", str(port), "--routes-port", str(routes_port)]
    args += ["--tls-cert", str(ca / "server.pem"), "--tls-key", str(ca / "server.key")]
    env = {**os.environ, "KLIQUE_HOME": str(home)}
    with (home / "server.log").open("wb") as log:
        process = subprocess.Popen(
            server_args(home, *args), env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT
        )
    trusting = ssl.create_default_context(cafile=str(ca / "ca.pem"))
    url = f"https://127.0.0.1:{port}"

    def up() -> bool:
        if process.poll() is not None:
            return True
        try:
            return httpx.get(f"{url}/api/v1/health", verify=trusting, timeout=2).is_success
        except httpx.TransportError:
            return False

    wait_for(up, 60, "the server to answer over HTTPS")
    if process.poll() is not None:
        said = (home / "server.log").read_text()
        if "cannot listen" in said:
            return None
        raise AssertionError(f"server exited: {said}")
    return process, url, f"https://127.0.0.1:{routes_port}", home


def test_a_client_trusting_the_ca_reaches_both_listeners_over_https(ca: Path, tls_server) -> None:
    url, routes, home = tls_server
    # The URLs the server makes from its bind address say https, for jobs and browsers alike.
    said = json.loads((home / "server.json").read_text())
    assert (said["url"], said["routes"]) == (url, routes)
    trusting = ssl.create_default_context(cafile=str(ca / "ca.pem"))
    health = httpx.get(f"{url}/api/v1/health", verify=trusting, timeout=10)
    assert health.status_code == 200, health.text
    # The routes listener speaks TLS too: its answer (sign in first) comes over HTTPS.
    route = httpx.get(f"{routes}/routes/nothing/", verify=trusting, timeout=10)
    assert route.status_code == 401 and "needs you signed in" in route.text, route.text
    # A client that does not trust the CA is refused by its own TLS check.
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{url}/api/v1/health", timeout=10)
    # Plain HTTP to the TLS port gets no HTTP answer.
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://{url.removeprefix('https://')}/api/v1/health", timeout=10)


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (["--tls-cert", "/nonexistent/site.pem", "--tls-key", "KEY"], "--tls-cert "),
        (["--tls-cert", "CERT"], "--tls-cert needs --tls-key too"),
        (["--tls-key", "KEY"], "--tls-key needs --tls-cert too"),
        (["--tls-cert", "KEY", "--tls-key", "CERT"], "do not load as a certificate and its key"),
        (["--tls-cert", "CA", "--tls-key", "KEY"], "do not load as a certificate and its key"),
        (["--tls-cert", "CERT", "--tls-key", "LOCKED"], "do not load as a certificate and its key"),
    ],
)
def test_a_wrong_certificate_or_key_is_refused_at_start(
    ca: Path, tmp_path: Path, given: list[str], said: str
) -> None:
    locked = tmp_path / "locked.key"  # the right key, encrypted: it would ask for a password
    with locked.open("wb") as out:
        subprocess.run(
            ["openssl", "pkey", "-in", str(ca / "server.key"), "-aes256", "-passout", "pass:x"],
            stdout=out,
            check=True,
        )
    files = {"CERT": ca / "server.pem", "KEY": ca / "server.key", "CA": ca / "ca.pem"}
    files["LOCKED"] = locked
    args = [str(files.get(a, a)) for a in given]
    ran = run_server(tmp_path, "--port", str(free_port()), *args)
    assert ran.returncode != 0
    assert said in ran.stderr and "fix:" in ran.stderr, ran.stderr
    if "/nonexistent" in given:
        assert "/nonexistent/site.pem does not exist" in ran.stderr
    assert not (tmp_path / "server.json").exists()  # refused before it started anything
