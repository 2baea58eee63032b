"""The app's side of a route: an outbound WebSocket from the job to the server (compute nodes
need no inbound port), carrying the route's HTTP requests and WebSocket streams to the app on
127.0.0.1:PORT of the node (framing in inside_job/frames.py).

One thread reads the tunnel; each stream runs in its own thread. The tunnel says READY (with the
framing's version) once the app answers its ready path, and connects again (backing off) when
the connection drops, until the app ends. Every request to the app carries the app's upstream
headers (its per-run secret): the app refuses anyone else on the node.

Each stream keeps to its window (frames.SendWindow): its thread reads the app's socket only when
the server has granted credit, so a caller that reads slowly slows the app down through TCP,
and nothing piles up here or on the server. What the server sends is granted back once written
to the app.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import queue
import threading

from inside_job import frames, wsclient
from inside_job.process import start_without_signals

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Optional, Tuple

    from inside_job.jobfiles import Console

CHUNK = 64 * 1024
PROBE_INTERVAL_S = 0.5
MAX_BACKOFF_S = 10.0


def tunnel_url(api_url: str, task_id: str) -> str:
    base = api_url.rstrip("/")
    if base.startswith("https://"):
        base = "wss://" + base[len("https://") :]
    elif base.startswith("http://"):
        base = "ws://" + base[len("http://") :]
    return f"{base}/api/v1/tasks/{task_id}/tunnel"


class Tunnel:
    """The runner's tunnel for one app run on 127.0.0.1:port."""

    def __init__(
        self,
        url: str,
        token: str,
        port: int,
        upstream_headers: Dict[str, str],
        ready_path: str,
        console: Optional[Console] = None,
        connect: Callable[..., wsclient.WebSocket] = wsclient.WebSocket.connect,
    ) -> None:
        self.url = url
        self.token = token
        self.port = port
        self.upstream = list(upstream_headers.items())
        self.ready_path = ready_path
        self.console = console
        self._connect = connect
        self._stop = threading.Event()
        self._ws: Optional[wsclient.WebSocket] = None
        self._streams: Dict[int, _Stream] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="klique-tunnel", daemon=True)
        self.ready = threading.Event()

    def start(self) -> None:
        start_without_signals(self._thread)  # and the stream threads it starts

    def stop(self) -> None:
        self._stop.set()
        ws = self._ws
        if ws is not None:
            ws.close(1001, "the app ended")
        self._thread.join(5)

    def _say(self, text: str) -> None:
        if self.console is not None:
            self.console.say(text)

    # The connection to the server.

    def _loop(self) -> None:
        delay = 0.5
        said = False
        while not self._stop.is_set():
            try:
                ws = self._connect(self.url, [("Authorization", f"Bearer {self.token}")])
            except wsclient.HandshakeError as exc:
                if exc.status in (
                    401,
                    403,
                    404,
                ):  # the task is over, or the token is not this run's
                    self._say(f"route tunnel: refused by the server ({exc})")
                    return
                self._stop.wait(delay)
                delay = min(delay * 2, MAX_BACKOFF_S)
                continue
            except OSError as exc:
                if not said:
                    self._say(f"route tunnel: cannot reach the server yet ({exc}); retrying")
                    said = True
                self._stop.wait(delay)
                delay = min(delay * 2, MAX_BACKOFF_S)
                continue
            delay, said = 0.5, False
            self._ws = ws
            try:
                self._serve(ws)
            except wsclient.Closed as exc:
                if exc.code == 1008:  # the server ended the task's route
                    self._say(f"route tunnel: closed by the server ({exc.reason})")
                    return
            finally:
                self._ws = None
                self._fail_streams()

    def _serve(self, ws: wsclient.WebSocket) -> None:
        if self._probe():
            ws.send_binary(frames.encode_json(0, frames.READY, {"version": frames.VERSION}))
            if not self.ready.is_set():
                self._say("route tunnel: the app answers; its route is open")
            self.ready.set()
        while not self._stop.is_set():
            opcode, data = ws.recv()
            if opcode != wsclient.BINARY:
                continue
            try:
                stream, kind, payload = frames.decode(data)
            except ValueError:
                continue
            self._dispatch(ws, stream, kind, payload)

    def _probe(self) -> bool:
        """Wait until the app answers its ready path (below 500); False when stopped."""
        while not self._stop.is_set():
            try:
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                connection.request("GET", self.ready_path, headers=dict(self.upstream))
                status = connection.getresponse().status
                connection.close()
                if status < 500:
                    return True
            except (OSError, http.client.HTTPException):
                pass
            self._stop.wait(PROBE_INTERVAL_S)
        return False

    def _dispatch(self, ws: wsclient.WebSocket, stream: int, kind: int, payload: bytes) -> None:
        if kind in (frames.REQUEST, frames.WS_OPEN):
            opened = _Stream(stream)
            with self._lock:
                self._streams[stream] = opened
            target = _http_stream if kind == frames.REQUEST else _ws_stream
            worker = threading.Thread(
                target=self._run_stream,
                args=(target, ws, opened, payload),
                name=f"klique-stream-{stream}",
                daemon=True,
            )
            worker.start()
            return
        with self._lock:
            found = self._streams.get(stream)
        if found is None:
            return
        problem = found.hold(kind, payload)
        if problem:
            _send_close(ws, stream, 1008, problem)

    def _run_stream(self, target, ws, stream, payload) -> None:
        try:
            target(ws, stream, payload, self.port, self.upstream)
        except Exception as exc:  # one stream's failure never ends the tunnel
            _send_close(ws, stream.id, 1011, str(exc)[:200])
        finally:
            stream.end()
            with self._lock:
                self._streams.pop(stream.id, None)

    def _fail_streams(self) -> None:
        with self._lock:
            streams = list(self._streams.values())
        for stream in streams:
            stream.end(b'{"code": 1001, "reason": "the tunnel dropped"}')


