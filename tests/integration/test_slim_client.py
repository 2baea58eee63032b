"""`pip install klique` on a researcher's laptop: the wheel, installed without extras into a
new environment of the oldest Python the machine has (3.8 where there is one), gives the CLI and
the SDK with httpx and click, talks to a server run from the full installation, and answers a
platform command with one line naming `pip install 'klique[server]'`."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, Server

# Never in the client's environment: the server extra's packages.
SERVER_STACK = ("fastapi", "sqlalchemy", "uvicorn", "pydantic", "jinja2", "asyncssh", "authlib")
VERSION = "import sys; print(sys.version_info[:2])"
FOUND = (  # which of the modules named in argv an interpreter finds
    "import importlib.util as u, json, sys; "
    "print(json.dumps([u.find_spec(n) is not None for n in sys.argv[1:]]))"
)


def oldest_python() -> str:
    """A Python 3.8 where the machine has one (on PATH or pyenv's), else this one."""
    found = [shutil.which("python3.8")]
    found += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3.8")))
    for python in filter(None, found):
        said = subprocess.run([python, "-c", "import venv"], capture_output=True, check=False)
        if said.returncode == 0:
            return python
    return sys.executable


@pytest.fixture(scope="module")
def slim() -> Iterator[Path]:
    """The bin folder of a new environment holding the wheel without extras."""
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    assert uv, "uv is a test dependency"
    folder = Path(tempfile.mkdtemp(prefix="klique-slim-", dir="/tmp"))
    steps = [
        # from the sdist, as an index serves it: never from a build/ folder in the checkout
        [uv, "build", "--quiet", "--out-dir", str(folder / "dist"), str(ROOT)],
        [uv, "venv", "--quiet", "--python", oldest_python(), str(folder / "venv")],
    ]
    for argv in steps:
        subprocess.run(argv, check=True, capture_output=True, timeout=600)
    wheel = next((folder / "dist").glob("klique-*.whl"))
    python = folder / "venv" / "bin" / "python"
    install = [uv, "pip", "install", "--quiet", "--python", str(python), str(wheel)]
    subprocess.run(install, check=True, capture_output=True, timeout=600)
    yield folder / "venv" / "bin"
    shutil.rmtree(folder, ignore_errors=True)


def run(
    bin_folder: Path, *argv: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bin_folder / argv[0]), *argv[1:]],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd="/",  # not the checkout: the installed package, never the source tree
        env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), **(env or {})},
    )


def test_the_client_installs_without_the_server_stack_on_the_oldest_python(slim: Path) -> None:
    oldest = subprocess.run(
        [oldest_python(), "-c", VERSION], capture_output=True, text=True, check=True
    )
    assert run(slim, "python", "-c", VERSION).stdout == oldest.stdout
    names = [*SERVER_STACK, "httpx", "click", "klique", "broker"]
    shown = run(slim, "python", "-c", FOUND, *names)
    assert shown.returncode == 0, shown.stderr
    found = dict(zip(names, json.loads(shown.stdout), strict=True))
    assert [name for name in SERVER_STACK if found[name]] == []
    assert all(found[name] for name in ("httpx", "click", "klique", "broker")), found
    sdk = run(slim, "python", "-c", "import klique; print(klique.Task.__name__)")
    assert sdk.returncode == 0 and sdk.stdout.strip() == "Task", sdk.stderr


def test_the_user_commands_work_against_a_server(
    slim: Path, test_users: tuple[str, str], host_server: Server
) -> None:
    helped = run(slim, "klique", "--help")
    assert helped.returncode == 0, helped.stderr
    for command in ("submit", "ls", "logs", "why", "cancel", "login", "token", "completion"):
        assert f"  {command} " in helped.stdout, command
    env = host_server.env()
    submit = ["klique", "submit", "--json", "-r", "cpu", "-n", "slim", "--", "echo", "hi"]
    submitted = run(slim, *submit, env=env)
    assert submitted.returncode == 0, submitted.stderr
    task_id = json.loads(submitted.stdout)["id"]
    assert host_server.wait_state(task_id)["state"] == "completed"
    listed = run(slim, "klique", "ls", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert [(t["id"], t["name"]) for t in json.loads(listed.stdout)] == [(task_id, "slim")]
    shown = run(slim, "klique", "show", str(task_id), env=env)
    assert shown.returncode == 0 and "completed" in shown.stdout, shown.stderr
    logs = run(slim, "klique", "logs", str(task_id), env=env)
    assert logs.returncode == 0 and "hi" in logs.stdout, logs.stderr
    completion = run(slim, "klique", "completion", "bash")
    assert completion.returncode == 0 and "_klique_completion" in completion.stdout
    for argv in (["artifacts", str(task_id)], ["resources"], ["app", "list"], ["token", "ls"]):
        said = run(slim, "klique", *argv, env=env)
        assert said.returncode == 0, f"klique {' '.join(argv)}: {said.stderr}"
    long = run(slim, "klique", "submit", "--json", "-r", "cpu", "--", "sleep", "300", env=env)
    long_id = json.loads(long.stdout)["id"]
    why = run(slim, "klique", "why", str(long_id), env=env)
    assert why.returncode == 0 and why.stdout.strip(), why.stderr
    cancelled = run(slim, "klique", "cancel", str(long_id), env=env)
    assert cancelled.returncode == 0, cancelled.stderr
    assert host_server.wait_state(long_id)["state"] == "cancelled"


@pytest.mark.parametrize(
    "argv",
    [("server",), ("estate", "check", "/nonexistent.yaml"), ("db", "upgrade"), ("agent",)],
)
def test_a_platform_command_says_in_one_line_to_install_the_server_extra(
    slim: Path, argv: tuple[str, ...], tmp_path: Path
) -> None:
    said = run(slim, "klique", *argv, env={"KLIQUE_HOME": str(tmp_path)})
    assert said.returncode == 1, said.stdout + said.stderr
    assert said.stdout == ""
    assert len(said.stderr.splitlines()) == 1, said.stderr
    assert said.stderr.startswith(f"klique: `klique {argv[0]}` runs the server's side")
    assert "pip install 'klique[server]'" in said.stderr


def test_the_agents_helper_installs_without_the_server_extra(slim: Path, tmp_path: Path) -> None:
    helper = tmp_path / "klique-helper"
    said = run(slim, "klique", "agent", "--install-helper", str(helper))
    assert said.returncode == 0, said.stderr
    assert said.stdout.strip() == f"installed {helper}" and os.access(helper, os.X_OK)
