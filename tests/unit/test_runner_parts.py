"""The runner's pure parts: task.json checks, outcomes, report decoding, diff errors, env keys."""

from __future__ import annotations

import json
import signal

import pytest

from inside_job import code, envbuild, envsource, outcome, reporter, spec
from inside_job.errors import SpecError


def _load(tmp_path, **fields):
    raw = {"version": 1, "id": 1, "command": ["true"]}
    raw.update(fields)
    (tmp_path / "task.json").write_text(json.dumps(raw))
    return spec.load(str(tmp_path))


def test_a_minimal_task_file_loads_with_defaults(tmp_path):
    task = _load(tmp_path)
    assert task.id == "1" and task.command == ["true"] and task.scheduler == "host"
    assert task.code is None and task.gpus is None and task.report is None
    assert task.cache_setting is None  # the runner then keeps its caches in ~/.cache/klique


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"command": "python x.py"}, "command: must be a non-empty list"),
        ({"command": []}, "command: must be a non-empty list"),
        ({"env": {"A": 1}}, "env: 'A'"),
        ({"gpus": "0,1"}, "gpus: must be null or a list"),
        ({"code": {"repo": "x"}}, "code: give either workdir, or repo and commit"),
        ({"report": {"url": "file:///etc/passwd"}}, "report.url"),
        ({"version": 2}, "version 2 is not supported"),
        ({"id": None}, "id: must be"),
    ],
)
def test_a_bad_field_is_named(tmp_path, fields, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(")):
        _load(tmp_path, **fields)


def test_a_missing_task_file_says_so(tmp_path):
    with pytest.raises(SpecError, match="cannot read"):
        spec.load(str(tmp_path))


def _status(code: int = 0, signum: int = 0) -> int:
    return signum if signum else code << 8


def test_outcomes_from_wait_statuses(tmp_path):
    job = str(tmp_path)
    assert outcome.classify(_status(0), None, job)["outcome"] == "completed"
    failed = outcome.classify(_status(2), None, job)
    assert (failed["outcome"], failed["exit_code"]) == ("failed", 2)
    killed = outcome.classify(_status(signum=signal.SIGSEGV), None, job)
    assert (killed["outcome"], killed["exit_code"], killed["signal"]) == ("signalled", 139, 11)
    stopped = outcome.classify(_status(0), signal.SIGTERM, job)
    assert stopped["outcome"] == "signalled" and stopped["reason"] == outcome.TERMINATED_REASON
    interrupted = outcome.classify(_status(signum=signal.SIGINT), signal.SIGINT, job)
    assert interrupted["reason"] == "interrupted by SIGINT"
    (tmp_path / "preempted").touch()
    assert outcome.classify(_status(signum=15), signal.SIGTERM, job)["outcome"] == "preempted"


def test_console_decoding_holds_back_a_split_character():
    data = "café".encode()
    assert reporter.decode_prefix(data[:-1], final=False) == ("caf", 3)
    assert reporter.decode_prefix(data[:-1], final=True)[1] == 4
    assert reporter.decode_prefix(b"\xff ok", final=False) == ("\ufffd ok", 4)


def test_scalars_are_read_by_complete_lines(tmp_path):
    path = tmp_path / "scalars.jsonl"
    path.write_text('{"name": "a", "value": 1}\nnot json\n{"name": "b", "val')
    scalars, end = reporter.read_scalars(str(path), 0)
    assert [s["name"] for s in scalars] == ["a"]
    assert end == len('{"name": "a", "value": 1}\nnot json\n')


def test_git_apply_complaints_name_the_files():
    output = (
        "error: patch failed: src/a.py:12\nerror: src/a.py: patch does not apply\n"
        "error: b.py: does not exist in index\nApplied patch to 'c.py' with conflicts.\nU c.py\n"
    )
    assert code.failed_files(output) == ["src/a.py", "b.py", "c.py"]


def test_requirement_lines_are_normalised_for_the_key():
    first = envsource.from_lines(["six==1.16", "# comment", "", "tomli  # pinned later"])
    second = envsource.from_lines(["tomli", "six==1.16"])
    assert first.lines == ["six==1.16", "tomli"] and first.material == second.material


def test_the_key_changes_with_interpreter_platform_and_image():
    base = envbuild.env_key("six", "cpython-3.11.7-/usr/bin/python3", "linux-x86_64", None)
    assert base == envbuild.env_key("six", "cpython-3.11.7-/usr/bin/python3", "linux-x86_64", None)
    others = {
        envbuild.env_key("six", "cpython-3.12.1-/usr/bin/python3", "linux-x86_64", None),
        envbuild.env_key("six", "cpython-3.11.7-/usr/bin/python3", "linux-aarch64", None),
        envbuild.env_key("six", "cpython-3.11.7-/usr/bin/python3", "linux-x86_64", "img"),
        envbuild.env_key("tomli", "cpython-3.11.7-/usr/bin/python3", "linux-x86_64", None),
    }
    assert base not in others and len(others) == 4


def test_a_character_split_at_a_chunk_boundary_arrives_whole(tmp_path):
    """The console is sent in 64 KiB chunks: a character cut at a chunk's edge waits for the
    next chunk, even in the final flush, and is never two replacement characters."""
    from inside_job.reporter import CHUNK_BYTES, read_console

    path = tmp_path / "console.log"
    text = "x" * (CHUNK_BYTES - 1) + "é" + "ü" * 10 + "\n"  # é's two bytes straddle the edge
    path.write_bytes(text.encode())
    received, offset = "", 0
    while True:
        chunk, offset = read_console(str(path), offset, final=True)
        if not chunk:
            break
        received += chunk
    assert received == text and "\ufffd" not in received
