"""`klique server`: the API, the scheduler cycle and the pool agents in one process, on two
listeners: the UI and API on one, routes on the other (an origin of their own:
broker/route_proxy/origin.py). On PostgreSQL, two or more servers are replicas: each serves
the API, the web UI, MCP and routes, and the one holding the scheduler's lease runs the cycle
and the in-server agents (broker/control/lease.py)."""

from __future__ import annotations

import asyncio
import fcntl
import ipaddress
import json
import logging
import os
import pwd
import socket
import ssl
import urllib.parse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from broker.agents.factory import build_drivers, driver_context
from broker.app import create_app
from broker.config import write_private
from broker.control.lease import TTL_S, Leadership
from broker.control.loop import ControlLoop
from broker.domain import Estate
from broker.pools.settings import serves_remotely
from broker.route_proxy.origin import RoutesOrigin, RoutesPlace, Split, routes_place
from broker.store.identity import IdentityStore
from broker.store.leases import LeaseStore, lease_engine
from broker.store.notify import ChangeListener
from broker.store.repository import Store
from broker.tasks.tuner import Tuner

log = logging.getLogger("klique.server")


def admin_user() -> str:
    """The first admin: the account running the server (whose tasks a host pool without a user
    map runs), or `admin` when that is root (which runs no task)."""
    name = pwd.getpwuid(os.geteuid()).pw_name
    return "admin" if os.geteuid() == 0 else name


def ensure_admin_token(store: Store, home: Path) -> Path | None:
    """At first start, make an admin token, in a file readable by this account only."""
    path = home / "admin.token"
    identities = IdentityStore(store)
    if identities.has_admin():
        return None
    token, _ = identities.add_token(admin_user(), kind="admin")
    write_private(path, token + "\n")
    return path


def private_home(home: Path) -> None:
    """The server's home holds the database, tokens and consoles: this account's alone."""
    os.umask(0o077)  # every file the server creates is private, the database included
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    if home.stat().st_uid == os.geteuid():
        home.chmod(0o700)


def build_app(
    estate: Estate,
    store: Store,
    home: Path,
    api_url: str,
    interval_s: float = 0.5,
    leadership: Leadership | None = None,
) -> FastAPI:
    """The app and its control loop; with `leadership` (replicas on PostgreSQL), the loop leads
    only while this replica holds the lease."""
    drivers = build_drivers(estate, driver_context(estate, home, api_url))
    control = ControlLoop(
        store, estate, drivers, home, interval_s=interval_s, leadership=leadership
    )
    # Other replicas' writes, heard at once: a task created on a follower is placed here.
    listener = ChangeListener(store.url, store.changes, control.heard) if store.announces else None

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        stop = asyncio.Event()
        if listener is not None:
            listener.start()
        loop_task = asyncio.create_task(control.run(stop))
        # Tunings advance on the replica that leads (broker/tasks/tuner.py).
        tuner_task = asyncio.create_task(Tuner(control).run(stop, control.leads))
        try:
            yield
        finally:
            stop.set()
            await loop_task
            await tuner_task
            if listener is not None:
                await asyncio.to_thread(listener.stop)
            for driver in drivers.values():
                await driver.close()
            if leadership is not None:
                leadership.leases.close()
            store.close()

    return create_app(control, lifespan, os.environ.get("KLIQUE_PUBLIC_URL") or api_url)


def replica_id(given: str | None, port: int) -> str:
    """--replica-id, else HOST:PORT: unique among live servers (a port is one process's), and
    the same after a restart, which then takes its lease back without waiting it out."""
    return given or f"{socket.gethostname()}:{port}"


def leadership_of(store: Store, replica: str, ttl_s: float) -> Leadership | None:
    """The scheduler's lease on PostgreSQL; on SQLite, which serves one server, None (this one
    leads for life) once no other server has the file."""
    if store.announces:
        return Leadership(LeaseStore(lease_engine(store.url, ttl_s / 2)), replica, ttl_s)
    sole_server(store)
    return None


_HELD: list[int] = []  # the SQLite lock's open file, held for the process's life


