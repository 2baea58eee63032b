"""Best-effort HTTP reports: the newest state, console chunks and scalars sent from byte offsets
(so a resend is idempotent), and the exit; the files stay the truth, failures only back off.
A start goes START_GRACE_S after it happens, the end at once, and what piles up meanwhile
(console, scalars, the newest state) every INTERVAL_S; a task that ends within its start's grace
takes one request for its whole life: setting up, running, done and its exit.

The server may refuse for good: an attempt that is over (401: the token is no longer the task's,
after a requeue; 403 or 409: the task has ended) hears nothing more from this reporter; a report
past one of the task's bounds (413) goes again without its console and scalars, which stay whole
in the job's folder. Neither is an error of the job's.

Reports beyond scalars (reports.jsonl: tables, images, plots...) go before the rest, each post
holding nothing else, so that a refusal past their bound (413) is theirs alone: they stop, the
server's sentence goes to the console, and the console, scalars and state go on."""

from __future__ import annotations

import json
import os
import threading

from inside_job.http1 import exchange
from inside_job.jobfiles import CONSOLE_FILE, REPORTS_FILE, SCALARS_FILE
from inside_job.process import start_without_signals

INTERVAL_S = 0.5
START_GRACE_S = 0.1  # a start waits this long for an end to go with
CHUNK_BYTES = 64 * 1024
REPORTS_CHUNK_BYTES = 4 * 1024 * 1024  # reports in one post, unless one alone is larger
REPORT_LINE_BYTES = 24 * 1024 * 1024  # the largest report line (a 16 MiB file, in base64)
TIMEOUT_S = 2.0
MAX_BACKOFF_S = 10.0
REFUSED = (401, 403, 409)  # this attempt's reports are over: stop, quietly
PAST_BOUND = 413  # the task's console or scalars are full on the server


class Reporter:
    """A daemon thread that posts what is new every INTERVAL_S; close() sends the exit."""

    def __init__(self, url: str, token: str, task_id: str, job_dir: str) -> None:
        self.endpoint = f"{url}/api/v1/tasks/{task_id}/report"
        self.token = token
        self.console_path = os.path.join(job_dir, CONSOLE_FILE)
        self.scalars_path = os.path.join(job_dir, SCALARS_FILE)
        self.console_offset = 0
        self.scalars_offset = 0
        self.reports_path = os.path.join(job_dir, REPORTS_FILE)
        self.reports_offset = 0
        self._reports_over = False  # past the task's bound for reports: no more of them
        self._states: list[dict] = []  # changes not sent yet: the newest goes in the next report
        self._exit: dict | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._starting = False  # a start to send after its grace
        self._delay = INTERVAL_S
        self._over = False  # the server refuses this attempt's reports for good
        self._bounded = False  # past a bound: state and exit only
        self._thread = threading.Thread(target=self._loop, name="klique-report", daemon=True)
        start_without_signals(self._thread)

    def state(self, status: dict) -> None:
        """A change of state, sent with the next report: `running` after its grace, `done`
        with the exit, which close() sends at once."""
        with self._lock:
            self._states.append(status)
        if status.get("state") == "running":
            self._starting = True
            self._wake.set()

    def close(self, exit_result: dict | None, deadline_s: float = 5.0) -> None:
        """Send the rest and the exit (if any); gives up after deadline_s so the job can end."""
        with self._lock:
            self._exit = exit_result
        self._stop.set()
        self._wake.set()
        self._thread.join(deadline_s)

    def _loop(self) -> None:
        while True:
            self._wake.wait(self._delay)
            self._wake.clear()
            if self._starting:  # the end, if it comes this soon, goes with the start
                self._starting = False
                self._stop.wait(START_GRACE_S)
            final = self._stop.is_set()
            ok = self._flush(final)
            self._delay = INTERVAL_S if ok else min(self._delay * 2, MAX_BACKOFF_S)
            if final:
                return

    def _flush(self, final: bool) -> bool:
        """Post until nothing new is left; False at the first failed request."""
        if not self._send_reports():
            return False
        while not self._over:
            body, states, console_end, scalars_end = self._next_body(final)
            if not body:
                return True
            if not self._post(body):
                return False
            self._commit(body, states, console_end, scalars_end)
        return True

    def _next_body(self, final: bool) -> tuple[dict, int, int, int]:
        """The next report, how many state changes it stands for, and where the console and
        scalars it holds end."""
        body: dict = {}
        with self._lock:
            # The newest state (the server needs no earlier one), once it is news the server
            # acts on: a start, or the end.
            news = final or any(s.get("state") == "running" for s in self._states)
            states = len(self._states) if news else 0
            if states:
                body["state"] = self._states[-1]
            exit_result = self._exit
        scalars: list[dict] = []
        if self._bounded:  # the files are the truth; the server keeps no more of them
            text, console_end = "", self.console_offset
            scalars_end = self.scalars_offset
        else:
            text, console_end = read_console(self.console_path, self.console_offset, final)
            scalars, scalars_end = read_scalars(self.scalars_path, self.scalars_offset)
        if text:
            body["console"] = {"offset": self.console_offset, "text": text}
        if scalars:
            body["scalars"] = scalars
        caught_up = self._bounded or console_end == _size(self.console_path)
        if final and exit_result is not None and caught_up:
            body["exit"] = exit_result
        return body, states, console_end, scalars_end

    def _commit(self, body: dict, states: int, console_end: int, scalars_end: int) -> None:
        with self._lock:
            del self._states[:states]
            if "exit" in body:
                self._exit = None
        self.console_offset = console_end
        self.scalars_offset = scalars_end

    def _send_reports(self) -> bool:
        """Post the new reports beyond scalars, alone; False at the first failed request."""
        while not (self._over or self._reports_over):
            items, end = read_reports(self.reports_path, self.reports_offset)
            if end == self.reports_offset:
                return True
            if items:
                status, answer = self._send({"reports": items})
                if status in REFUSED:
                    self._over = True
                    return True
                if status == 0 or status >= 500:
                    return False
                if status == PAST_BOUND:
                    self._reports_over = True
                    note(self.console_path, "reports stopped: " + refusal_of(answer))
                elif status >= 400:  # malformed: these are skipped, the next ones go
                    note(self.console_path, "reports skipped: " + refusal_of(answer))
            self.reports_offset = end
        return True

    def _send(self, body: dict) -> tuple[int, bytes]:
        """The server's status and answer; 0 for no answer."""
        headers = [("Content-Type", "application/json"), ("Authorization", f"Bearer {self.token}")]
        try:
            return exchange(self.endpoint, json.dumps(body).encode("utf-8"), headers, TIMEOUT_S)
        except (OSError, ValueError):
            return 0, b""

    def _post(self, body: dict) -> bool:
        status, _ = self._send(body)
        if status == 0:
            return False
        if status in REFUSED:
            self._over = True
        elif status == PAST_BOUND and not self._bounded:
            self._bounded = True
            return self._post({k: v for k, v in body.items() if k not in ("console", "scalars")})
        return 200 <= status < 300


