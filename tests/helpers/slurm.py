"""What the real Slurm cluster recorded of the jobs a test caused, read from Slurm itself (not
from Klique): squeue for the jobs it still holds, and on request the job-completion record
(sacct --completion and the jobcomp file) for those it has let go."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from broker.pools.arrays import ARRAY_NAME

# The shared cluster of scripts/slurm-up (conftest_services.slurm_cluster): its jobcomp file.
JOBCOMP = Path(os.environ.get("KLIQUE_SLURM_DIR", "/tmp/klique-slurm")) / "log" / "jobcomp.txt"
# Every job, every account's (as root), in every partition (hidden ones too), array elements
# each on a line of its own: id|name|state|batch script.
SQUEUE = ["squeue", "--all", "--noheader", "--states=all", "--array", "--format=%i|%j|%T|%o"]
# A job-completion record (jobcomp/filetxt) of an array element: sacct --completion (Slurm
# 22.05) cannot read its ArrayJobId and ArrayTaskId, so the file itself is read.
_ELEMENT_RECORD = re.compile(r"Name=(\S+) JobState=(\S+) .*\bArrayJobId=(\d+) ArrayTaskId=(\d+)")


@dataclass(frozen=True)
class SlurmJob:
    """One job as Slurm recorded it."""

    job_id: int  # the job's id; an array element's, its array's
    name: str  # Klique's tag, klique-<task id> (or an array's name)
    state: str  # Slurm's word: PENDING, RUNNING, COMPLETED, CANCELLED, ...
    index: int | None = None  # an array element's index
    script: str = ""  # the batch script's path, while squeue shows the job

    @property
    def native_id(self) -> str:
        return str(self.job_id) if self.index is None else f"{self.job_id}_{self.index}"


def slurm_jobs(
    under: str | Path | None = None,
    *,
    since_job: int = 0,
    recorded_since: float | None = None,
    conf: Path | None = None,
) -> dict[str, list[SlurmJob]]:
    """Slurm's jobs by job name: those squeue shows whose batch script lies under the folder
    `under` (any, if None) and whose id is above `since_job`; with `recorded_since` (a time),
    also those the completion record has kept since then, a later look at a job replacing an
    earlier. `conf`: the cluster's slurm.conf, for a private cluster."""
    found: dict[str, SlurmJob] = {}
    if recorded_since is not None:
        found |= {job.native_id: job for job in recorded_jobs(recorded_since)}
    found |= {job.native_id: job for job in queued_jobs(under, conf)}
    by_name: dict[str, list[SlurmJob]] = {}
    for job in found.values():
        if job.job_id > since_job:
            by_name.setdefault(job.name, []).append(job)
    return by_name


def newest_job_id() -> int:
    """The highest job id the shared cluster shows or recorded in the last day (0: none)."""
    jobs = slurm_jobs(recorded_since=time.time() - 86400).values()
    return max((job.job_id for named in jobs for job in named), default=0)


def queued_jobs(under: str | Path | None = None, conf: Path | None = None) -> list[SlurmJob]:
    """The jobs squeue shows (every account's), those whose script lies under `under` if
    given; an array still pending as a whole is left out (it has no element yet)."""
    env = None if conf is None else {"PATH": "/usr/bin:/bin", "SLURM_CONF": str(conf)}
    prefix = None if under is None else str(under).rstrip("/") + "/"
    jobs = [parse_squeue_line(line) for line in _run(SQUEUE, env=env).splitlines()]
    return [
        job for job in jobs if job is not None and (prefix is None or job.script.startswith(prefix))
    ]


def parse_squeue_line(line: str) -> SlurmJob | None:
    """One line of SQUEUE's output, or None for one that names no single job."""
    parts = line.strip().split("|", 3)
    if len(parts) != 4:
        return None
    array, _, index = parts[0].partition("_")
    if not array.isdigit() or (index and not index.isdigit()):
        return None
    return SlurmJob(int(array), parts[1], parts[2], int(index) if index else None, parts[3])


def recorded_jobs(since: float, jobcomp: Path = JOBCOMP) -> list[SlurmJob]:
    """The shared cluster's completion record since `since`: whole jobs as sacct --completion
    reads them, array elements from the jobcomp file, in the order written (an element's last
    record is its latest)."""
    found: list[SlurmJob] = []
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since - 120))
    # As a test account: root's `sacct --completion` (Slurm 22.05) opens the job-completion file
    # to append and sets it back to 0644, after which the accounts can no longer read it.
    sacct = ["runuser", "-u", "alice", "--", "sacct", "--completion", "--allusers", "--noheader"]
    sacct += ["--parsable2", "--format=JobID,JobName,State", f"--starttime={stamp}"]
    for line in _run(sacct).split("\n"):
        parts = line.split("|")
        if len(parts) >= 3 and parts[0].isdigit() and not ARRAY_NAME.fullmatch(parts[1]):
            found.append(SlurmJob(int(parts[0]), parts[1], parts[2].split()[0]))
    lines = jobcomp.read_text(errors="replace").splitlines() if jobcomp.exists() else []
    for line in lines:
        match = _ELEMENT_RECORD.search(line)
        if match and ARRAY_NAME.fullmatch(match[1]):
            found.append(SlurmJob(int(match[3]), match[1], match[2], int(match[4])))
    return found


def _run(argv: Sequence[str], timeout: float = 60, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, check=False, env=env
    )
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout
