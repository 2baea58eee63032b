"""A task on a host pool in docker mode cannot widen its container: an image string cannot
carry podman options, the task (alice's uid) cannot write outside its job folder nor see
another's, and a setuid-root program in its image does not make it root (no-new-privileges).
For real, with podman, as alice."""

from __future__ import annotations

import pwd
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Server
from conftest_services import docker_estate
from helpers.batch import open_folder, remove_tree, shared_folder
from helpers.container_images import SETUID_PYTHON

from broker.pools.docker_argv import RUNNER_PATH
from broker.pools.host_docker import make_mount_folder

pytestmark = pytest.mark.podman


@pytest.fixture(scope="module")
def server(module_server_factory, podman) -> Iterator[Server]:
    yield module_server_factory(docker_estate(podman, "attacked"))


def post(server: Server, command: list[str], **extra: Any) -> Any:
    body = {"command": command, "resource": "cpu", **extra}
    with server.api(server.make_token("alice")) as api:
        return api.post("/tasks", json=body)


def run(server: Server, code: str, image: str, python: str = "python3") -> tuple[dict, str]:
    answer = post(server, [python, "-c", code], image=image)
    assert answer.status_code in (200, 201), answer.text
    task_id = str(answer.json()["id"])
    return server.wait_state(int(task_id)), server.cli("logs", task_id).output


def containers_of(task_id: int) -> str:
    argv = ["podman", "ps", "--all", f"--filter=label=klique.dev/task={task_id}"]
    argv += ["--filter=label=klique.dev/pool=attacked", "-q"]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize(
    "image",
    ["--privileged", "-v /:/host", "localhost/klique-python:test --privileged"],
)
def test_an_image_string_with_options_is_refused_by_the_api(server, image):
    assert post(server, ["python3", "-c", "1"], image=image).status_code == 422


@pytest.mark.parametrize(
    "image", ["localhost/klique-python:test@--privileged", "/srv/images/python.sif"]
)
def test_an_image_that_is_no_reference_fails_before_any_container(server, image):
    answer = post(server, ["python3", "-c", "1"], image=image)
    assert answer.status_code in (200, 201), answer.text
    task_id = int(answer.json()["id"])
    done = server.wait_state(task_id)
    assert done["state"] == "failed" and "image" in done["reason"] and "fix" in done["reason"]
    assert containers_of(task_id) == ""


def test_a_task_cannot_write_outside_its_job_folder_nor_see_another(server, podman):
    probe = f"""
import os
def attempt(path):
    try:
        with open(path, "a") as f:
            f.write("x")
        return "written"
    except OSError as exc:
        return type(exc).__name__
print("runner", attempt({RUNNER_PATH!r}))
print("etc", attempt("/etc/passwd-klique"))
here = os.getcwd()
print("job", attempt(os.path.join(here, "mine")))
print("beside", sorted(os.listdir(os.path.dirname(here))) == [os.path.basename(here)])
"""
    other = post(server, ["python3", "-c", "1"], image=podman.image).json()["id"]
    server.wait_state(int(other))  # another job folder in the job root, not to be seen
    done, output = run(server, probe, podman.image)
    assert done["state"] == "completed", done
    assert "runner OSError" in output or "runner PermissionError" in output
    assert "etc PermissionError" in output
    assert "job written" in output  # its own folder: yes
    assert "beside True" in output  # the job root's other folders are not in the container
    runner = server.home / "runner" / "klique-runner.pyz"
    assert not runner.read_bytes().endswith(b"x")


def test_a_setuid_root_program_in_the_image_does_not_elevate_the_task(server, podman):
    code = (
        "import os, stat; "
        f"print('setuid', bool(os.stat({SETUID_PYTHON!r}).st_mode & stat.S_ISUID), "
        f"os.stat({SETUID_PYTHON!r}).st_uid); print('euid', os.geteuid())"
    )
    done, output = run(server, code, podman.image, python=SETUID_PYTHON)
    assert done["state"] == "completed", done
    assert "setuid True 0" in output  # the program is setuid root in the image
    assert f"euid {pwd.getpwnam('alice').pw_uid}" in output  # and the task stays alice


def test_the_job_folder_is_the_accounts_own_on_the_host(server, podman):
    done, _ = run(server, "open('made-in-container', 'w').write('1')", podman.image)
    made = Path(done["job_dir"]) / "made-in-container"
    assert made.stat().st_uid == pwd.getpwnam("alice").pw_uid


def test_the_folder_a_container_mounts_cannot_be_swapped_by_its_account(test_users):
    """Podman, run as root, resolves a mount's path with root's rights, so the account must not
    be able to put a link to a folder of root's in its place. The attempt's folder is root's,
    with the account's private group: alice makes her job folder in it, and can neither move
    nor remove the folder itself; bob cannot write in it."""
    root = shared_folder("klique-mounts-")
    try:
        jobs = open_folder(root / "jobs")  # a job root: sticky, everyone's
        folder = jobs / "klique-1-1-0123456789ab"
        make_mount_folder(str(folder), pwd.getpwnam("alice").pw_gid)

        def as_user(user: str, *argv: str) -> int:
            return subprocess.run(["runuser", "-u", user, "--", *argv], check=False).returncode

        assert as_user("alice", "mkdir", str(folder / "job")) == 0
        assert as_user("alice", "mv", str(folder), str(jobs / "moved")) != 0
        assert as_user("alice", "rm", "-rf", str(folder)) != 0
        assert as_user("alice", "ln", "-sfT", "/root", str(folder)) != 0
        assert as_user("bob", "mkdir", str(folder / "planted")) != 0
        assert folder.is_dir() and not folder.is_symlink()
        assert sorted(p.name for p in folder.iterdir()) == []  # alice emptied her own job folder
    finally:
        remove_tree(root)
