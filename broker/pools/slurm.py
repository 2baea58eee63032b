"""Slurm: sbatch, one squeue per cycle (one per account where PrivateData=jobs hides other
users' jobs), sacct for jobs the queue forgot, sinfo for capacity."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from markupsafe import Markup
from pydantic import model_validator

from broker.domain import Pool, Profile, Task, TaskState
from broker.errors import KliqueError, SubmitError
from broker.execution import Observation
from broker.pools.base import Context
from broker.pools.batch import BatchDriver
from broker.pools.native import Capacity, NativeStatus
from broker.pools.registry import PoolKindSpec
from broker.pools.settings import BatchSettings, settings_as
from broker.pools.staging import walltime_hms
from broker.transport import Transport

# squeue(1), "JOB STATE CODES", and sacct(1), "JOB STATE CODES" (Slurm 22.05).
SLURM_STATES: dict[str, TaskState] = {
    "PENDING": TaskState.PENDING,  # PD: awaiting resource allocation
    "CONFIGURING": TaskState.RUNNING,  # CF: allocated, waiting for it to be ready (booting)
    "RUNNING": TaskState.RUNNING,  # R
    "COMPLETING": TaskState.RUNNING,  # CG: finishing; the exit file is not final yet
    "SUSPENDED": TaskState.RUNNING,  # S: allocation kept, execution suspended, CPUs released
    "STOPPED": TaskState.RUNNING,  # ST: SIGSTOP, allocation kept
    "RESIZING": TaskState.RUNNING,  # RS
    "SIGNALING": TaskState.RUNNING,  # SI: being signalled
    "STAGE_OUT": TaskState.RUNNING,  # SO
    "REQUEUED": TaskState.PENDING,  # RQ: being requeued
    "REQUEUE_HOLD": TaskState.PENDING,  # RH: held while requeued (SLURM_HELD says what to do)
    "REQUEUE_FED": TaskState.PENDING,  # RF: requeued by its federation
    "RESV_DEL_HOLD": TaskState.PENDING,  # RD: held, its reservation was deleted (SLURM_HELD)
    "SPECIAL_EXIT": TaskState.PENDING,  # SE: requeued in a special state, held (SLURM_HELD)
    # EXPEDITING (Slurm 25.11, a state flag: JOB_EXPEDITING, "checking for expedited requeue"):
    # a job submitted with --requeue=expedite (SlurmctldParameters=enable_expedited_requeue)
    # that failed on a node its Epilog found unhealthy, or whose node went down, is requeued
    # ahead of every other job (SchedMD's testsuite, "Expedited requeue"). It waits to run again.
    "EXPEDITING": TaskState.PENDING,
    # RV: this cluster's sibling of a federated job, revoked because another cluster of the
    # federation started the job: the task runs there, and its exit file decides.
    "REVOKED": TaskState.RUNNING,
    "COMPLETED": TaskState.COMPLETED,  # CD: all processes ended with exit code 0
    "FAILED": TaskState.FAILED,  # F: non-zero exit code or other failure
    "CANCELLED": TaskState.CANCELLED,  # CA: scancel, by the user or an administrator
    "TIMEOUT": TaskState.TIMEOUT,  # TO: reached its time limit
    "DEADLINE": TaskState.TIMEOUT,  # DL: reached its deadline
    "NODE_FAIL": TaskState.LOST,  # NF: a node it ran on failed
    "BOOT_FAIL": TaskState.LOST,  # BF: launch failure (node boot) and not requeued: it never ran
    "OUT_OF_MEMORY": TaskState.FAILED,  # OOM: over its memory limit
    "PREEMPTED": TaskState.FAILED,  # PR: preempted (requeued by Klique when the pool says so)
}

# Phases of a job that holds its allocation without running its script: squeue(1), "JOB STATE
# CODES": CF "allocated resources, but are waiting for them to become ready for use (e.g.
# booting)"; S "has an allocation, but execution has been suspended and CPUs have been released
# for other jobs" (gang scheduling, or PreemptMode=SUSPEND in slurm.conf(5)). Not charged
# unless the pool's `charge_phases` names them.
SLURM_PHASES: dict[str, str] = {
    "CONFIGURING": "configuring",
    "SUSPENDED": "suspended",
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
    "REVOKED": "running on another cluster of the federation (Slurm REVOKED here)",
    "EXPEDITING": (
        "requeued ahead of other jobs after its node failed or its Epilog found the node "
        "unhealthy (Slurm EXPEDITING, --requeue=expedite)"
    ),
    "REQUEUE_HOLD": "requeued and held (Slurm REQUEUE_HOLD)",
    "SPECIAL_EXIT": "requeued and held (Slurm SPECIAL_EXIT)",
    "RESV_DEL_HOLD": "held (Slurm RESV_DEL_HOLD)",
    "PENDING": "pending in Slurm's queue",
    "CONFIGURING": "its nodes are booting (Slurm CONFIGURING)",
    "SUSPENDED": "suspended (Slurm SUSPENDED: gang scheduling or preemption)",
}

# Jobs Slurm holds after it requeued them: they wait for a release that nobody gives unless
# told. Keyed by squeue's state, or by its reason (slurmctld's state_desc, src/slurmctld/
# job_mgr.c and agent.c); each says what to do, with the job's id for "{job}". "launch failed
# requeued held" is not here: the pool's `requeued_held` acts on it (HELD_AFTER_FAILED_LAUNCH).
SLURM_HELD: dict[str, str] = {
    # Also where Slurm 25.11's --requeue=expedite puts a job that failed on nodes whose Epilogs
    # all found them healthy: the failure is the job's own (SchedMD's testsuite, "Expedited
    # requeue"), so running it again as it is may fail again.
    "REQUEUE_HOLD": (
        "requeued and held (`scontrol requeuehold`, or --requeue=expedite after the job failed "
        "on healthy nodes); `scontrol release {job}` runs it again, `klique cancel` ends the task"
    ),
    # What squeue shows once a `scontrol requeuehold` is done: PENDING with this reason
    # (tests/data/slurm/squeue-requeue-held.txt, Slurm 22.05).
    "job requeued in held state": (
        "requeued and held by an operator (`scontrol requeuehold`); `scontrol release {job}` "
        "runs it again, `klique cancel` ends the task"
    ),
    "SPECIAL_EXIT": (
        "requeued in Slurm's special-exit state (the site's EpilogSlurmctld, or "
        "`scontrol requeuehold state=SpecialExit`, marks an exit code to look at) and held; "
        "`scontrol release {job}` runs it again, `klique cancel` ends the task"
    ),
    "RESV_DEL_HOLD": (
        "held because its reservation was deleted; `scontrol release {job}` lets it run "
        "outside the reservation, `klique cancel` ends the task"
    ),
    "user env retrieval failed requeued held": (
        "held after slurmd could not load the account's login environment on the node "
        "(sbatch --get-user-env); fix the account's shell start-up files, then `scontrol "
        "release {job}`, or `klique cancel` the task"
    ),
    "launch failure limit exceeded requeued held": (
        "held after its launch failed more often than Slurm allows (SchedulerParameters "
        "max_batch_requeue); an administrator checks the nodes, then `scontrol release "
        "{job}`, or `klique cancel` the task"
    ),
}

log = logging.getLogger("klique.pools")

_SEP = "|"
# squeue(1) --Format: a field with the suffix "|" and no size is printed whole, then "|". The
# script comes last (a path may hold "|"); RestartCnt counts Slurm's requeues of the job.
# JobArrayID is a job's id, or an array element's "ARRAY_INDEX" (with --array, each element a line).
_SQUEUE_FIELDS = "JobArrayID:|,Name:|,State:|,Reason:|,RestartCnt:|,Command:"
_SACCT_FORMAT = "JobID,JobName,State,ExitCode"
_GPU_DIRECTIVE = {
    "gres": "--gres=gpu:{}",
    "gpus-per-node": "--gpus-per-node={}",
    "gpus": "--gpus={}",
}


class SlurmSettings(BatchSettings):
    """A Slurm partition (docs/slurm-sites.md)."""

    kind: Literal["slurm"]
    """Says the pool is a Slurm partition."""
    partition: str | None = None
    """The partition jobs go to (`--partition`; unset: the cluster's default)."""
    account: str | None = None
    """The Slurm account jobs are charged to (`--account`)."""
    qos: str | None = None
    """The quality of service of the jobs (`--qos`)."""
    gpu_flag: Literal["gres", "gpus-per-node", "gpus"] = "gres"
    """How GPUs are asked for: `--gres=gpu:N` and `--gpus-per-node=N` ask for the GPUs on the
    task's node; `--gpus=N` is job-wide (sbatch(1)), kept for sites that count GPUs only that
    way."""
    requeue: Literal["slurm", "klique", "none"] = "slurm"
    """Who runs a job again after a node failure or a preemption (sbatch(1) --requeue,
    --no-requeue; slurm.conf(5) JobRequeue): Slurm, Klique (requeue_preempted, and NODE_FAIL
    sent back to Klique's queue), or nobody."""
    requeued_held: Literal["release", "withdraw"] = "release"
    """A job Slurm requeued and held after its launch failed ("launch failed requeued held"):
    released in place, or withdrawn (cancelled; the task goes again from Klique's queue)."""
    accounting: Literal["none", "slurmdbd", "jobcomp"] = "none"
    """Where sacct reads finished jobs from (`none`: the exit file alone decides)."""
    status_account: str | None = None
    """An account Slurm shows every user's jobs to (an operator or administrator in sacctmgr,
    or SlurmUser): with PrivateData=jobs, status is then one query as it instead of one per
    account."""
    PYXIS = True  # container_runtime: pyxis starts the runner in srun --container-image

    @model_validator(mode="before")
    @classmethod
    def _one_owner_of_retries(cls, data: Any) -> Any:
        """`requeue: klique` is Klique running a preempted job, or one whose node failed,
        again; `none` is nobody."""
        if not isinstance(data, dict):
            return data
        wanted = {"klique": True, "none": False}.get(str(data.get("requeue")))
        given = data.get("requeue_preempted")
        if wanted is None:
            return data
        if given is not None and bool(given) != wanted:
            raise ValueError(
                f"requeue: {data['requeue']} contradicts requeue_preempted: {given}; fix: drop "
                "requeue_preempted (requeue says who runs a preempted job again)"
            )
        return {**data, "requeue_preempted": wanted}


POOL_KIND = PoolKindSpec(
    name="slurm",
    settings=SlurmSettings,
    driver="broker.pools.slurm:SlurmDriver",
    queueing=True,
    spans_nodes=True,
    summary="a Slurm partition: sbatch, one squeue per cycle, sacct, sinfo",
)


class SlurmDriver(BatchDriver):
    kind = "slurm"
    STATES = SLURM_STATES
    REASONS = SLURM_REASONS
    PREEMPTED = frozenset({"PREEMPTED"})
    SELF_ENDED = frozenset({"COMPLETED", "FAILED"})  # the batch script's own exit or signal
    PHASES = SLURM_PHASES
    # sacct(1): BOOT_FAIL ends a job whose launch failed and that Slurm could not requeue.
    NEVER_RAN = frozenset({"BOOT_FAIL"})
    # squeue(1) after `scontrol requeue`, a node failure or a preemption: COMPLETING, with the
    # restart count already grown, while the old run ends (observed on Slurm 22.05).
    ENDING = frozenset({"COMPLETING"})
    # slurmctld (src/slurmctld/job_mgr.c) requeues a batch job whose launch failed and holds
    # it: squeue's reason reads "launch failed requeued held". A hold of an operator's own
    # (`scontrol requeuehold`, JobHeldAdmin, JobHeldUser) is left alone.
    HELD_AFTER_FAILED_LAUNCH = re.compile(r"launch failed requeued held")
    # sacct(1): NODE_FAIL ends a job whose node failed and that Slurm did not requeue (the
    # script says --no-requeue unless `requeue: slurm`): `requeue: klique` runs it again.
    NODE_FAILED = frozenset({"NODE_FAIL"})
    # What each sbatch failure proves (src/common/slurm_errno.c's texts; sbatch's own errors
    # pass through _remap_slurmctld_errno in src/common/slurm_protocol_api.c, which names a
    # failed send or receive of a request to slurmctld after the step it failed in):
    #
    #   sbatch says                                             what it proves
    #   Unable to contact slurm controller (connect failure)    refused: nothing queued (pool down)
    #   Connection refused                                      refused: nothing queued (pool down)
    #   Unable to contact slurm controller (send failure)       refused: no whole request was sent
    #   Unable to contact slurm controller (receive failure)    unknown: sent, the reply was lost
    #   Socket timed out on send/recv operation                 unknown: may have been received
    #   Zero Bytes were transmitted or received                 unknown: may have been received
    #   Connection reset by peer                                unknown: may have been received
    #   Incomplete message (SLURM_PROTOCOL_INCOMPLETE_PACKET)   unknown: may have been received
    #   anything else (slurmctld's own refusal)                 refused: the task fails
    #
    # SUBMIT_UNKNOWN is matched first: the task's tag is looked up before it goes again.
    UNREACHABLE = re.compile(
        r"Unable to contact slurm controller|Socket timed out|"
        r"Zero Bytes were transmitted|Connection refused"
    )
    SUBMIT_UNKNOWN = re.compile(
        r"receive failure|Socket timed out|Zero Bytes were transmitted|"
        r"Connection reset by peer|Incomplete (?:message|packet)"
    )
    # slurm.conf(5) MessageTimeout: default 10 s; the pool's start reads slurmctld's.
    MESSAGE_TIMEOUT_S = 10.0
    # sbatch(1) --array: each element's index in SLURM_ARRAY_TASK_ID; squeue and scancel name
    # an element ARRAYID_INDEX. slurm.conf(5) MaxArraySize (default 1001) bounds the index:
    # the pool's start reads it.
    ARRAY_INDEX = "SLURM_ARRAY_TASK_ID"
    SHOWS_SCRIPT = True  # squeue's Command: the script's path, "(null)" for sbatch --wrap
    DIRECTIVE = "#SBATCH"

    settings: SlurmSettings

    def __init__(self, pool: Pool, context: Context, transport: Transport | None = None) -> None:
        super().__init__(pool, context, transport)
        self.settings = settings_as(pool, SlurmSettings)
        self._config_read = False

    def query_account(self) -> str:
        return self.settings.status_account or super().query_account()

    def held(self, status: NativeStatus) -> str:
        return held_advice(status)

    @property
    def withdraws_held(self) -> bool:
        return self.settings.requeued_held == "withdraw"

    @property
    def reruns_node_failures(self) -> bool:
        return self.settings.requeue == "klique"

    async def check(self) -> list[str]:
        problems = await super().check()
        await self._read_config()
        return problems

    async def poll(self, tasks: Sequence[Task]) -> dict[int, Observation]:
        if not self._config_read:
            await self._read_config()
        return await super().poll(tasks)

    async def _read_config(self) -> None:
        """slurmctld's settings (`scontrol show config`, as the query account), until they
        read: MaxArraySize bounds an array; and unless the pool says how status runs,
        PrivateData=jobs makes it one query per mapped account (or one as `status_account`)."""
        account = self.query_account()
        try:
            done = await self.transport.run(
                ["scontrol", "show", "config"], account=account, timeout=30
            )
            config = done.stdout if done.returncode == 0 else None
        except KliqueError:
            config = None
        self._config_read = config is not None
        largest = config_value(config or "", "MaxArraySize")
        if largest is not None and largest.isdigit():
            self.max_array = int(largest)  # indices 0 to MaxArraySize - 1
        timeout = parse_message_timeout(config or "")
        if timeout is not None and not self.settings.message_timeout:
            self.message_timeout_s = timeout
        if not self._detect_per_account:
            return  # the pool's status_per_account decides
        private = parse_private_data(config) if config is not None else None
        mode = status_mode(private, self.settings.status_account, account)
        self._per_account = mode.per_account
        self.notes = [mode.note]
        log.info("pool %s: %s", self.pool.name, mode.note)

    def directives(self, task: Task, profile: Profile, job_dir: str) -> list[str]:
        settings = self.settings
        found = [f"--job-name={task.tag}", f"--comment={task.tag}"]
        for key, value in (
            ("partition", settings.partition),
            ("account", settings.account),
            ("qos", settings.qos),
        ):
            if value:
                found.append(f"--{key}={value}")
        gpus = profile.whole_gpus
        flag = settings.gpu_flag
        if profile.nodes > 1:  # sbatch(1): one task a node, and what each node holds
            found += [f"--nodes={profile.nodes}", "--ntasks-per-node=1"]
            if flag == "gpus":  # --gpus is job-wide: every node's GPUs
                gpus *= profile.nodes
        if gpus:
            found.append(_GPU_DIRECTIVE[flag].format(gpus))
        found.append("--requeue" if settings.requeue == "slurm" else "--no-requeue")
        # The job's environment is sbatch's: the submit step starts it with the job's variables
        # only (fileops.SLURM_JOB_ENV). A list here would have slurmd add the account's login
        # environment, from a login shell it runs for every job (sbatch(1) --export).
        found.append("--export=ALL")
        signal = self.context.estate.resources[task.resource].checkpoint_signal
        if signal is not None and profile.nodes > 1:  # every step: the runners srun started
            found.append(f"--signal={signal.signal}@{signal.before_s}")
        elif signal is not None:  # B: to the batch shell, which is the runner (it execs it)
            found.append(f"--signal=B:{signal.signal}@{signal.before_s}")
        found += [
            f"--cpus-per-task={profile.cpus}",
            f"--mem={profile.memory_mb}M",
            f"--time={walltime_hms(profile.walltime_s)}",
            f"--output={job_dir}/slurm-%j.out",
        ]
        return found

    def render(self, task: Task, job_dir: str | None = None) -> str:
        """The job script; a task with an image on several nodes of a Pyxis pool is refused
        here, before any sbatch, rather than failing once its allocation is granted."""
        nodes = self.context.estate.resources[task.resource].profile.nodes
        if task.spec.image and self.settings.container_runtime == "pyxis" and nodes > 1:
            raise SubmitError(pyxis_one_node(self.pool.name, task.resource, nodes))
        return super().render(task, job_dir)

    def node_launch(self, profile: Profile) -> Markup:
        """srun(1): one runner on each node; --kill-on-bad-exit=1 ends the others when one
        exits non-zero (the task then ends with that rank's reason)."""
        if profile.nodes <= 1:
            return Markup("")
        return Markup(  # noqa: S704 - numbers only
            f"srun --nodes={int(profile.nodes)} --ntasks-per-node=1 "
            f"--cpus-per-task={int(profile.cpus)} --kill-on-bad-exit=1"
        )

    def array_directives(self, shared: Sequence[str], count: int) -> list[str]:
        return [*shared, f"{self.DIRECTIVE} --array=0-{count - 1}"]

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
            "--all",  # also jobs in hidden partitions and those the account may not use
            "--states=all",
            "--array",  # an array's elements one a line, each by its own id
            f"--users={','.join(accounts)}",
            f"--Format={_SQUEUE_FIELDS}",
        ]

    def parse_status(self, stdout: str) -> list[NativeStatus]:
        return parse_squeue(stdout)

    def cancel_argv(self, native_id: str) -> list[str]:
        return ["scancel", native_id]

    def release_argv(self, native_id: str) -> list[str] | None:
        return ["scontrol", "release", native_id]

    def capacity_argv(self) -> list[str] | None:
        argv = ["sinfo", "--noheader", "--Format=CPUsState:|,Gres:|,GresUsed:|,NodeAIOT:|"]
        if self.settings.partition:
            argv.append(f"--partition={self.settings.partition}")
        return argv

    def parse_capacity(self, stdout: str) -> Capacity:
        return parse_sinfo(stdout)

    def history_argv(self, native_ids: Sequence[str]) -> list[str] | None:
        accounting = self.settings.accounting
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


