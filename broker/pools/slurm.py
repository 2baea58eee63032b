"""Slurm: sbatch, one squeue per cycle, sacct for jobs the queue forgot, sinfo for capacity."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from broker.domain import Profile, Task, TaskState
from broker.errors import SubmitError
from broker.pools.batch import BatchDriver, Capacity, NativeStatus, walltime_hms
from broker.pools.registry import PoolKindSpec
from broker.pools.settings import BatchSettings

# squeue(1), "JOB STATE CODES", and sacct(1), "JOB STATE CODES" (Slurm 22.05).
SLURM_STATES: dict[str, TaskState] = {
    "PENDING": TaskState.PENDING,  # PD: awaiting resource allocation
    "CONFIGURING": TaskState.RUNNING,  # CF: allocated, nodes booting
    "RUNNING": TaskState.RUNNING,  # R
    "COMPLETING": TaskState.RUNNING,  # CG: finishing; the exit file is not final yet
    "SUSPENDED": TaskState.RUNNING,  # S: allocation kept, execution suspended
    "STOPPED": TaskState.RUNNING,  # ST: SIGSTOP, allocation kept
    "RESIZING": TaskState.RUNNING,  # RS
    "SIGNALING": TaskState.RUNNING,  # SI: being signalled
    "STAGE_OUT": TaskState.RUNNING,  # SO
    "REQUEUED": TaskState.PENDING,  # RQ: being requeued
    "REQUEUE_HOLD": TaskState.PENDING,  # RH
    "REQUEUE_FED": TaskState.PENDING,  # RF
    "RESV_DEL_HOLD": TaskState.PENDING,  # RD
    "SPECIAL_EXIT": TaskState.PENDING,  # SE: requeued in a special state
    "REVOKED": TaskState.CANCELLED,  # RV: sibling in a federation started it elsewhere
    "COMPLETED": TaskState.COMPLETED,  # CD: all processes ended with exit code 0
    "FAILED": TaskState.FAILED,  # F: non-zero exit code or other failure
    "CANCELLED": TaskState.CANCELLED,  # CA: scancel, by the user or an administrator
    "TIMEOUT": TaskState.TIMEOUT,  # TO: reached its time limit
    "DEADLINE": TaskState.TIMEOUT,  # DL: reached its deadline
    "NODE_FAIL": TaskState.LOST,  # NF: a node it ran on failed
    "BOOT_FAIL": TaskState.LOST,  # BF: a node failed to boot
    "OUT_OF_MEMORY": TaskState.FAILED,  # OOM: over its memory limit
    "PREEMPTED": TaskState.FAILED,  # PR: preempted (requeued by Klique when the pool says so)
}

SLURM_REASONS: dict[str, str] = {
    "FAILED": "the job failed (Slurm FAILED)",
    "TIMEOUT": "ran past its walltime (Slurm TIMEOUT)",
    "DEADLINE": "ran past its deadline (Slurm DEADLINE)",
    "CANCELLED": "cancelled in Slurm",
    "NODE_FAIL": "its node failed (Slurm NODE_FAIL)",
    "BOOT_FAIL": "its node failed to boot (Slurm BOOT_FAIL)",
    "OUT_OF_MEMORY": "ran out of memory (Slurm OUT_OF_MEMORY)",
    "PREEMPTED": "preempted (Slurm PREEMPTED)",
    "REVOKED": "revoked by the federation (Slurm REVOKED)",
    "PENDING": "pending in Slurm's queue",
}

_SEP = "|"
_SQUEUE_FORMAT = _SEP.join(["%i", "%j", "%T", "%r", "%o"])  # id, name, state, reason, script
_SACCT_FORMAT = "JobID,JobName,State,ExitCode"


class SlurmSettings(BatchSettings):
    kind: Literal["slurm"]
    partition: str | None = None
    account: str | None = None  # --account
    qos: str | None = None  # --qos
    gpu_flag: Literal["gres", "gpus"] = "gres"  # --gres=gpu:N or --gpus=N
    accounting: Literal["none", "slurmdbd", "jobcomp"] = "none"  # where sacct reads from
    PYXIS = True  # container_runtime: pyxis starts the runner in srun --container-image


POOL_KIND = PoolKindSpec(
    name="slurm",
    settings=SlurmSettings,
    driver="broker.pools.slurm:SlurmDriver",
    queueing=True,
    summary="a Slurm partition: sbatch, one squeue per cycle, sacct, sinfo",
)


class SlurmDriver(BatchDriver):
    kind = "slurm"
    STATES = SLURM_STATES
    REASONS = SLURM_REASONS
    PREEMPTED = frozenset({"PREEMPTED"})
    SELF_ENDED = frozenset({"COMPLETED", "FAILED"})  # the batch script's own exit or signal
    # sbatch's words when slurmctld cannot be reached (src/common/slurm_protocol_api.c).
    UNREACHABLE = re.compile(
        r"Unable to contact slurm controller|Socket timed out|"
        r"Zero Bytes were transmitted|Connection refused"
    )

    def directives(self, task: Task, profile: Profile, job_dir: str) -> list[str]:
        settings = self.pool.settings
        found = [f"--job-name={task.tag}", f"--comment={task.tag}"]
        for key in ("partition", "account", "qos"):
            if settings.get(key):
                found.append(f"--{key}={settings[key]}")
        gpus = profile.whole_gpus
        if gpus:
            gpu_flag = settings.get("gpu_flag") or "gres"
            found.append(f"--gres=gpu:{gpus}" if gpu_flag == "gres" else f"--gpus={gpus}")
        found += [
            f"--cpus-per-task={profile.cpus}",
            f"--mem={profile.memory_mb}M",
            f"--time={walltime_hms(profile.walltime_s)}",
            f"--output={job_dir}/slurm-%j.out",
        ]
        return found

    def submit_argv(self, script: str) -> list[str]:
        return ["sbatch", "--parsable", script]

    def test_only_argv(self, script: str) -> list[str] | None:
        return ["sbatch", "--test-only", script]

    def parse_submit(self, stdout: str) -> str:
        # sbatch(1) --parsable: "jobid[;cluster_name]"
        first = stdout.strip().splitlines()[-1] if stdout.strip() else ""
        job_id = first.split(";", 1)[0]
        if not job_id.isdigit():
            raise SubmitError(f"sbatch printed no job id: {stdout.strip()!r}")
        return job_id

    def status_argv(self, accounts: Sequence[str]) -> list[str]:
        return [
            "squeue",
            "--noheader",
            "--states=all",
            f"--users={','.join(accounts)}",
            f"--format={_SQUEUE_FORMAT}",
        ]

    def parse_status(self, stdout: str) -> list[NativeStatus]:
        return parse_squeue(stdout)

    def cancel_argv(self, native_id: str) -> list[str]:
        return ["scancel", native_id]

    def capacity_argv(self) -> list[str] | None:
        argv = ["sinfo", "--noheader", "--Format=CPUsState:|,Gres:|,GresUsed:|"]
        if self.pool.settings.get("partition"):
            argv.append(f"--partition={self.pool.settings['partition']}")
        return argv

    def parse_capacity(self, stdout: str) -> Capacity:
        return parse_sinfo(stdout)

    def history_argv(self, native_ids: Sequence[str]) -> list[str] | None:
        accounting = self.pool.settings.get("accounting") or "none"
        if accounting == "none":
            return None
        argv = [
            "sacct",
            "--noheader",
            "--parsable2",
            "--allocations",
            f"--jobs={','.join(native_ids)}",
            f"--format={_SACCT_FORMAT}",
        ]
        return [*argv, "--completion"] if accounting == "jobcomp" else argv

    def parse_history(self, stdout: str) -> list[NativeStatus]:
        return parse_sacct(stdout)


def parse_squeue(stdout: str) -> list[NativeStatus]:
    """`squeue --format=%i|%j|%T|%r|%o` lines (the script last, as a path may hold '|'; older
    captures end at %r); job names are Klique's tags, so never contain '|'."""
    found = []
    for line in stdout.splitlines():
        parts = line.strip().split(_SEP, 4)
        if len(parts) < 4:
            continue
        job_id, name, state, reason = parts[:4]
        script = parts[4] if len(parts) == 5 else ""
        found.append(NativeStatus(job_id, name, state, reason, script=script))
    return found


