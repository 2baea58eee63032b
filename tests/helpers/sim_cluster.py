"""The PBS Professional, Torque and LSF simulators of tests/fakes as a test drives them: one
simulated scheduler with a private state folder, its commands run as the submitting account
(alice through runuser when the tests run as root, otherwise the current user), and a wait
that polls a condition against a deadline."""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import wait_for

FAKES = Path(__file__).resolve().parents[1] / "fakes"
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
DEADLINE = 30.0


def _submitter() -> tuple[list[str], str]:
    """(argv prefix, user name) for submissions: alice via runuser as root, else ourselves."""
    if os.geteuid() != 0:
        return [], pwd.getpwuid(os.getuid()).pw_name
    try:
        pwd.getpwnam("alice")
    except KeyError:
        made = subprocess.run(["useradd", "-m", "alice"], capture_output=True, text=True)
        if made.returncode != 0:
            pytest.skip(f"running as root but cannot create user alice: {made.stderr.strip()}")
    runuser = shutil.which("runuser") or shutil.which("runuser", path="/usr/sbin:/sbin")
    if runuser is None:
        pytest.skip("running as root but runuser(1) is not installed")
    return [runuser, "-u", "alice", "--"], "alice"


@dataclass
class Cluster:
    """One simulated scheduler with a private state folder and a shared work folder."""

    flavor: str
    work: Path
    env: dict
    prefix: list[str]
    user: str
    submitted: list[str] = field(default_factory=list)

    def run(
        self, *argv: str, stdin: str | None = None, as_root: bool = False, env: dict | None = None
    ) -> subprocess.CompletedProcess:
        prefix = [] if as_root else self.prefix
        return subprocess.run(
            [*prefix, *argv],
            input=stdin,
            capture_output=True,
            text=True,
            cwd=self.work,
            env={**self.env, **(env or {})},
            timeout=60,
        )

    def script(self, name: str, body: str) -> Path:
        path = self.work / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)
        return path

    # ---- per-flavor commands -------------------------------------------------
    def submit(self, script: Path, *extra: str, **kw) -> str:
        name = script.stem
        out = str(self.work / f"{name}.out")
        if self.flavor == "lsf":
            done = self.run("bsub", "-J", name, "-o", out, *extra, stdin=script.read_text(), **kw)
            assert done.returncode == 0, done.stderr
            job_id = done.stdout.split("<")[1].split(">")[0]
        else:
            done = self.run("qsub", "-N", name, "-j", "oe", "-o", out, *extra, str(script), **kw)
            assert done.returncode == 0, done.stderr
            job_id = done.stdout.strip()
        self.submitted.append(job_id)
        return job_id

    def status(self, job_id: str) -> dict | None:
        """{'state': queued|running|done, 'exit': int|None, 'reason': str} or None if unknown."""
        if self.flavor == "pbspro":
            done = self.run("qstat", "-f", "-F", "json", "-x", job_id)
            if done.returncode == 153:
                return None
            attrs = json.loads(done.stdout)["Jobs"][job_id]
            state = {"Q": "queued", "H": "queued", "R": "running", "E": "running", "F": "done"}[
                attrs["job_state"]
            ]
            return {
                "state": state,
                "exit": attrs.get("Exit_status"),
                "reason": attrs.get("comment", ""),
                "raw": attrs,
            }
        if self.flavor == "torque":
            done = self.run("qstat", "-f", "-1", job_id)
            if done.returncode == 153:
                return None
            attrs = dict(
                line.strip().split(" = ", 1) for line in done.stdout.splitlines() if " = " in line
            )
            state = {"Q": "queued", "H": "queued", "R": "running", "C": "done"}[attrs["job_state"]]
            code = attrs.get("exit_status")
            return {"state": state, "exit": int(code) if code else None, "reason": "", "raw": attrs}
        done = self.run(
            "bjobs", "-o", "jobid stat exit_code exit_reason pend_reason", "-json", "-a", job_id
        )
        record = json.loads(done.stdout)["RECORDS"][0]
        if "ERROR" in record:
            return None
        state = {
            "PEND": "queued",
            "PSUSP": "queued",
            "RUN": "running",
            "DONE": "done",
            "EXIT": "done",
        }[record["STAT"]]
        code = record["EXIT_CODE"]
        return {
            "state": state,
            "exit": int(code)
            if code
            else (0 if state == "done" and record["STAT"] == "DONE" else None),
            "reason": record["EXIT_REASON"] or record["PEND_REASON"],
            "raw": record,
        }

    def states(self) -> dict:
        """Every known job's generic state from one listing command."""
        if self.flavor == "pbspro":
            jobs = json.loads(self.run("qstat", "-f", "-F", "json", "-x").stdout).get("Jobs", {})
            return {k: "done" if v["job_state"] == "F" else "active" for k, v in jobs.items()}
        if self.flavor == "torque":
            listing = self.run("qstat").stdout.splitlines()[2:]
            return {
                row.split()[0]: "done" if row.split()[4] == "C" else "active" for row in listing
            }
        done = self.run("bjobs", "-a", "-u", "all", "-o", "jobid stat", "-json")
        return {
            r["JOBID"]: "done" if r["STAT"] in ("DONE", "EXIT") else "active"
            for r in json.loads(done.stdout)["RECORDS"]
        }

    def cancel(self, job_id: str, as_root: bool = False) -> subprocess.CompletedProcess:
        return self.run("bkill" if self.flavor == "lsf" else "qdel", job_id, as_root=as_root)

    def wait_state(self, job_id: str, state: str, timeout: float = DEADLINE) -> dict:
        return wait_for(
            lambda: (s := self.status(job_id)) and s["state"] == state and s,
            timeout,
            f"{self.flavor} job {job_id} to be {state}",
        )

    def gpu_args(self, count: int) -> list[str]:
        return {
            "pbspro": ["-l", f"select=1:ncpus=1:ngpus={count}"],
            "torque": ["-l", f"nodes=1:ppn=1:gpus={count}"],
            "lsf": ["-gpu", f"num={count}"],
        }[self.flavor]

    def walltime_args(self, seconds: int) -> list[str]:
        if self.flavor == "lsf":
            return ["-W", str(seconds)]  # one -W minute lasts KLIQUE_SIM_LSF_MINUTE=1 s here
        return ["-l", f"walltime=00:00:{seconds:02d}"]