def pyxis_one_node(pool: str, resource: str, nodes: int) -> str:
    """Why a task on several nodes cannot run its image on a Pyxis pool, and what to do.

    The template starts the runner inside the image with one `srun --ntasks=1
    --container-image` step (templates/slurm/default.sh.j2): one node's runner, none on the
    others, so the task would fail only once Slurm had granted every node."""
    return (
        f"pool {pool} starts a task's image with Pyxis (container_runtime: pyxis), in one srun "
        f"step on one node, and compute resource {resource} asks for {nodes} nodes; fix: set "
        f"the resource's nodes: 1, or serve it from a pool whose container_runtime is enroot, "
        f"apptainer or charliecloud, or unset (the runner then starts the image on every node)"
    )


@dataclass(frozen=True)
class StatusMode:
    per_account: bool
    note: str


def status_mode(private: frozenset[str] | None, status_account: object, account: str) -> StatusMode:
    """How status sees every job Klique owns, given slurmctld's PrivateData (None: unknown)."""
    if private is None:
        return StatusMode(
            True,
            "PrivateData could not be read (scontrol show config): status runs one squeue per "
            "mapped account, which sees every job whatever the site's settings",
        )
    if not private & {"jobs", "all"}:
        return StatusMode(False, f"PrivateData={_shown(private)}: one squeue --all as {account}")
    if status_account:
        return StatusMode(
            False,
            f"PrivateData={_shown(private)} hides other users' jobs: one squeue as the pool's "
            f"status_account {account}",
        )
    return StatusMode(
        True,
        f"PrivateData={_shown(private)} hides other users' jobs: one squeue (and sacct) per "
        "mapped account per cycle; name a status_account Slurm shows every job to for one query",
    )


