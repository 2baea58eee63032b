"""Helpers for the runner's tests: job directories, running the runner, git repos, a report sink."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
UV = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")


def cache_of(root: Path) -> Path:
    """Where a runner started by make_job(root) keeps its caches: the pool's cache_dir (root /
    "cache") holds one private folder per account."""
    return root / "cache" / pwd.getpwuid(os.getuid()).pw_name


def make_job(root: Path, name: str = "job", **task: object) -> Path:
    """A job directory holding task.json (version 1, id 7 and a null code unless given)."""
    job = root / name
    job.mkdir(parents=True, exist_ok=True)
    spec = {"version": 1, "id": 7, "code": None, "cache_dir": str(root / "cache")}
    spec.update(task)
    (job / "task.json").write_text(json.dumps(spec))
    return job


def runner_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT)
    env.pop("KLIQUE_PREEMPTED", None)
    env.update(extra)
    return env


def runner_argv(job: Path, python: str = "") -> list[str]:
    """The runner started as python -m; KLIQUE_TEST_RUNNER_PYTHON picks another interpreter."""
    python = python or os.environ.get("KLIQUE_TEST_RUNNER_PYTHON", sys.executable)
    return [python, "-m", "inside_job", str(job)]


def run_runner(job: Path, timeout: float = 120, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        runner_argv(job),
        env=runner_env(**extra),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(REPO_ROOT),
        check=False,
    )


def start_runner(job: Path, **extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        runner_argv(job),
        env=runner_env(**extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=str(REPO_ROOT),
    )


def read_json(job: Path, name: str) -> dict:
    return json.loads((job / name).read_text())


def console(job: Path) -> str:
    path = job / "console.log"
    return path.read_text() if path.exists() else ""


def git(cwd: Path, *args: str) -> str:
    env = dict(
        os.environ,
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@example.org",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@example.org",
    )
    result = subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True
    )
    return result.stdout.strip()


def make_repo(root: Path, files: dict[str, str]) -> tuple[Path, str]:
    """A git repository with one commit of files; returns (path, commit)."""
    repo = root / "repo"
    repo.mkdir(parents=True)
    git(repo, "init", "-q")
    commit_files(repo, files)
    return repo, git(repo, "rev-parse", "HEAD")


def commit_files(repo: Path, files: dict[str, str]) -> str:
    for name, text in files.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "change")
    return git(repo, "rev-parse", "HEAD")


def diff_of(repo: Path, files: dict[str, str]) -> str:
    """The diff that changing files would make in repo's working tree (the tree is restored)."""
    for name, text in files.items():
        (repo / name).write_text(text)
    diff = git(repo, "diff") + "\n"
    git(repo, "checkout", "-q", "--", ".")
    return diff


class ReportSink:
    """A tiny HTTP server on loopback that records every report the runner posts."""

    def __init__(self, status: int = 200) -> None:
        self.posts: list[dict] = []
        self.headers: list[dict] = []
        self.status = status
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                sink.headers.append({"path": self.path, "auth": self.headers["Authorization"]})
                sink.posts.append(json.loads(body))
                self.send_response(sink.status)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def console_text(self) -> str:
        """Console chunks reassembled by offset (a resent chunk counts once)."""
        chunks = {
            p["console"]["offset"]: p["console"]["text"] for p in self.posts if "console" in p
        }
        text = ""
        for offset in sorted(chunks):
            if offset == len(text.encode()):
                text += chunks[offset]
        return text

    def states(self) -> list[str]:
        return [p["state"]["state"] for p in self.posts if "state" in p]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