def parse_sacct(stdout: str) -> list[NativeStatus]:
    """`sacct --parsable2 --format=JobID,JobName,State,ExitCode`; 'CANCELLED by 0' is CANCELLED."""
    found = []
    for line in stdout.splitlines():
        parts = line.strip().split(_SEP)
        if len(parts) < 4 or "." in parts[0]:
            continue
        job_id, name, state, exit_code = parts[:4]
        code, _, _signal = exit_code.partition(":")
        found.append(
            NativeStatus(
                job_id,
                name,
                state.split()[0] if state else "",
                exit_code=int(code) if code.isdigit() else None,
            )
        )
    return found


def parse_sinfo(stdout: str) -> Capacity:
    """`sinfo --Format=CPUsState:|,Gres:|,GresUsed:|`: A/I/O/T CPUs, gpu:N, gpu:N(IDX:...)."""
    idle_cpus = 0
    free_gpus = 0
    for line in stdout.splitlines():
        parts = line.strip().split(_SEP)
        if len(parts) < 3:
            continue
        cpus = parts[0].split("/")
        if len(cpus) == 4 and cpus[1].isdigit():
            idle_cpus += int(cpus[1])
        free_gpus += max(0, _gpu_count(parts[1]) - _gpu_count(parts[2]))
    return Capacity(free_gpus=float(free_gpus), free_cpus=idle_cpus)


def _gpu_count(gres: str) -> int:
    total = 0
    for item in re.findall(r"gpu(?::[^:,(]+)?:(\d+)", gres):
        total += int(item)
    return total
