"""Job folders: the server never follows a user's link, never writes or reads with its own
rights in a user's folder; folders are new, unguessable and private; caches are per account."""

from __future__ import annotations

import json
import pwd
import stat
from pathlib import Path

import pytest
from conftest import wait_for

from .conftest import SLURM, SLURM_SSH, Attack, RootSecret, as_account, everything_seen, submit

POOLS = ["host", SLURM, SLURM_SSH]
JOB_FILES = (
    "console.log task.json status.json exit.json scalars.jsonl runner.log runner.pid preempted"
)


@pytest.mark.parametrize("pool", POOLS)
def test_a_console_linked_to_a_root_file_shows_nothing_of_it(
    attack_factory, root_secret: RootSecret, pool: str
) -> None:
    attack: Attack = attack_factory(pool)
    script = f'echo before; ln -sf {root_secret.path} "$KLIQUE_JOB_DIR/console.log"; echo after'
    task_id = submit(attack, attack.bob, script)
    task = attack.server.wait_state(task_id, token=attack.bob)
    assert task["state"] == "completed", task
    seen = everything_seen(attack, task_id, attack.bob)
    assert root_secret.value not in seen
    copy = attack.server.home / "console" / f"{task_id}.log"
    assert not copy.exists() or root_secret.value not in copy.read_text()
    assert root_secret.intact()


@pytest.mark.parametrize("pool", ["host", SLURM])
def test_links_planted_in_a_job_folder_never_redirect_the_server(
    attack_factory, root_secret: RootSecret, pool: str
) -> None:
    """Every file the server once wrote or read in a job folder becomes a link to a root-only
    file; the task is then cancelled. Nothing of the root file changes or shows."""
    attack: Attack = attack_factory(pool)
    script = (
        f'for f in {JOB_FILES}; do ln -sf {root_secret.path} "$KLIQUE_JOB_DIR/$f"; done; '
        "echo planted; sleep 600"
    )
    task_id = submit(attack, attack.bob, script)
    task = attack.server.wait_state(task_id, {"running"}, token=attack.bob)
    last = Path(task["job_dir"]) / JOB_FILES.split()[-1]
    wait_for(last.is_symlink, 60, "the links to be planted")
    done = attack.server.cli("cancel", str(task_id), token=attack.bob)
    assert done.exit_code == 0, done.output
    attack.server.wait_state(task_id, token=attack.bob)
    assert root_secret.intact()
    assert root_secret.value not in everything_seen(attack, task_id, attack.bob)


@pytest.mark.parametrize("pool", ["host", SLURM, SLURM_SSH])
def test_job_files_are_private_to_their_account(attack_factory, pool: str) -> None:
    attack: Attack = attack_factory(pool)
    script = (
        "echo alice-was-here; python3 -c 'from inside_job import report; report.scalar(\"x\", 1)'"
    )
    task_id = submit(attack, attack.alice, script)
    task = attack.server.wait_state(task_id, token=attack.alice)
    assert task["state"] == "completed", task
    job_dir = Path(task["job_dir"])
    alice = pwd.getpwnam("alice").pw_uid
    info = job_dir.stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (alice, 0o700)
    for path in job_dir.iterdir():
        if path.is_file():
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
    for name in ("task.json", "console.log", "exit.json", "scalars.jsonl"):
        peek = as_account("bob", "cat", str(job_dir / name))
        assert peek.returncode != 0 and "alice-was-here" not in peek.stdout, name
        assert "Permission denied" in peek.stderr
    listing = as_account("bob", "ls", str(job_dir))
    assert listing.returncode != 0 and "Permission denied" in listing.stderr


def test_folders_planted_in_advance_are_never_used(attack_factory, tmp_path: Path) -> None:
    """bob makes the folder names the next tasks would once have used, each with a runner of
    his own; alice's tasks run in new folders of their own and bob's runner never runs."""
    attack: Attack = attack_factory("host")
    marker = Path("/tmp") / f"klique-planted-{tmp_path.name}"
    fake = f"import pathlib; pathlib.Path({str(marker)!r}).write_text('bob ran this')"
    plant = (
        f"for i in $(seq 1 8); do for n in klique-$i klique-$i-1 klique-$i-2; do "
        f'mkdir -m 777 "{attack.job_root}/$n" && '
        f'printf "%s" {json.dumps(fake)} > "{attack.job_root}/$n/klique-runner.pyz"; '
        f"done; done"
    )
    assert as_account("bob", "sh", "-c", plant).returncode == 0
    planted = {p for p in attack.job_root.iterdir()}
    ids = [submit(attack, attack.alice, "echo mine") for _ in range(3)]
    for task_id in ids:
        task = attack.server.wait_state(task_id, token=attack.alice)
        assert task["state"] == "completed", task
        job_dir = Path(task["job_dir"])
        assert job_dir not in planted and job_dir.stat().st_uid == pwd.getpwnam("alice").pw_uid
    assert not marker.exists()


def test_a_cache_planted_by_another_account_is_refused(
    attack_factory, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The pool's cache folder is shared; bob makes alice's cache folder first, open to all,
    with an environment of his. alice's task refuses it with a reason, and uses nothing of it."""
    from helpers.batch import open_folder, remove_tree

    cache = open_folder(Path("/tmp") / f"klique-cache-{tmp_path.name}")
    request.addfinalizer(lambda: remove_tree(cache))
    attack: Attack = attack_factory("host", cache_dir=str(cache))
    plant = f'mkdir -m 777 "{cache}/alice" && mkdir -m 777 "{cache}/alice/envs"'
    assert as_account("bob", "sh", "-c", plant).returncode == 0
    # An environment to build: the cache is needed (a task needing none never opens it).
    task_id = submit(attack, attack.alice, "echo should-not-run", requirements=["six"])
    task = attack.server.wait_state(task_id, token=attack.alice)
    assert task["state"] == "failed"
    assert "is not this account's own folder" in task["reason"], task
    assert (
        "should-not-run" not in attack.server.cli("logs", str(task_id), token=attack.alice).output
    )
    assert sorted(p.name for p in (cache / "alice").iterdir()) == ["envs"]


@pytest.mark.slurm
def test_a_staged_uv_folder_planted_by_another_account_refuses_the_submission(
    attack_factory, tmp_path: Path
) -> None:
    attack: Attack = attack_factory("slurm", uv="stage")
    marker = Path("/tmp") / f"klique-planted-uv-{tmp_path.name}"
    folder = attack.job_root / ".klique-alice"
    plant = (
        f'mkdir -m 777 "{folder}" && printf "#!/bin/sh\\ntouch {marker}\\n" > "{folder}/uv" && '
        f'chmod 777 "{folder}/uv"'
    )
    assert as_account("bob", "sh", "-c", plant).returncode == 0
    with attack.server.api(attack.alice) as api:
        answer = api.post(
            "/tasks", json={"command": ["python3", "-c", "import six"], "requirements": ["six"]}
        )
    task = attack.server.wait_state(answer.json()["id"], token=attack.alice)
    assert task["state"] == "failed" and "is not a private folder of alice" in task["reason"], task
    assert not marker.exists()
