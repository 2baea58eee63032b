"""The site's reverse proxy, played by the tests: deploy/nginx/klique.conf run by scripts/nginx-up
(an nginx of its own, on a port of its own) in front of one test server, at https://klique.test
with routes at https://NAME.routes.klique.test, and the Chromium flags that reach it (the names
mapped to loopback, the site certificate from the test CA accepted)."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

NGINX = Path("/usr/sbin/nginx")
SCRIPTS = Path(__file__).resolve().parent.parent.parent / "scripts"
ROUTES_DOMAIN = "routes.klique.test"


@dataclass(frozen=True)
class Front:
    """nginx on `port` in front of a server: the browser's addresses for it."""

    folder: Path
    port: int  # HTTPS
    http_port: int  # plain HTTP, which only sends browsers to HTTPS
    spki: str  # the site certificate's key, as Chromium pins it

    @property
    def url(self) -> str:
        return f"https://klique.test:{self.port}"

    def route(self, name: str) -> str:
        return f"https://{name}.{ROUTES_DOMAIN}:{self.port}"

    def chromium_flags(self) -> list[str]:
        # Headless Chromium reads no CA file: the site certificate (issued by the test CA for
        # these names) is accepted by its key, and nothing else is.
        return [
            f"--host-resolver-rules=MAP klique.test 127.0.0.1, MAP *.{ROUTES_DOMAIN} 127.0.0.1",
            f"--ignore-certificate-errors-spki-list={self.spki}",
        ]


def need_nginx() -> None:
    if not NGINX.exists():
        message = "nginx is not installed (scripts/apt-deps installs it)"
        if os.environ.get("KLIQUE_REQUIRE_SERVICES") == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


def server_args(port: int) -> list[str]:
    """What `klique server` is told when nginx on `port` is in front of it, as
    deploy/nginx/klique.conf says: the routes' public address, and nginx's address believed."""
    routes = f"https://*.{ROUTES_DOMAIN}:{port}"
    return ["--routes-url", routes, "--forwarded-allow-ips", "127.0.0.1"]


@contextmanager
def nginx_front(server: Any, port: int, http_port: int) -> Iterator[Front]:
    """nginx on `port` (HTTPS) and `http_port` (the redirect) in front of `server`."""
    need_nginx()
    folder = Path(tempfile.mkdtemp(prefix="klique-nginx-"))
    env = {
        **os.environ,
        "KLIQUE_NGINX_DIR": str(folder),
        "KLIQUE_NGINX_PORT": str(port),
        "KLIQUE_NGINX_HTTP_PORT": str(http_port),
        "KLIQUE_NGINX_API": server.url.removeprefix("http://"),
        "KLIQUE_NGINX_ROUTES": server.routes_url.removeprefix("http://"),
    }
    down = [str(SCRIPTS / "nginx-down")]
    try:
        up = subprocess.run([str(SCRIPTS / "nginx-up")], env=env, capture_output=True, text=True)
        assert up.returncode == 0, f"scripts/nginx-up failed: {up.stderr}"
        yield Front(folder, port, http_port, spki_of(folder / "site.pem"))
    finally:
        subprocess.run(down, env=env, check=False, capture_output=True)


def spki_of(certificate: Path) -> str:
    """base64(sha256(SubjectPublicKeyInfo)) of a PEM certificate."""
    pipeline = (
        f"openssl x509 -in {certificate} -pubkey -noout | openssl pkey -pubin -outform der"
        " | openssl dgst -sha256 -binary | base64"
    )
    made = subprocess.run(pipeline, shell=True, check=True, capture_output=True, text=True)
    return made.stdout.strip()