def _shown(private: frozenset[str]) -> str:
    return ",".join(sorted(private)) or "none"


def held_advice(status: NativeStatus) -> str:
    """What to do about a job Slurm requeued and holds (SLURM_HELD); "" for any other job."""
    advice = SLURM_HELD.get(status.state) or SLURM_HELD.get(status.reason.strip())
    return advice.format(job=status.native_id) if advice else ""


def parse_private_data(stdout: str) -> frozenset[str] | None:
    """`scontrol show config`'s `PrivateData = jobs,usage` (or `none`); None when absent.
    slurm.conf(5), "PrivateData": accounts, cloud, events, jobs, nodes, partitions,
    reservations, usage, users."""
    value = config_value(stdout, "PrivateData")
    if value is None:
        return None
    words = {w.strip().lower() for w in value.split(",") if w.strip()}
    return frozenset(words - {"none", "(null)"})


def parse_message_timeout(stdout: str) -> float | None:
    """`scontrol show config`'s `MessageTimeout = 10 sec` in seconds; None when absent."""
    found = re.match(r"(\d+)", config_value(stdout, "MessageTimeout") or "")
    return float(found[1]) if found else None


def config_value(stdout: str, name: str) -> str | None:
    """One setting's value in `scontrol show config` ("Name = value"); None when absent."""
    for line in stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == name:
            return value.strip()
    return None


