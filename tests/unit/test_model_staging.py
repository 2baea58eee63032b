"""The runner's staging of registry model versions (inside_job/models.py) against a small HTTP
server standing in for the API: files land in the job's folder, checked by digest, the
reference becomes the local path in the command and the app's env, and the token goes along."""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inside_job.errors import SetupFailed
from inside_job.jobfiles import Console
from inside_job.models import stage
from inside_job.prepare import app_run
from inside_job.prepared import Prepared
from inside_job.spec import TaskSpec

FILES = {
    "/api/v1/models/demo/versions/2/files/0": b"weights",
    "/api/v1/models/demo/versions/2/files/1": b"vocab",
}
TOKEN = "report-token"


@pytest.fixture
def api() -> Iterator[tuple[str, list[str]]]:
    """The API's model files, for the report token only; the paths asked for."""
    asked: list[str] = []

    class Files(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            asked.append(self.path)
            body = FILES.get(self.path)
            if body is None or self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Files)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", asked
    server.shutdown()


def spec_of(job_dir: Path, url: str, kind: str, files: list[dict[str, Any]]) -> TaskSpec:
    ref = "registry:demo@production"
    raw = {
        "id": 7,
        "command": ["serve", "--model", ref, "--port={port}"],
        "report": {"url": url, "token": TOKEN},
        "app": {
            "name": "http",
            "env": {"MODEL_PATH": ref},
            "models": [{"ref": ref, "name": "demo", "version": 2, "kind": kind, "files": files}],
        },
    }
    return TaskSpec(raw, str(job_dir))


def digest(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def test_a_folder_model_is_staged_and_its_reference_becomes_the_folder(tmp_path, api) -> None:
    url, asked = api
    files = [
        {"path": "model.bin", "digest": digest(b"weights"), "size": 7},
        {"path": "tok/vocab.txt", "digest": digest(b"vocab"), "size": 5},
    ]
    spec = spec_of(tmp_path, url, "folder", files)
    prepared = Prepared(list(spec.command), {}, str(tmp_path))
    stage(spec, prepared, Console(str(tmp_path)))
    app_run(spec, prepared)
    folder = tmp_path / "models" / "demo" / "v2"
    assert (folder / "model.bin").read_bytes() == b"weights"
    assert (folder / "tok" / "vocab.txt").read_bytes() == b"vocab"
    assert prepared.argv[:3] == ["serve", "--model", str(folder)]
    assert prepared.env["MODEL_PATH"] == str(folder)
    assert len(asked) == 2
    stage(spec, Prepared(list(spec.command), {}, str(tmp_path)), Console(str(tmp_path)))
    assert len(asked) == 2  # staged already: not fetched again


def test_a_file_model_becomes_the_files_path_and_a_damaged_one_is_refused(tmp_path, api) -> None:
    url, _ = api
    one = [{"path": "model.bin", "digest": digest(b"weights"), "size": 7}]
    spec = spec_of(tmp_path, url, "file", one)
    prepared = Prepared(list(spec.command), {}, str(tmp_path))
    stage(spec, prepared, Console(str(tmp_path)))
    assert prepared.argv[2] == str(tmp_path / "models" / "demo" / "v2" / "model.bin")

    damaged = [{"path": "other.bin", "digest": digest(b"something else"), "size": 7}]
    spec = spec_of(tmp_path, url, "file", damaged)
    with pytest.raises(SetupFailed, match="arrived damaged"):
        stage(spec, Prepared(list(spec.command), {}, str(tmp_path)), Console(str(tmp_path)))
    assert not (tmp_path / "models" / "demo" / "v2" / "other.bin").exists()
