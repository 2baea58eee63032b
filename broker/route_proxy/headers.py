"""What a route passes between the caller and the app: the request headers it drops and adds,
the response headers it keeps, the route's cookie, and where a browser says a request is from."""

from __future__ import annotations

import re
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from broker.http.callers import Caller
from broker.http.cookies import CSRF_COOKIE, SESSION_COOKIE, SIGNIN_COOKIE
from broker.names import NAME
from broker.route_proxy.access import COOKIE
from inside_job import frames

Scope = MutableMapping[str, Any]
_NAME = re.compile(NAME.encode())

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
# What an app's answer may carry to the browser: an allow-list (a header not named here, such as
# Clear-Site-Data, Refresh, Alt-Svc, Access-Control-*, Set-Login or one not yet invented, never
# passes). Set-Cookie passes only through `kept_cookie`.
PASSED_BACK = frozenset(
    {
        "accept-ranges",
        "age",
        "allow",
        "cache-control",
        "content-disposition",
        "content-encoding",
        "content-language",
        "content-length",
        "content-range",
        "content-security-policy",
        "content-type",
        "etag",
        "expires",
        "last-modified",
        "location",
        "pragma",
        "referrer-policy",
        "retry-after",
        "set-cookie",
        "vary",
        "www-authenticate",
        "x-content-type-options",
        "x-frame-options",
    }
)
# Pages of an endpoint, or of a session opened by someone else than its owner, get an opaque
# origin: their scripts cannot reach other routes (or the API) with the viewer's cookies.
SANDBOX = b"sandbox allow-scripts allow-forms allow-popups allow-downloads"
# Klique's own cookies: the route's, the browser session's, the web UI's sign-in form token,
# and `klique_csrf`, no cookie any more but still in browsers from before. An app never sees
# them, and may set no cookie named `klique_*` (a planted session would be a fixation, a planted
# sign-in token a login CSRF).
OUR_COOKIES = frozenset({COOKIE, SESSION_COOKIE, CSRF_COOKIE, SIGNIN_COOKIE})
OUR_PREFIX = "klique_"
# RFC 6265 4.1.1: a cookie's name is an RFC 9110 token; its value cookie-octets, maybe quoted.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_VALUE = re.compile(
    r'[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*|"[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*"'
)
_ATTRIBUTE_VALUE = re.compile(r"[\x20-\x3a\x3c-\x7e]*")  # printable, no ';'
_ATTRIBUTES = frozenset(
    {"expires", "max-age", "path", "secure", "httponly", "samesite", "partitioned", "domain"}
)


@dataclass(frozen=True)
class SetCookie:
    """A Set-Cookie header, read strictly: its name, value and attributes (lower-case names)."""

    name: str
    value: str
    attributes: tuple[tuple[str, str], ...]

    def header(self) -> str:
        """Written again from what was read: nothing the parse did not understand passes."""
        parts = [f"{self.name}={self.value}"]
        parts += [f"{SPELLING[k]}={v}" if v else SPELLING[k] for k, v in self.attributes]
        return "; ".join(parts)


SPELLING = {
    "expires": "Expires",
    "max-age": "Max-Age",
    "path": "Path",
    "secure": "Secure",
    "httponly": "HttpOnly",
    "samesite": "SameSite",
    "partitioned": "Partitioned",
    "domain": "Domain",
}


def parse_set_cookie(header: str) -> SetCookie | None:
    """A Set-Cookie header as RFC 6265 4.1.1 writes one; None for anything else (a nameless
    cookie, a name or value with characters a token or cookie-octet may not hold, an attribute
    not known). http.cookies is lax (it takes `=a=b` as a cookie named `a`), browsers are too
    (RFC 6265 5.2 reads `=klique_session=X` as a cookie `klique_session`): so anything not
    plainly well formed is dropped."""
    pair, *rest = header.split(";")
    name, equals, value = pair.strip().partition("=")
    if not equals or not _TOKEN.fullmatch(name) or not _VALUE.fullmatch(value.strip()):
        return None
    attributes: list[tuple[str, str]] = []
    for item in rest:
        key, _, given = item.strip().partition("=")
        key = key.strip().lower()
        if key not in _ATTRIBUTES or not _ATTRIBUTE_VALUE.fullmatch(given.strip()):
            return None
        attributes.append((key, given.strip()))
    return SetCookie(name, value.strip(), tuple(attributes))


def kept_cookie(header: str, route: str, own_host: bool) -> str | None:
    """An app's cookie, as passed to the browser, or None when it may not be set: it must be
    well formed and named, not one of Klique's names (in any case, with any `__Host-` or
    `__Secure-` prefix), with no Domain (this host only), and a path inside the route (on a
    host of the route's own, `own_host`, every path is)."""
    cookie = parse_set_cookie(header)
    if cookie is None:
        return None
    bare = cookie.name.lower().removeprefix("__host-").removeprefix("__secure-")
    if bare.startswith(OUR_PREFIX) or bare in OUR_COOKIES:
        return None
    for key, value in cookie.attributes:
        if key == "domain":
            return None
        if key == "path" and not own_host and not inside(value, route):
            return None
    return cookie.header()


def inside(path: str, route: str) -> bool:
    """A cookie path that only the route's own requests match (RFC 6265 5.1.4)."""
    base = f"/routes/{route}"
    return path == base or path.startswith(base + "/")


def passed_back(headers: list[list[str]], route: str, own_host: bool) -> list[tuple[bytes, bytes]]:
    """The app's response headers that reach the browser (PASSED_BACK, cookies kept_cookie)."""
    out: list[tuple[bytes, bytes]] = []
    for raw_name, raw_value in headers:
        name, value = str(raw_name).lower(), str(raw_value)
        if name not in PASSED_BACK or any(c in value for c in "\r\n\x00"):
            continue
        if name == "set-cookie":
            kept = kept_cookie(value, route, own_host)
            if kept is None:
                continue
            value = kept
        out.append((name.encode("latin-1"), value.encode("latin-1", "replace")))
    return out


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


def route_name(path: bytes) -> str | None:
    """The route a raw path names (`/routes/NAME/...`), or None."""
    if not path.startswith(b"/routes/"):
        return None
    name = path[len(b"/routes/") :].split(b"/", 1)[0]
    return name.decode() if _NAME.fullmatch(name) else None


def without_credentials(query: bytes) -> str:
    """A query without `token` and `code` parameters (never passed on, nor kept in an address)."""
    pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True)
    return urlencode([(k, v) for k, v in pairs if k not in CREDENTIAL_PARAMETERS])


CREDENTIAL_PARAMETERS = frozenset({"token", "code"})


def from_another_route(headers: dict[str, str], route: str) -> bool:
    """When routes share one origin (no wildcard domain), a page of one route is same-origin
    with the others: a request that a browser says comes from this origin (Sec-Fetch-Site) must
    also say, by its Referer, that it comes from this route's own pages."""
    if headers.get("sec-fetch-site") != "same-origin":
        return False
    referer = urlsplit(headers.get("referer", ""))
    if referer.netloc and referer.netloc != headers.get("host"):
        return False  # a page of another origin (a reload keeps it): no route's page of here
    return not inside(referer.path, route)


def cross_site(headers: dict[str, str], scope: Scope) -> bool:
    """A browser says where a request comes from: Origin must be this server itself."""
    origin = headers.get("origin")
    if origin is None:
        return headers.get("sec-fetch-site") == "cross-site"
    host = headers.get("host", "")
    return origin.split("://", 1)[-1].rstrip("/") != host
