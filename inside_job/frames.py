"""The tunnel's framing: many HTTP and WebSocket streams over one WebSocket between the runner
and the server. Each WebSocket binary message is one frame:

    stream id (4 bytes, big-endian) | kind (1 byte) | payload

The server opens streams (REQUEST or WS_OPEN) and numbers them; both sides then send BODY, END,
WS_TEXT, WS_BINARY and CLOSE on them. Stream 0 carries READY (the app answers its ready path).
Used by the runner (inside_job/tunnel.py) and the server (broker/route_proxy/hub.py) alike.

Flow control (VERSION 2), as HTTP/2 and SSH channels do it: each side may have at most a
window (WINDOW_BYTES) of a stream's data (the payloads of BODY, WS_TEXT and WS_BINARY) sent and
not yet passed on by the other side; the receiver grants the bytes back with WINDOW frames as
it hands them to its consumer (the browser, the app). A WebSocket message longer than the
window may go alone, when the whole window is free. A sender past its window breaks the
protocol: the receiver closes that stream rather than hold its data.
"""

from __future__ import annotations

import json
import struct

READY = 1  # runner -> server, stream 0: the app answers; requests may come
REQUEST = 2  # server -> runner: {"method", "target", "headers": [[name, value], ...]}
BODY = 3  # either way: a piece of an HTTP body
END = 4  # either way: the HTTP body is complete
RESPONSE = 5  # runner -> server: {"status", "headers"}
WS_OPEN = 6  # server -> runner: {"target", "headers", "subprotocols"}
WS_ACCEPTED = 7  # runner -> server: {"subprotocol": name or null}
WS_TEXT = 8  # either way: a WebSocket text message (UTF-8)
WS_BINARY = 9  # either way: a WebSocket binary message
CLOSE = 10  # either way: {"code", "reason"}; the stream is over (an error, or a WebSocket close)
WINDOW = 11  # either way: 4 bytes, big-endian: that many more bytes of the stream's data may come

VERSION = 2  # READY's payload {"version"}: 2 has flow control (WINDOW)
WINDOW_BYTES = 256 * 1024  # each stream's window, each way
DATA = frozenset({BODY, WS_TEXT, WS_BINARY})  # the kinds whose payloads spend the window

# Headers that describe one hop of a connection (RFC 9110 section 7.6.1) or one WebSocket
# handshake: neither side passes them on.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "sec-websocket-key",
        "sec-websocket-version",
        "sec-websocket-extensions",
        "sec-websocket-accept",
        "sec-websocket-protocol",
    }
)
_HEAD = struct.Struct(">IB")
_INCREMENT = struct.Struct(">I")
MAX_STREAM = 2**32 - 1


def encode(stream: int, kind: int, payload: bytes = b"") -> bytes:
    return _HEAD.pack(stream, kind) + payload


def encode_json(stream: int, kind: int, doc: dict) -> bytes:
    return encode(stream, kind, json.dumps(doc).encode("utf-8"))


def decode(frame: bytes) -> tuple[int, int, bytes]:
    """(stream, kind, payload); ValueError for a frame too short to hold its head."""
    if len(frame) < _HEAD.size:
        raise ValueError("a tunnel frame shorter than its head")
    stream, kind = _HEAD.unpack_from(frame)
    return stream, kind, frame[_HEAD.size :]


def payload_json(payload: bytes) -> dict:
    """A JSON object payload; ValueError for anything else."""
    doc = json.loads(payload.decode("utf-8"))
    if not isinstance(doc, dict):
        raise ValueError("a tunnel control payload must be a JSON object")
    return doc


def encode_window(stream: int, increment: int) -> bytes:
    return encode(stream, WINDOW, _INCREMENT.pack(increment))


def window_increment(payload: bytes) -> int:
    """A WINDOW frame's increment; ValueError for a payload that is not one positive count."""
    if len(payload) != _INCREMENT.size:
        raise ValueError("a WINDOW frame carries 4 bytes")
    (increment,) = _INCREMENT.unpack(payload)
    if increment == 0:
        raise ValueError("a WINDOW frame grants at least one byte")
    return int(increment)


def ready_version(payload: bytes) -> int:
    """The version a runner's READY says (1: none, the framing before flow control)."""
    try:
        version = payload_json(payload).get("version", 1) if payload else 1
    except ValueError:
        return 1
    return version if isinstance(version, int) else 1


class SendWindow:
    """A sender's credit on one stream: what it may still send before the receiver grants more.
    A message longer than the whole window may go when all of it is free (the credit then goes
    below zero until the receiver grants that message back)."""

    def __init__(self, size: int = WINDOW_BYTES) -> None:
        self.size = size
        self.credit = size

    def allows(self, n: int) -> bool:
        """Whether a message of n bytes may go now."""
        return n <= self.credit or self.credit >= self.size

    def room(self) -> int:
        """How many bytes of a byte stream (an HTTP body) may go now: 0 means wait."""
        return max(0, self.credit)

    def spend(self, n: int) -> None:
        if not self.allows(n):
            raise ValueError(f"{n} bytes past the stream's window ({self.credit} left)")
        self.credit -= n

    def grant(self, increment: int) -> None:
        """The receiver passed on `increment` more bytes; ValueError for more than was sent."""
        if increment <= 0 or self.credit + increment > self.size:
            raise ValueError("a WINDOW frame granting more than was sent")
        self.credit += increment


class ReceiveWindow:
    """A receiver's account of one stream: bytes it holds (received, not yet passed on) and
    bytes passed on but not yet granted back. Grants go back in batches (half a window) or as
    soon as nothing is held, so that a sender waiting to send a long message is never left
    waiting for a grant that would never come."""

    def __init__(self, size: int = WINDOW_BYTES) -> None:
        self.size = size
        self.held = 0
        self.ungranted = 0

    def receive(self, n: int, message: bool = False) -> bool:
        """Take n bytes of data in; False when the sender went past its window. A `message`
        (WebSocket) may be longer than the window when it comes alone; a body's piece never."""
        outstanding = self.held + self.ungranted
        if n > self.size - outstanding and (outstanding or not message):
            return False
        self.held += n
        return True

    def passed_on(self, n: int) -> int:
        """n held bytes went to the consumer; what to grant back now (0: nothing yet)."""
        self.held -= n
        self.ungranted += n
        if self.ungranted >= self.size // 2 or (self.held == 0 and self.ungranted):
            grant, self.ungranted = self.ungranted, 0
            return grant
        return 0