class _Stream:
    """One stream on the runner's side: the server's frames for its thread (at most a window of
    data), and its credit for sending the app's data to the server."""

    def __init__(self, stream: int) -> None:
        self.id = stream
        self.inbox: queue.Queue = queue.Queue()
        self.received = frames.ReceiveWindow()
        self.sending = frames.SendWindow()
        self.closed = False
        self._changed = threading.Condition()

    def hold(self, kind: int, payload: bytes) -> str:
        """Take a frame from the tunnel's reader, never waiting; why the stream must close
        instead ("" when it need not)."""
        with self._changed:
            if self.closed:
                return ""
            if kind == frames.WINDOW:
                try:
                    self.sending.grant(frames.window_increment(payload))
                except ValueError as exc:
                    problem = str(exc)
                else:
                    self._changed.notify_all()
                    return ""
            elif kind in frames.DATA and not self.received.receive(
                len(payload), message=kind != frames.BODY
            ):
                problem = "the server sent past the stream's window"
            else:
                self.inbox.put((kind, payload))
                if kind == frames.CLOSE:
                    self.closed = True
                    self._changed.notify_all()
                return ""
        self.end(json.dumps({"code": 1008, "reason": problem}).encode())
        return problem

    def end(self, why: Optional[bytes] = None) -> None:
        """No more frames; `why` (a CLOSE payload) tells the stream's thread so."""
        with self._changed:
            if why is not None and not self.closed:
                self.inbox.put((frames.CLOSE, why))
            self.closed = True
            self._changed.notify_all()

    def room(self, most: int) -> int:
        """Wait until some of the window is free: how many bytes may be read from the app
        now (at most `most`); 0 when the stream is over."""
        with self._changed:
            while not self.closed and not self.sending.room():
                self._changed.wait()
            return 0 if self.closed else min(most, self.sending.room())

    def spend(self, n: int) -> bool:
        """Wait until a message of n bytes may go, and count it; False when the stream is over."""
        with self._changed:
            while not self.closed and not self.sending.allows(n):
                self._changed.wait()
            if self.closed:
                return False
            self.sending.spend(n)
            return True

    def passed_on(self, ws: wsclient.WebSocket, n: int) -> None:
        """n bytes from the server reached the app: grant them back."""
        with self._changed:
            grant = self.received.passed_on(n)
        if grant:
            _send(ws, frames.encode_window(self.id, grant))


def _send(ws: wsclient.WebSocket, frame: bytes) -> None:
    ws.send_binary(frame)


def _send_close(ws: wsclient.WebSocket, stream: int, code: int, reason: str) -> None:
    with contextlib.suppress(OSError):
        _send(ws, frames.encode_json(stream, frames.CLOSE, {"code": code, "reason": reason}))


def _headers(doc: dict, upstream: List[Tuple[str, str]]) -> List[Tuple[str, str]]:
    """The request's headers for the app: hop-by-hop ones dropped, the app's own secret added."""
    names = {name.lower() for name, _ in upstream}
    kept = [
        (str(n), str(v))
        for n, v in doc.get("headers") or []
        if str(n).lower() not in frames.HOP_BY_HOP and str(n).lower() not in names
    ]
    return kept + upstream


