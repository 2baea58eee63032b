"""klique-helper, the program a login-node agent runs as users through sudo, is confined to the
pool's job roots: run as alice (the helper's caller is the agent, which it does not trust), it
reads and writes nothing outside them (her ~/.ssh/authorized_keys, her Klique credentials), follows
no link on the way (one alice made herself, at the last name or a middle one), unpacks no link or
`..` from a tar, and runs no program but the scheduler's submit commands from its own PATH."""

from __future__ import annotations

import io
import os
import pwd
import secrets
import subprocess
import tarfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers.batch import open_folder, remove_tree, shared_folder
from helpers.confined import confined_helper

from broker import fileops

from .conftest import as_account

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs as alice")

REFUSED = 4  # broker/helper.py: outside the job roots, through a link
JOB = "klique-1-1-000000000001"
OTHER = "klique-2-1-000000000002"


@dataclass(frozen=True)
class Victim:
    """alice's own files outside the job root: what no helper call may read or change."""

    keys: Path  # ~alice/.ssh/authorized_keys
    credentials: Path  # ~alice/.klique/credentials.json
    private: Path  # a folder of hers, mode 700, outside the job root, with a file `secret`

    def intact(self) -> bool:
        return all(
            path.read_text() == path.name + "-" + SECRET
            for path in (self.keys, self.credentials, self.private / "secret")
        )


SECRET = secrets.token_hex(12)


@dataclass(frozen=True)
class Setting:
    helper: Path
    job_root: Path
    outside: Path  # the folder around the job root, which is outside it
    victim: Victim
    scheduler_bin: Path  # where the scheduler's commands are (sbatch)

    def run(self, *argv: str, stdin: bytes = b"", path: str | None = None) -> Any:
        """The helper as alice, by runuser (what sudo gives the agent: alice's rights)."""
        env = ["env", f"PATH={path or os.environ['PATH']}"]
        return subprocess.run(
            ["runuser", "-u", "alice", "--", *env, str(self.helper), *argv],
            input=stdin,
            capture_output=True,
            timeout=60,
            check=False,
        )


@contextmanager
def alices_file(path: Path) -> Iterator[Path]:
    """`path` in alice's home as she would have it (folder 700, file 600), made for the test
    when missing and removed after; an existing one is put back as it was."""
    alice = pwd.getpwnam("alice")
    made_folder = not path.parent.exists()
    path.parent.mkdir(mode=0o700, exist_ok=True)
    os.chown(path.parent, alice.pw_uid, alice.pw_gid)
    kept = path.read_bytes() if path.exists() else None
    path.write_text(path.name + "-" + SECRET)
    os.chown(path, alice.pw_uid, alice.pw_gid)
    path.chmod(0o600)
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)
        if kept is not None:
            path.write_bytes(kept)
            os.chown(path, alice.pw_uid, alice.pw_gid)
        elif made_folder:
            remove_tree(path.parent)


@pytest.fixture
def setting(test_users: Any) -> Iterator[Setting]:
    outside = shared_folder("klique-confined-")
    job_root = open_folder(outside / "jobs")
    private = outside / "alices"
    alice = pwd.getpwnam("alice")
    private.mkdir(mode=0o700)
    (private / "secret").write_text(f"secret-{SECRET}")
    for path, mode in ((private, 0o700), (private / "secret", 0o600)):
        os.chown(path, alice.pw_uid, alice.pw_gid)
        path.chmod(mode)
    sbatch = subprocess.run(["which", "sbatch"], capture_output=True, text=True, check=True)
    scheduler_bin = Path(sbatch.stdout.strip()).parent
    with ExitStack() as stack:
        stack.callback(remove_tree, outside)
        home = Path(alice.pw_dir)
        keys = stack.enter_context(alices_file(home / ".ssh" / "authorized_keys"))
        credentials = stack.enter_context(alices_file(home / ".klique" / "credentials.json"))
        helper = stack.enter_context(confined_helper([job_root], f"{scheduler_bin}:/usr/bin:/bin"))
        victim = Victim(keys, credentials, private)
        yield Setting(helper, job_root, outside, victim, scheduler_bin)