def sole_server(store: Store) -> None:
    """Refuse a second server on one SQLite file, in one sentence: SQLite serves one server
    (another would not hear its changes). An OS lock, dropped by the kernel when the process
    ends, however it ends: a restart after a crash never waits."""
    database = store.engine.url.database or ""
    if database in ("", ":memory:"):
        return
    handle = os.open(database + ".server-lock", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(handle)
        raise SystemExit(
            f"klique: another klique server serves the SQLite store {database}; SQLite serves "
            "one server: stop that one, or give every replica one PostgreSQL store (KLIQUE_DB)"
        ) from None
    _HELD.append(handle)


def listener(host: str, port: int) -> socket.socket:
    """A bound socket for uvicorn; one sentence and exit 1 when the address cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)  # here, not in uvicorn: a port in use is known before the start
    except OSError as exc:
        sock.close()
        raise SystemExit(
            f"klique: cannot listen on {host}:{port} ({exc.strerror or exc}); "
            "choose another with --port or --routes-port"
        ) from None
    sock.set_inheritable(True)
    return sock


def remote_pools(estate: Estate) -> list[str]:
    """Pools whose tasks run on nodes other than this host: every batch and Kubernetes pool,
    and a host pool served by `klique agent` on another machine."""
    return [name for name, p in estate.pools.items() if p.kind != "host" or serves_remotely(p)]


def reaches_nothing(url: str, stated: bool) -> bool:
    """Whether other nodes cannot reach `url`: it names no host (0.0.0.0, ::), or loopback
    when nobody stated it (a stated loopback URL says the nodes are this host: a cluster on
    one machine)."""
    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host == "localhost" and not stated  # a name: the site's DNS decides
    return address.is_unspecified or (address.is_loopback and not stated)


def public_url(
    estate: Estate, host: str, port: int, given: str | None = None, scheme: str = "http"
) -> str:
    """The URL jobs, pods, agents and browsers use: --public-url, else the estate's
    server.public_url, else the bind address (right only while every task runs here) with
    `scheme` (https when the server serves TLS itself). A URL that no other node can reach is
    refused while some pool's nodes are elsewhere: their jobs would start and then fail at their
    first call."""
    bind_host = f"[{host}]" if ":" in host else host
    stated = given or estate.public_url
    url = (stated or f"{scheme}://{bind_host}:{port}").rstrip("/")
    elsewhere = remote_pools(estate)
    if elsewhere and reaches_nothing(url, bool(stated)):
        raise ValueError(
            f"jobs of pool {elsewhere[0]} run on other nodes and cannot reach {url}; fix: set "
            "server.public_url in the estate (or --public-url) to a URL they reach, such as "
            f"http://{socket.getfqdn()}:{port}"
        )
    return url


@dataclass(frozen=True)
class Tls:
    """The site's certificate (PEM, with its chain) and its private key, for both listeners."""

    cert: Path
    key: Path


def tls_files(cert: str | None, key: str | None) -> Tls | None:
    """--tls-cert and --tls-key as a pair that loads, checked before anything starts: a wrong
    file is one sentence at start, not a handshake that fails for every browser later."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        given, missing = ("--tls-cert", "--tls-key") if key is None else ("--tls-key", "--tls-cert")
        raise ValueError(f"{given} needs {missing} too; fix: give both, or neither for HTTP")
    for option, path in (("--tls-cert", cert), ("--tls-key", key)):
        if not os.access(path, os.R_OK):
            why = "cannot be read by this account" if os.path.exists(path) else "does not exist"
            raise ValueError(
                f"{option} {path} {why}; fix: give the PEM file's path, readable by the "
                "account the server runs as"
            )
    try:
        # An encrypted key would make OpenSSL ask on the terminal: refused here instead.
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key, password=lambda: b"")
    except (ssl.SSLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc.strerror or exc
        raise ValueError(
            f"--tls-cert {cert} and --tls-key {key} do not load as a certificate and its key "
            f"({reason}); fix: give the PEM certificate (chain first-to-last) and the "
            "unencrypted private key it was issued for"
        ) from None
    return Tls(Path(cert), Path(key))


def split_app(app: FastAPI, place: RoutesPlace) -> Split:
    """The UI's and API's app on its port, the routes' origin on the routes port."""
    app.state.routes_place = place
    routes = RoutesOrigin(app.state.route_proxy, lambda: app.state.routes_place)
    return Split(app, routes, place.port)


def serve(
    estate: Estate,
    home: Path,
    db_url: str,
    host: str,
    port: int,
    routes_port: int | None = None,
    routes_domain: str | None = None,
    routes_url: str | None = None,
    *,
    trusted_proxies: str | None = None,
    public: str | None = None,
    tls: Tls | None = None,
    json_logs: bool = False,
    replica: str | None = None,
    lease_ttl_s: float = TTL_S,
) -> None:
    """Serve until stopped; over HTTPS on both listeners with `tls`. `trusted_proxies` names
    the reverse proxies whose forwarding headers are believed; without it, a caller's address
    is its socket's own (uvicorn would otherwise believe any local account's X-Forwarded-For,
    and the login throttle's count per address with it). `public`: the URL others reach this
    server at (--public-url). `json_logs`: every line on standard error is a JSON log event
    (broker/logs.py), uvicorn's included; the start's words are events too. `replica`: this
    replica's id (--replica-id); `lease_ttl_s`: how long the scheduler's lease holds unrenewed
    (--lease-ttl)."""
    say = log.info if json_logs else lambda words: print(words, flush=True)
    scheme = "https" if tls else "http"
    try:
        place = routes_place(
            host, port, routes_port or port + 1, routes_domain, routes_url, scheme=scheme
        )
        api_url = public_url(estate, host, port, public, scheme=scheme)
    except ValueError as exc:
        raise SystemExit(f"klique: {exc}") from None
    sockets = [listener(host, port), listener(host, place.port)]
    private_home(home)
    store = Store.open(db_url)
    token_path = ensure_admin_token(store, home)
    if token_path is not None:
        say(
            f"klique: admin token written to {token_path} "
            f"(run: klique login --token $(cat {token_path}))"
        )
    leadership = leadership_of(store, replica_id(replica, port), lease_ttl_s)
    app = build_app(estate, store, home, api_url, leadership=leadership)
    write_private(
        home / "server.json",
        json.dumps(
            {"url": api_url, "routes": place.url, "pid": os.getpid(), "estate": estate.source}
        ),
    )
    say(
        f"klique: serving {api_url} (estate {estate.source}, {len(estate.pools)} pools); "
        f"routes at {place.address('NAME')}"
    )
    # Live pages hold their event streams open: a stop waits this long for them, then ends them.
    config = uvicorn.Config(
        split_app(app, place),
        http="httptools",
        log_level="warning",
        log_config=None if json_logs else uvicorn.config.LOGGING_CONFIG,  # None: the root's
        timeout_graceful_shutdown=5,
        proxy_headers=trusted_proxies is not None,
        forwarded_allow_ips=trusted_proxies,
        ssl_certfile=tls.cert if tls else None,
        ssl_keyfile=tls.key if tls else None,
    )
    uvicorn.Server(config).run(sockets=sockets)