def _http_stream(ws, stream, payload, port, upstream) -> None:
    """The request to the app as its body streams in (chunked when its length is not known),
    then the app's answer, read as the server grants credit."""
    doc = frames.payload_json(payload)
    length = doc.get("length")
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    try:
        connection.putrequest(str(doc["method"]), str(doc["target"]), skip_accept_encoding=True)
        for name, value in _headers(doc, upstream):
            connection.putheader(name, value)
        if isinstance(length, int):
            connection.putheader("Content-Length", str(length))
        else:
            connection.putheader("Transfer-Encoding", "chunked")
        connection.endheaders()
        if not _send_body(ws, stream, connection, chunked=not isinstance(length, int)):
            return
        response = connection.getresponse()
        _send(ws, frames.encode_json(stream.id, frames.RESPONSE, _response_head(response)))
        while True:
            room = stream.room(CHUNK)
            if not room:
                return  # the server closed the stream (its caller went away)
            chunk = response.read1(room)
            if not chunk:
                break
            stream.spend(len(chunk))
            _send(ws, frames.encode(stream.id, frames.BODY, chunk))
        _send(ws, frames.encode(stream.id, frames.END))
    finally:
        connection.close()


def _send_body(ws, stream, connection: http.client.HTTPConnection, chunked: bool) -> bool:
    """The server's BODY pieces to the app, each granted back once written; False when the
    stream closed before END."""
    while True:
        kind, data = stream.inbox.get()
        if kind == frames.BODY:
            if data:
                connection.send(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
            stream.passed_on(ws, len(data))
        elif kind == frames.END:
            if chunked:
                connection.send(b"0\r\n\r\n")
            return True
        elif kind == frames.CLOSE:
            return False


def _response_head(response: http.client.HTTPResponse) -> dict:
    """Status and headers for the server; a length is kept when the body was not chunked
    (http.client has already undone the chunking)."""
    headers = [[n, v] for n, v in response.getheaders() if n.lower() not in frames.HOP_BY_HOP]
    length = response.getheader("Content-Length")
    if length is not None and response.getheader("Transfer-Encoding") is None:
        headers.append(["Content-Length", length])
    return {"status": response.status, "headers": headers}


def _ws_stream(ws, stream, payload, port, upstream) -> None:
    doc = frames.payload_json(payload)
    try:
        local = wsclient.WebSocket.connect(
            f"ws://127.0.0.1:{port}{doc['target']}",
            _headers(doc, upstream),
            [str(p) for p in doc.get("subprotocols") or []],
        )
    except OSError as exc:
        _send_close(ws, stream.id, 1011, f"the app refused the WebSocket: {exc}")
        return
    accepted = {"subprotocol": local.subprotocol}
    _send(ws, frames.encode_json(stream.id, frames.WS_ACCEPTED, accepted))
    pump = threading.Thread(target=_from_server, args=(ws, local, stream), daemon=True)
    pump.start()
    try:
        while True:
            opcode, data = local.recv()  # the next only once this one had credit
            kind = frames.WS_TEXT if opcode == wsclient.TEXT else frames.WS_BINARY
            if not stream.spend(len(data)):
                return
            _send(ws, frames.encode(stream.id, kind, data))
    except wsclient.Closed as exc:
        code = exc.code if exc.code not in (1005, 1006) else 1000
        _send_close(ws, stream.id, code, exc.reason)
    finally:
        stream.end(b"{}")
        local.close()


def _from_server(ws: wsclient.WebSocket, local: wsclient.WebSocket, stream: _Stream) -> None:
    """The server's messages on this stream, to the app, until either side closes."""
    while True:
        kind, data = stream.inbox.get()
        try:
            if kind == frames.WS_TEXT:
                local.send(wsclient.TEXT, data)
            elif kind == frames.WS_BINARY:
                local.send(wsclient.BINARY, data)
            elif kind == frames.CLOSE:
                code = _close_code(data)
                local.close(code)
                return
            if kind in frames.DATA:
                stream.passed_on(ws, len(data))
        except OSError:
            return


def _close_code(data: bytes) -> int:
    try:
        code = int(json.loads(data.decode("utf-8") or "{}").get("code") or 1000)
    except (ValueError, AttributeError):
        return 1000
    return code if 1000 <= code < 5000 and code not in (1005, 1006, 1015) else 1000