def refused(done: Any, *words: str) -> bool:
    err = done.stderr.decode()
    return (
        done.returncode != 0 and all(word in err for word in words) and len(err.splitlines()) == 1
    )


def test_alices_authorized_keys_are_not_read(setting: Setting) -> None:
    keys = str(setting.victim.keys)
    done = setting.run("read", keys, "1", "4096")
    assert refused(done, "outside the job roots"), done
    assert SECRET.encode() not in done.stdout
    listed = setting.run("collect", keys, f"{setting.job_root}/missing")
    assert refused(listed, "outside the job roots") and SECRET.encode() not in listed.stdout


def test_alices_credentials_are_not_written(setting: Setting) -> None:
    credentials = str(setting.victim.credentials)
    done = setting.run("write", credentials, "600", stdin=b'{"token": "the-agents-own"}')
    assert refused(done, "outside the job roots"), done
    for op in ("mkdir", "private-dir", "remove"):
        assert refused(setting.run(op, f"{setting.victim.credentials.parent}/x"), "outside")
    assert setting.victim.intact()


def test_a_path_with_dot_dot_is_refused(setting: Setting) -> None:
    """Inside the root by its first names, outside by its `..`: refused by the names alone."""
    escape = f"{setting.job_root}/../alices/secret"
    done = setting.run("read", escape, "1", "4096")
    assert refused(done, "'..'"), done
    assert SECRET.encode() not in done.stdout
    done = setting.run("write", f"{setting.job_root}/../alices/planted", "600", stdin=b"x")
    assert refused(done, "'..'"), done
    assert as_account("alice", "ls", str(setting.victim.private)).stdout.split() == ["secret"]


@pytest.mark.parametrize("where", ["last", "middle"])
def test_a_link_alice_made_in_the_job_root_is_not_followed(setting: Setting, where: str) -> None:
    """alice's own link in the job root, to her files outside it: at the last name of the path
    (to the file) or at a middle one (to its folder), neither read nor written through."""
    job = f"{setting.job_root}/{JOB}"
    assert as_account("alice", "mkdir", "-m", "700", job).returncode == 0
    links = {
        "keys": setting.victim.keys if where == "last" else setting.victim.keys.parent,
        "credentials": (
            setting.victim.credentials if where == "last" else setting.victim.credentials.parent
        ),
    }
    for name, target in links.items():
        assert as_account("alice", "ln", "-s", str(target), f"{job}/{name}").returncode == 0
    keys = f"{job}/keys" if where == "last" else f"{job}/keys/authorized_keys"
    credentials = f"{job}/credentials" if where == "last" else f"{job}/credentials/credentials.json"

    done = setting.run("read", keys, "1", "4096")
    assert refused(done, "link"), done
    assert SECRET.encode() not in done.stdout
    done = setting.run("write", credentials, "600", stdin=b'{"token": "the-agents-own"}')
    assert refused(done, "link"), done
    assert setting.victim.intact()
    assert os.path.islink(f"{job}/credentials"), "the link itself is left as it was"
    listed = fileops.untar(setting.run("collect", keys).stdout)
    assert listed == {}, "collect leaves a link out, as before"


def tar_with(member: tarfile.TarInfo, data: bytes = b"") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        archive.addfile(member, io.BytesIO(data) if data else None)
    return buffer.getvalue()


def _link_member(name: str, target: str) -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.type, member.linkname = tarfile.SYMTYPE, target
    return member


def _file_member(name: str, size: int) -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.size, member.mode = size, 0o600
    return member


