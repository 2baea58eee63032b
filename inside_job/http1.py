"""HTTP/1.1 over a socket, in the standard library, for what the runner sends to the server: its
reports (one POST each) and its tunnel's WebSocket handshake. The standard library's own
clients (http.client, urllib.request) import its email package to parse headers: about 40 ms
of CPU in every job, more than the rest of a short task's runner. Like the tunnel, reports
go straight to the report URL (no proxy)."""

from __future__ import annotations

import socket

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Sequence, Tuple

HEADERS_LIMIT = 64 * 1024


class BadAnswer(OSError):
    """The server's answer was not an HTTP response head."""


def split_url(url: str) -> Tuple[bool, str, int, str]:
    """(tls, host, port, target) of a ws://, wss://, http:// or https:// URL."""
    scheme, _, rest = url.partition("://")
    tls = scheme in ("wss", "https")
    if scheme not in ("ws", "wss", "http", "https"):
        raise ValueError(f"not an HTTP or WebSocket URL: {url}")
    netloc, slash, path = rest.partition("/")
    host, port = netloc, 443 if tls else 80
    if netloc.startswith("["):  # [IPv6]:port
        end = netloc.index("]")
        host = netloc[1:end]
        if netloc[end + 1 :].startswith(":"):
            port = int(netloc[end + 2 :])
    elif ":" in netloc:
        host, port_text = netloc.rsplit(":", 1)
        port = int(port_text)
    return tls, host, port, slash + path if slash else "/"


def connect(tls: bool, host: str, port: int, timeout: float) -> socket.socket:
    """A connection to host:port, in TLS (verified against the system's CAs) where asked."""
    sock = socket.create_connection((host, port), timeout=timeout)
    if not tls:
        return sock
    try:
        import ssl  # only for https: about 20 ms more

        return ssl.create_default_context().wrap_socket(sock, server_hostname=host)
    except BaseException:
        sock.close()
        raise


def authority(tls: bool, host: str, port: int) -> str:
    """The Host header's value: the port only where it is not the scheme's default."""
    name = f"[{host}]" if ":" in host else host
    return name if port == (443 if tls else 80) else f"{name}:{port}"


def request_head(method: str, target: str, host: str, headers: Sequence[Tuple[str, str]]) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def read_head(sock: socket.socket) -> Tuple[int, Dict[str, str], bytes]:
    """The status and headers (names in lower case) of an answer, and the bytes read past
    them."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise BadAnswer("the connection closed before the answer's head")
        data += chunk
        if len(data) > HEADERS_LIMIT:
            raise BadAnswer("the answer's head is too large")
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split(" ", 2)[1])
    except (IndexError, ValueError):
        raise BadAnswer(f"not an HTTP answer: {lines[0][:80]!r}") from None
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, rest


def post(url: str, body: bytes, headers: Sequence[Tuple[str, str]], timeout: float) -> int:
    """POST `body` to `url` on a connection of its own; the answer's status (OSError: no
    answer)."""
    return exchange(url, body, headers, timeout)[0]


def exchange(
    url: str, body: bytes, headers: Sequence[Tuple[str, str]], timeout: float
) -> Tuple[int, bytes]:
    """POST `body` to `url` on a connection of its own; the answer's status and body (OSError:
    no answer)."""
    tls, host, port, target = split_url(url)
    with connect(tls, host, port, timeout) as sock:
        sent = [*headers, ("Content-Length", str(len(body))), ("Connection", "close")]
        sock.sendall(request_head("POST", target, authority(tls, host, port), sent) + body)
        status, answer, rest = read_head(sock)
        length = int(answer.get("content-length") or 0)
        while len(rest) < length:  # read to its end: a close with unread bytes resets
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
    return status, rest