def read_console(path: str, offset: int, final: bool) -> tuple[str, int]:
    """Up to CHUNK_BYTES of new console text from offset; a split UTF-8 character waits."""
    data = _read_from(path, offset, CHUNK_BYTES)
    # A full chunk is never the end of the file: a character split at its edge waits, even
    # in the final flush, for the next chunk to complete it.
    text, used = decode_prefix(data, final and len(data) < CHUNK_BYTES)
    return text, offset + used


def decode_prefix(data: bytes, final: bool) -> tuple[str, int]:
    """Decode data, holding back an incomplete trailing UTF-8 sequence unless final."""
    try:
        return data.decode("utf-8"), len(data)
    except UnicodeDecodeError as exc:
        incomplete = exc.end == len(data) and len(data) - exc.start < 4
        if incomplete and not final:
            return data[: exc.start].decode("utf-8", "replace"), exc.start
        return data.decode("utf-8", "replace"), len(data)


def read_scalars(path: str, offset: int) -> tuple[list[dict], int]:
    """The complete new lines of scalars.jsonl from offset, parsed; bad lines are skipped."""
    scalars, end = _whole_lines(_read_from(path, offset, CHUNK_BYTES))
    return scalars, offset + end


def read_reports(path: str, offset: int) -> tuple[list[dict], int]:
    """The complete new lines of reports.jsonl from offset, parsed, up to REPORTS_CHUNK_BYTES
    (or one larger line); bad lines, and a line past REPORT_LINE_BYTES, are skipped."""
    data = _read_from(path, offset, REPORTS_CHUNK_BYTES)
    if b"\n" not in data and len(data) == REPORTS_CHUNK_BYTES:
        data = _read_from(path, offset, REPORT_LINE_BYTES + 1)
        if b"\n" not in data and len(data) > REPORT_LINE_BYTES:  # never whole: skip it
            return [], offset + len(data)
    reports, end = _whole_lines(data)
    return reports, offset + end


def _whole_lines(data: bytes) -> tuple[list[dict], int]:
    """The JSON objects on data's complete lines, and how many bytes those lines take (a last
    line still being written is read next time); a line that is not an object is skipped."""
    end = data.rfind(b"\n") + 1
    items = []
    for line in data[:end].splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            items.append(item)
    return items, end


def refusal_of(answer: bytes) -> str:
    """The server's sentence in a refusal's body ({"detail": ...}), or what is known."""
    try:
        detail = json.loads(answer).get("detail")
    except (ValueError, AttributeError):
        detail = None
    return detail if isinstance(detail, str) else "the server refused them"


def note(console_path: str, line: str) -> None:
    """Append a `klique: ...` line to the console (it goes to the server with the rest)."""
    try:
        fd = os.open(console_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError:
        return
    try:
        os.write(fd, f"klique: {line}\n".encode("utf-8", "replace"))
    finally:
        os.close(fd)


def _read_from(path: str, offset: int, limit: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(limit)
    except OSError:
        return b""


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
