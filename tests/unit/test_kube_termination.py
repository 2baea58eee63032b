"""The runner's termination message: written in place (a kubelet bind-mounts the file, which
can be neither renamed over nor unlinked), whole, and within the kubelet's 4096 bytes."""

from __future__ import annotations

import json
import os

from inside_job import termination
from inside_job.run import run


def test_the_message_is_written_in_place_and_replaces_what_was_there(tmp_path):
    path = tmp_path / "termination-log"
    path.write_bytes(b"x" * 5000)  # longer than the message: truncated, not left at its end
    inode = path.stat().st_ino
    termination.write({"exit_code": 0, "outcome": "completed", "reason": "ok"}, str(path))
    assert path.stat().st_ino == inode  # the same file: never renamed over
    assert json.loads(path.read_bytes()) == {"exit_code": 0, "outcome": "completed", "reason": "ok"}


def test_a_long_record_stays_whole_json_within_the_kubelets_limit():
    record = {
        "exit_code": 1,
        "outcome": "failed",
        "reason": "r" * 9000,
        "environment": {"packages": ["p" * 100] * 50},
        "started": 1.0,
        "finished": 2.0,
    }
    data = termination.message(record)
    assert len(data) <= termination.LIMIT
    kept = json.loads(data)
    assert (kept["exit_code"], kept["outcome"]) == (1, "failed") and kept["reason"].startswith("r")
    small = {"exit_code": 0, "outcome": "completed", "reason": "exited with code 0"}
    assert json.loads(termination.message(small)) == small


def test_the_runner_writes_it_where_the_pod_says_and_exit_json_too(tmp_path, monkeypatch):
    job = tmp_path / "job"
    job.mkdir()
    log = tmp_path / "termination-log"
    log.touch()
    monkeypatch.setenv(termination.ENV, str(log))
    code = run(str(job))  # no task.json: a setup failure, recorded all the same
    record = json.loads(log.read_bytes())
    assert record["exit_code"] == code != 0
    assert json.loads((job / "exit.json").read_bytes())["exit_code"] == code
    assert os.path.exists(log)