def parse_squeue(stdout: str) -> list[NativeStatus]:
    """`squeue --Format=JobArrayID:|,Name:|,State:|,Reason:|,RestartCnt:|,Command:` lines (the
    script last, as a path may hold '|'; older captures have no restart count, or end at the
    reason); job names are Klique's tags, so never contain '|'."""
    found = []
    for line in stdout.splitlines():
        parts = line.strip().split(_SEP, 5)
        if len(parts) < 4:
            continue
        job_id, name, state, reason = parts[:4]
        rest = parts[4:]
        restarts = int(rest.pop(0)) if len(rest) == 2 and rest[0].isdigit() else None
        script = _SEP.join(rest)
        script = "" if script == "(null)" else script
        found.append(NativeStatus(job_id, name, state, reason, script=script, restarts=restarts))
    return found


def parse_sacct(stdout: str) -> list[NativeStatus]:
    """`sacct --parsable2 --format=JobID,JobName,State,ExitCode`; 'CANCELLED by 0' is CANCELLED."""
    found = []
    for line in stdout.splitlines():
        parts = line.strip().split(_SEP)
        if len(parts) < 4 or "." in parts[0]:
            continue
        job_id, name, state, exit_code = parts[:4]
        state = state.split()[0] if state else ""
        found.append(NativeStatus(job_id, name, state, exit_code=_exit(exit_code)))
    return found


