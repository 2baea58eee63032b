"""A WebSocket client (RFC 6455) in the standard library: the handshake, masked frames out,
fragmented messages in, ping answered with pong, close. The runner uses it for its tunnel to the
server and for WebSocket streams to the app on the node. No extensions (no compression)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import socket
import struct
import threading

from inside_job import http1

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Optional, Sequence, Tuple

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 section 1.3
CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
MAX_MESSAGE = 64 * 1024 * 1024


class HandshakeError(OSError):
    """The server did not switch protocols; `status` is its HTTP status (0: no answer)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class Closed(OSError):
    """The connection is closed: `code` and `reason` from the peer's close frame (1006: none)."""

    def __init__(self, code: int = 1006, reason: str = "") -> None:
        super().__init__(f"websocket closed ({code} {reason})".strip())
        self.code = code
        self.reason = reason


def accept_key(key: str) -> str:
    return base64.b64encode(
        hashlib.sha1(key.encode("ascii") + GUID).digest()  # noqa: S324 - RFC 6455 names SHA-1
    ).decode("ascii")


class WebSocket:
    """One client connection. send() may be called from several threads; recv() from one."""

    def __init__(self, sock: socket.socket, buffered: bytes = b"", subprotocol: str | None = None):
        self.sock = sock
        self.subprotocol = subprotocol
        self._buffer = bytearray(buffered)
        self._send_lock = threading.Lock()
        self.closed = False

    @classmethod
    def connect(
        cls,
        url: str,
        headers: Sequence[Tuple[str, str]] = (),
        subprotocols: Sequence[str] = (),
        timeout: float = 10.0,
    ) -> WebSocket:
        tls, host, port, target = http1.split_url(url)
        sock = http1.connect(tls, host, port, timeout)
        try:
            key = base64.b64encode(os.urandom(16)).decode("ascii")
            sent = [
                ("Upgrade", "websocket"),
                ("Connection", "Upgrade"),
                ("Sec-WebSocket-Key", key),
                ("Sec-WebSocket-Version", "13"),
            ]
            if subprotocols:
                sent.append(("Sec-WebSocket-Protocol", ", ".join(subprotocols)))
            host_header = http1.authority(tls, host, port)
            sock.sendall(http1.request_head("GET", target, host_header, [*sent, *headers]))
            try:
                status, answer, rest = http1.read_head(sock)
            except http1.BadAnswer as exc:
                raise HandshakeError(str(exc)) from None
            if status != 101:
                raise HandshakeError(f"the server answered {status} instead of 101", status)
            if answer.get("sec-websocket-accept") != accept_key(key):
                raise HandshakeError("the server's Sec-WebSocket-Accept does not match", status)
            sock.settimeout(None)
            return cls(sock, rest, answer.get("sec-websocket-protocol"))
        except BaseException:
            sock.close()
            raise

    # Sending.

    def send(self, opcode: int, data: bytes = b"") -> None:
        head = bytearray([0x80 | opcode])
        size = len(data)
        if size < 126:
            head.append(0x80 | size)
        elif size < 1 << 16:
            head.append(0x80 | 126)
            head += struct.pack(">H", size)
        else:
            head.append(0x80 | 127)
            head += struct.pack(">Q", size)
        mask = os.urandom(4)
        with self._send_lock:
            if self.closed and opcode != CLOSE:
                raise Closed()
            self.sock.sendall(bytes(head) + mask + _masked(data, mask))

    def send_text(self, text: str) -> None:
        self.send(TEXT, text.encode("utf-8"))

    def send_binary(self, data: bytes) -> None:
        self.send(BINARY, data)

    def close(self, code: int = 1000, reason: str = "") -> None:
        """Send a close frame (once) and shut the socket."""
        if not self.closed:
            with contextlib.suppress(OSError):
                self.send(CLOSE, struct.pack(">H", code) + reason.encode("utf-8")[:120])
            self.closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()

    # Receiving.

    def recv(self) -> Tuple[int, bytes]:
        """The next whole message: (TEXT or BINARY, data); Closed when the connection ends."""
        kind: Optional[int] = None
        parts: List[bytes] = []
        size = 0
        while True:
            fin, opcode, data = self._frame()
            if opcode == PING:
                self.send(PONG, data)
                continue
            if opcode == PONG:
                continue
            if opcode == CLOSE:
                code = struct.unpack(">H", data[:2])[0] if len(data) >= 2 else 1005
                self.close(code if code not in (1005, 1006) else 1000)
                raise Closed(code, data[2:].decode("utf-8", "replace"))
            if opcode != CONTINUATION:
                kind = opcode
            size += len(data)
            if size > MAX_MESSAGE:
                self.close(1009, "message too big")
                raise Closed(1009, "message too big")
            parts.append(data)
            if fin and kind is not None:
                return kind, b"".join(parts)

    def _frame(self) -> Tuple[bool, int, bytes]:
        head = self._read(2)
        fin, opcode = bool(head[0] & 0x80), head[0] & 0x0F
        masked, size = bool(head[1] & 0x80), head[1] & 0x7F
        if size == 126:
            size = struct.unpack(">H", self._read(2))[0]
        elif size == 127:
            size = struct.unpack(">Q", self._read(8))[0]
        if size > MAX_MESSAGE:
            self.close(1009, "frame too big")
            raise Closed(1009, "frame too big")
        mask = self._read(4) if masked else b""
        data = self._read(size)
        return fin, opcode, _masked(data, mask) if masked else data

    def _read(self, n: int) -> bytes:
        while len(self._buffer) < n:
            try:
                chunk = self.sock.recv(max(65536, n - len(self._buffer)))
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                raise Closed()
            self._buffer += chunk
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data


def _masked(data: bytes, mask: bytes) -> bytes:
    """data XOR the repeated 4-byte mask, computed as one big integer (fast in CPython)."""
    if not data:
        return b""
    n = len(data)
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")
