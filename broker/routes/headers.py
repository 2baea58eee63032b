"""What a route passes between the caller and the app: the request headers it drops and adds,
the response headers it keeps, the route's cookie, and where a browser says a request is from."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from broker.api.auth import CSRF_COOKIE, SESSION_COOKIE, Caller
from broker.routes.auth import COOKIE
from broker.web.session import SIGNIN_COOKIE
from inside_job import frames

Scope = MutableMapping[str, Any]

# Never forwarded to the app: one hop's headers (RFC 9110 7.6.1), the caller's credentials for
# Klique, and forwarding headers a caller could forge. The server adds its own X-Forwarded-*.
DROPPED = frames.HOP_BY_HOP | {
    "authorization",
    "origin",
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-forwarded-prefix",
    "x-real-ip",
    "x-klique-user",
}
DROPPED_BACK = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "trailer",
        "upgrade",
        "proxy-authenticate",
        "date",
        "server",
    }
)
# Pages of an endpoint, or of a session opened by someone else than its owner, get an opaque
# origin: their scripts cannot reach other routes (or the API) with the viewer's cookies.
SANDBOX = b"sandbox allow-scripts allow-forms allow-popups allow-downloads"
# Klique's own cookies: the route's, the browser session's with its CSRF token, and the web UI's
# sign-in form token. An app never sees them, and may not set them (a planted session would be
# a fixation, a planted sign-in token a login CSRF).
OUR_COOKIES = frozenset({COOKIE, SESSION_COOKIE, CSRF_COOKIE, SIGNIN_COOKIE})


def our_cookie(name: str, value: str) -> bool:
    """An app may not set (or overwrite) Klique's own cookies."""
    return name.lower() == "set-cookie" and value.split("=", 1)[0].strip() in OUR_COOKIES


def upstream_headers(scope: Scope, route: str, caller: Caller) -> list[list[str]]:
    kept: list[list[str]] = []
    for raw_name, raw_value in scope.get("headers") or []:
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        if name in DROPPED:
            continue
        if name == "cookie":
            value = without_our_cookie(value)
            if not value:
                continue
        kept.append([name, value])
    client = (scope.get("client") or ("", 0))[0]
    host = headers(scope).get("host", "")
    kept += [
        ["x-forwarded-for", str(client)],
        ["x-forwarded-host", host],
        ["x-forwarded-proto", str(scope.get("scheme") or "http").replace("ws", "http")],
        ["x-forwarded-prefix", f"/routes/{route}"],
        ["x-klique-user", caller.user],
    ]
    return kept


def without_our_cookie(header: str) -> str:
    pairs = [p.strip() for p in header.split(";")]
    return "; ".join(p for p in pairs if p and p.split("=", 1)[0].strip() not in OUR_COOKIES)


def headers(scope: Scope) -> dict[str, str]:
    """The request's headers by lower-case name (the first of repeated ones)."""
    found: dict[str, str] = {}
    for name, value in scope.get("headers") or []:
        found.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    return found


def cookies(headers: dict[str, str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for pair in headers.get("cookie", "").split(";"):
        name, _, value = pair.strip().partition("=")
        if name:
            found.setdefault(name, value)
    return found


def cross_site(headers: dict[str, str], scope: Scope) -> bool:
    """A browser says where a request comes from: Origin must be this server itself."""
    origin = headers.get("origin")
    if origin is None:
        return headers.get("sec-fetch-site") == "cross-site"
    host = headers.get("host", "")
    return origin.split("://", 1)[-1].rstrip("/") != host