@pytest.mark.parametrize("member", ["link", "dot-dot", "absolute"])
def test_a_tar_with_a_link_or_dot_dot_member_is_not_unpacked(setting: Setting, member: str) -> None:
    """unpack and unpack-each: a member that is a link, or whose name leads out, fails the
    unpack and lands nowhere."""
    target = str(setting.victim.private)
    tars = {
        "link": (
            tar_with(_link_member("job.sh", target)),
            tar_with(_link_member(f"{OTHER}/job.sh", target)),
        ),
        "dot-dot": (
            tar_with(_file_member("../alices/planted", 1), b"x"),
            tar_with(_file_member(f"{OTHER}/../../alices/planted", 1), b"x"),
        ),
        "absolute": (
            tar_with(_file_member(f"{target}/planted", 1), b"x"),
            tar_with(_file_member(f"/{OTHER}/planted", 1), b"x"),
        ),
    }[member]
    one = setting.run("unpack", f"{setting.job_root}/{JOB}", stdin=tars[0])
    assert one.returncode == fileops.UNPACK_FAILED, one
    many = setting.run("unpack-each", str(setting.job_root), OTHER, stdin=tars[1])
    assert many.returncode == fileops.UNPACK_FAILED, many
    for folder in (JOB, OTHER):
        assert os.listdir(setting.job_root / folder) == []
    assert as_account("alice", "ls", target).stdout.split() == ["secret"]


def test_a_job_folder_through_a_link_is_not_made(setting: Setting) -> None:
    """unpack and unpack-each into a folder of the job root that is alice's link to her own
    folder outside: nothing is made there."""
    link = setting.job_root / "elsewhere"
    assert as_account("alice", "ln", "-s", str(setting.victim.private), str(link)).returncode == 0
    tar = fileops.tar_of({"job.sh": (b"#!/bin/sh\n", 0o700)})
    one = setting.run("unpack", f"{link}/{JOB}", stdin=tar)
    assert one.returncode == fileops.UNPACK_FAILED and b"link" in one.stderr, one
    tar = fileops.tar_of({f"{JOB}/job.sh": (b"#!/bin/sh\n", 0o700)})
    many = setting.run("unpack-each", str(link), JOB, stdin=tar)
    assert many.returncode == fileops.UNPACK_FAILED and b"link" in many.stderr, many
    assert as_account("alice", "ls", str(setting.victim.private)).stdout.split() == ["secret"]


def test_only_the_schedulers_submit_commands_run(setting: Setting) -> None:
    """A program named `sbatch` first on the caller's PATH, a program not a submit command,
    or a --stdin file outside the job root: none runs, or none is read; the real sbatch, from
    the helper's own PATH, does."""
    evil = setting.outside / "bin"
    evil.mkdir(mode=0o755)
    marker = open_folder(setting.outside / "marks") / "ran"
    for name in ("sbatch", "qsub", "sh"):
        (evil / name).write_text(f"#!/bin/sh\ntouch {marker}\necho evil\n")
        (evil / name).chmod(0o755)
    path = f"{evil}:/usr/bin:/bin"
    tar = fileops.tar_of({"job.sh": (b"#!/bin/sh\n", 0o700)})
    done = setting.run(
        "unpack", f"{setting.job_root}/{JOB}", "sbatch", "--version", stdin=tar, path=path
    )
    assert done.returncode == 0 and done.stdout.startswith(b"slurm"), done
    items = setting.run("submit-each", "2", "sbatch", "--version", "1", "sh", path=path)
    answers = [fileops.ITEM_LINE.fullmatch(line) for line in items.stdout.decode().splitlines()]
    assert [(a[1], a[2]) for a in answers if a] == [("0", "0"), ("1", str(fileops.NOT_SUBMIT))]
    for n, program in enumerate((str(evil / "sbatch"), "sh")):
        other = setting.run("unpack", f"{setting.job_root}/other-{n}", program, stdin=tar)
        assert other.returncode == fileops.NOT_SUBMIT and b"runs only" in other.stderr, other
    keys = f"--stdin={setting.victim.keys}"
    fed = setting.run("submit-each", "2", keys, "sbatch", path=path)
    answer = fileops.ITEM_LINE.fullmatch(fed.stdout.decode().strip())
    assert answer and answer[2] == str(REFUSED), fed
    assert not marker.exists()


def test_a_configuration_another_account_could_change_is_refused(setting: Setting) -> None:
    """The job roots come from the helper's own configuration, which only root may change."""
    config = setting.helper.parent / "helper.conf"
    assert setting.run("mode", str(setting.job_root)).stdout == b"1777\n"
    config.chmod(0o666)
    done = setting.run("mode", str(setting.job_root))
    assert refused(done, str(config), "writable by no one else"), done