def _exit(exit_code: str) -> int | None:
    """sacct's `ExitCode` is `code:signal`; a job ended by a signal reads 128 + signal, as a
    shell says, under both accountings (the job-completion file and slurmdbd agree on the
    signal; slurmdbd records a code of 128 or more less 128: docs/slurm-sites.md)."""
    code, _, signal = exit_code.partition(":")
    if signal.isdigit() and int(signal):
        return 128 + int(signal)
    return int(code) if code.isdigit() else None


def parse_sinfo(stdout: str) -> Capacity:
    """`sinfo --Format=CPUsState:|,Gres:|,GresUsed:|,NodeAIOT:|`: A/I/O/T CPUs, gpu:N,
    gpu:N(IDX:...), A/I/O/T nodes. sinfo(1) prints one line for the nodes that share every
    field: the CPUs are summed over them, the GRES are each node's, so they count once a node;
    the idle nodes are those a task on several nodes may start on (without the node counts, an
    older capture: one node a line, none counted idle)."""
    idle_cpus = 0
    free_gpus = 0
    idle_nodes: int | None = None
    for line in stdout.splitlines():
        parts = line.strip().split(_SEP)
        if len(parts) < 3:
            continue
        cpus = parts[0].split("/")
        if len(cpus) == 4 and cpus[1].isdigit():
            idle_cpus += int(cpus[1])
        nodes = parts[3].split("/") if len(parts) > 3 else []
        counted = len(nodes) == 4 and all(n.isdigit() for n in nodes)
        each = int(nodes[3]) if counted else 1
        free_gpus += max(0, _gpu_count(parts[1]) - _gpu_count(parts[2])) * each
        if counted:
            idle_nodes = (idle_nodes or 0) + int(nodes[1])
    return Capacity(free_gpus=float(free_gpus), free_cpus=idle_cpus, free_nodes=idle_nodes)


def _gpu_count(gres: str) -> int:
    total = 0
    for item in re.findall(r"gpu(?::[^:,(]+)?:(\d+)", gres):
        total += int(item)
    return total
