"""A stand-in for the parts of the GitHub and GitLab REST APIs that Klique's CI integration
calls, on loopback, recording every call (no network is reachable here).

It answers as the documented endpoints do, with the fields the integration reads:
- GitHub REST API 2022-11-28 (docs.github.com/en/rest): `GET /repos/{owner}/{repo}/pulls/{n}`
  (pulls#get: head.ref, head.sha, base.ref), `GET|POST /repos/{owner}/{repo}/issues/{n}/comments`
  (issues/comments#list-issue-comments, #create-an-issue-comment: 201 with id, body, html_url),
  `PATCH /repos/{owner}/{repo}/issues/comments/{id}` (#update-an-issue-comment). Requests must
  carry `Authorization: Bearer` (else 401, as GitHub answers "Requires authentication").
- GitLab REST API v4 (docs.gitlab.com/ee/api/notes.html): `GET|POST
  /projects/{id}/merge_requests/{iid}/notes` (201 on create), `PUT
  /projects/{id}/merge_requests/{iid}/notes/{note_id}`; requests must carry `PRIVATE-TOKEN`.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Call:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Forge:
    """The recorded calls, the pull requests GitHub knows, and the comments made."""

    pulls: dict[int, dict[str, Any]] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    comments: dict[int, dict[str, Any]] = field(default_factory=dict)  # id -> comment
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""

    def bodies(self, number: int) -> list[str]:
        return [c["body"] for c in self.comments.values() if c["on"] == number]


def _answer(forge: Forge, method: str, path: str, headers: dict[str, str], body: Any) -> Any:
    path = path.split("?", 1)[0]
    if path.startswith("/repos/"):
        if not headers.get("authorization", "").startswith("Bearer "):
            return 401, {"message": "Requires authentication"}
        return _github(forge, method, path, body)
    if path.startswith("/api/v4/projects/"):
        if not headers.get("private-token"):
            return 401, {"message": "401 Unauthorized"}
        return _gitlab(forge, method, path, body)
    return 404, {"message": "Not Found"}


def _github(forge: Forge, method: str, path: str, body: Any) -> tuple[int, Any]:
    if m := re.fullmatch(r"/repos/[^/]+/[^/]+/pulls/(\d+)", path):
        pull = forge.pulls.get(int(m[1]))
        return (200, pull) if pull else (404, {"message": "Not Found"})
    if m := re.fullmatch(r"/repos/[^/]+/[^/]+/issues/(\d+)/comments", path):
        number = int(m[1])
        if method == "GET":
            return 200, [c for c in forge.comments.values() if c["on"] == number]
        return 201, _new_comment(forge, number, body["body"])
    if m := re.fullmatch(r"/repos/[^/]+/[^/]+/issues/comments/(\d+)", path):
        comment = forge.comments.get(int(m[1]))
        if method != "PATCH" or comment is None:
            return 404, {"message": "Not Found"}
        comment["body"] = body["body"]
        return 200, comment
    return 404, {"message": "Not Found"}


def _gitlab(forge: Forge, method: str, path: str, body: Any) -> tuple[int, Any]:
    if m := re.fullmatch(r"/api/v4/projects/[^/]+/merge_requests/(\d+)/notes", path):
        number = int(m[1])
        if method == "GET":
            return 200, [c for c in forge.comments.values() if c["on"] == number]
        return 201, _new_comment(forge, number, body["body"])
    if m := re.fullmatch(r"/api/v4/projects/[^/]+/merge_requests/\d+/notes/(\d+)", path):
        note = forge.comments.get(int(m[1]))
        if method != "PUT" or note is None:
            return 404, {"message": "404 Not found"}
        note["body"] = body["body"]
        return 200, note
    return 404, {"message": "404 Not found"}


def _new_comment(forge: Forge, number: int, text: str) -> dict[str, Any]:
    comment_id = len(forge.comments) + 1
    comment = {"id": comment_id, "on": number, "body": text}
    comment["html_url"] = f"{forge.url}/comments/{comment_id}"
    forge.comments[comment_id] = comment
    return comment


def serve(forge: Forge) -> ThreadingHTTPServer:
    """Start the stand-in on a free loopback port, in a thread; `forge.url` says where."""

    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            headers = {k.lower(): v for k, v in self.headers.items()}
            with forge.lock:
                forge.calls.append(Call(self.command, self.path, headers, body))
                status, answer = _answer(forge, self.command, self.path, headers, body)
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_PUT = _handle

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    forge.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
