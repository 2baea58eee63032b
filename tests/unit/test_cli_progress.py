"""The CLI's progress (broker/cli/progress.py): a followed task's stage in words from what the
server reports, the runner's lines found across console chunks, an upload's chunks sent again
whole on a retry, a download counted, and nothing drawn off a terminal."""

from __future__ import annotations

import io
import json
from pathlib import Path

import httpx

from broker.cli import progress
from broker.cli.tasks import FINAL
from broker.client import Client


def test_a_followed_tasks_stage_says_only_what_the_server_reported():
    assert progress.stage("queued", None, FINAL) == "waiting (queued)"
    assert progress.stage("pending", None, FINAL) == "waiting (pending)"
    building = "building environment 3f2a9c1b7d00 with uv (requirements.txt)"
    # A host pool's task stays `submitted` while its runner builds: the console says so.
    assert progress.stage("submitted", building, FINAL) == "building the environment"
    assert progress.stage("running", building, FINAL) == "building the environment"
    built = "built environment 3f2a9c1b7d00 in 41.2 s"
    assert progress.stage("submitted", built, FINAL) == "setting up"
    assert progress.stage("running", built, FINAL) == "running"
    assert progress.stage("running", None, FINAL) == "running"
    assert progress.stage("completed", building, FINAL) == "completed"


def test_the_runners_last_line_is_found_across_chunks():
    lines = progress.RunnerLines()
    lines.feed("klique: code /src at 1a2b3c (mirror hit)\nklique: building envi")
    assert lines.last == "code /src at 1a2b3c (mirror hit)"  # the second is not whole yet
    lines.feed("ronment 3f2a with uv (requirements.txt)\nCollecting torch\n")
    assert lines.last == "building environment 3f2a with uv (requirements.txt)"
    lines.feed("the task's own words\n")
    assert lines.last == "building environment 3f2a with uv (requirements.txt)"


def test_nothing_draws_off_a_terminal(monkeypatch):
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert not progress.on_terminal()
    assert isinstance(progress.byte_bar(1 << 30, "big"), progress.Quiet)
    assert isinstance(progress.sweep_bar(1), progress.Quiet)
    assert not progress.StageLine(1).shown

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stderr", Terminal())
    monkeypatch.setenv("TERM", "xterm")
    assert progress.on_terminal()
    assert isinstance(progress.byte_bar(1 << 10, "small"), progress.Quiet)  # over at once
    monkeypatch.setenv("TERM", "dumb")
    assert not progress.on_terminal()


def test_an_upload_is_sent_whole_each_time_it_is_sent():
    data = bytes(range(256)) * 1000  # 256 kB: four chunks
    upload = progress.Upload(data, "sending a test")
    assert b"".join(upload) == data
    assert b"".join(upload) == data  # a retried request iterates it again from its start
    assert max(len(chunk) for chunk in upload) == progress.CHUNK_BYTES


def test_a_post_sends_its_body_in_counted_chunks_and_a_download_is_counted(tmp_path: Path):
    seen: dict[str, object] = {}
    artifact = b"x" * (3 * (1 << 20))

    def answer(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            seen["length"] = request.headers["content-length"]
            seen["body"] = request.read()
            return httpx.Response(201, json={"id": 7})
        return httpx.Response(200, content=artifact)

    client = Client(api="http://klique.invalid", token="t")
    client.http = httpx.Client(
        base_url="http://klique.invalid/api/v1", transport=httpx.MockTransport(answer)
    )
    body = {"command": ["python", "-c", "print(1)"], "code": {"diff": "+" * 100_000}}
    sent: list[int] = []

    def sending(data: bytes) -> progress.Upload:
        sent.append(len(data))
        return progress.Upload(data, "sending a test")

    assert client.post("/tasks", body, sending=sending) == {"id": 7}
    assert json.loads(seen["body"]) == body  # type: ignore[arg-type]
    assert seen["length"] == str(sent[0])

    counted: list[int] = []

    class Counter:
        def __init__(self, total: int) -> None:
            counted.append(total)

        def update(self, n: int) -> None:
            counted.append(n)

        def close(self) -> None:
            counted.append(-1)

    dest = tmp_path / "model.bin"
    assert client.download("/tasks/7/artifacts/model", dest, Counter) == len(artifact)
    assert dest.read_bytes() == artifact
    assert counted[0] == len(artifact) and sum(counted[1:-1]) == len(artifact)
    assert counted[-1] == -1
