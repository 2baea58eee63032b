"""The tunnel's framing: many HTTP and WebSocket streams over one WebSocket between the runner
and the server. Each WebSocket binary message is one frame:

    stream id (4 bytes, big-endian) | kind (1 byte) | payload

The server opens streams (REQUEST or WS_OPEN) and numbers them; both sides then send BODY, END,
WS_TEXT, WS_BINARY and CLOSE on them. Stream 0 carries READY (the app answers its ready path).
Used by the runner (inside_job/tunnel.py) and the server (broker/routes/hub.py) alike.
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