@contextlib.contextmanager
def simulated(flavor: str) -> Iterator[Cluster]:
    """A simulated `flavor` scheduler for one test; its jobs ended and its folder gone after."""
    python = shutil.which("python3", path=SYSTEM_PATH)
    if python is None:
        pytest.skip(f"the simulators need a python3 in {SYSTEM_PATH}")
    prefix, user = _submitter()
    work = Path(tempfile.mkdtemp(prefix="klique-sim-test-"))
    work.chmod(0o777)
    env = {
        **os.environ,
        "PATH": f"{FAKES / flavor}:{SYSTEM_PATH}",
        "KLIQUE_SIM_DIR": str(work / "state"),
        "KLIQUE_SIM_KILL_DELAY": "1",
        "KLIQUE_SIM_LSF_MINUTE": "1",
        "KLIQUE_SIM_GPUS": "4",
        "KLIQUE_SIM_CPUS": "16",
        # These tests read how jobs ended from PBS Professional's history (off by default:
        # the tests of the server settings below cover that).
        "KLIQUE_SIM_JOB_HISTORY_ENABLE": "true",
    }
    sim = Cluster(flavor, work, env, prefix, user)
    try:
        yield sim
    finally:
        _tear_down(sim)


def _tear_down(sim: Cluster) -> None:
    with contextlib.suppress(Exception):
        active = [j for j, state in sim.states().items() if state == "active"]
        if active:
            sim.run("bkill" if sim.flavor == "lsf" else "qdel", *active, as_root=os.geteuid() == 0)
        wait_for(lambda: "active" not in sim.states().values(), what="jobs to end")
        wait_for(lambda: not _supervisors_alive(sim.work / "state"), what="supervisors to leave")
    shutil.rmtree(sim.work, ignore_errors=True)


def _supervisors_alive(state: Path) -> bool:
    for path in glob.glob(str(state / "*" / "supervisor-*.lock")):
        with open(path) as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
    return False


def as_account(user: str, cluster: Cluster, *argv: str) -> subprocess.CompletedProcess:
    """argv as another account (root only), with the cluster's environment."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run commands as a second account")
    try:
        pwd.getpwnam(user)
    except KeyError:
        pytest.skip(f"needs the test account {user}")
    runuser = shutil.which("runuser", path="/usr/sbin:/sbin:/usr/bin:/bin")
    if runuser is None:
        pytest.skip("needs runuser(1)")
    return subprocess.run(
        [runuser, "-u", user, "--", *argv],
        capture_output=True,
        text=True,
        cwd=cluster.work,
        env=cluster.env,
        timeout=60,
    )
