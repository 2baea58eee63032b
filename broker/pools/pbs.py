"""PBS Professional and Torque (the pool's `dialect`): qsub, one `qstat -f` per cycle naming the
pool's jobs (one per account where the server hides other users' jobs), qdel. A finished job is
told apart by its exit status, substate and walltime used; the exit file decides. PBS
Professional's run_count tells a job requeued (qrerun) while it ran. A sweep goes as one job
array in both dialects (qsub -J, Torque's qsub -t; docs/job-arrays.md)."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from markupsafe import Markup

from broker.domain import Pool, Profile, Task, TaskState
from broker.errors import KliqueError, SubmitError, TransportError
from broker.pools.base import Context, Observation
from broker.pools.batch import BatchDriver, NativeStatus, unreadable, walltime_hms
from broker.pools.pbs_json import job_records
from broker.pools.registry import PoolKindSpec
from broker.pools.settings import BatchSettings
from broker.transport import Completed, Transport

log = logging.getLogger("klique.pools")

# PBS Professional 2022 Reference Guide, qstat(1B) "Job States" (job_state of
# pbs_job_attributes(7B)), and the TORQUE 6.1 Administrator Guide, qstat "job states".
# The finished states (PBS Professional F, X for a subjob; Torque C) are in PBS_ENDINGS.
PBS_STATES: dict[str, TaskState] = {
    "Q": TaskState.PENDING,  # queued, eligible to run or be routed
    "H": TaskState.PENDING,  # held
    "W": TaskState.PENDING,  # waiting for its execution time (qsub -a) or for stage-in
    "T": TaskState.PENDING,  # being moved to a new location
    "R": TaskState.RUNNING,  # running
    "S": TaskState.RUNNING,  # suspended; the allocation is kept
    "U": TaskState.RUNNING,  # PBS Professional: suspended while its workstation is busy
    "E": TaskState.RUNNING,  # exiting after having run: the exit file is not final yet
    "B": TaskState.RUNNING,  # PBS Professional: an array job with a subjob started
    "M": TaskState.LOST,  # PBS Professional: moved to another server, where this id is not valid
}

# Running jobs whose execution is suspended (qstat(1B): S by qsig -s suspend or preemption, U
# while its workstation is busy): not charged unless the pool's `charge_phases` names them, as
# Slurm's SUSPENDED and LSF's USUSP and SSUSP (one rule, docs/pbs-lsf-sites.md).
PBS_PHASES: dict[str, str] = {
    "S": "suspended",
    "U": "suspended",
}

# How a finished job ended, from its exit status (see `ending`).
PBS_ENDINGS: dict[str, TaskState] = {
    "completed": TaskState.COMPLETED,  # exit status 0
    "failed": TaskState.FAILED,  # 1-255: the job script's own exit status
    "signal": TaskState.FAILED,  # 256 + N: killed by signal N
    "deleted": TaskState.CANCELLED,  # qdel: no exit status (never ran), or SIGTERM while running
    "walltime": TaskState.TIMEOUT,  # killed by PBS for running past its walltime
    "memory": TaskState.FAILED,  # killed by PBS for going over its memory limit
    "limit": TaskState.FAILED,  # killed by PBS for going over a CPU limit
    "exec": TaskState.FAILED,  # PBS could not start or keep the job (other JOB_EXEC_* codes)
    # Substate 93 with no exit status: the job's MoM went down while it ran and the job was not
    # rerunnable (OpenPBS req_jobobit.c, on_job_exit; discard_job): nobody deleted it.
    "host": TaskState.LOST,
    # A subjob that ended and shows through its array (see `_status`): how is not kept.
    "ended": TaskState.COMPLETED,
}
_FINISHED = ("F", "X", "C")  # PBS Professional F and X, Torque C
_WAITING = frozenset({"Q", "H", "W", "T"})  # states of a job that waits to run (again)

# PBS Professional Administrator's Guide, "Job Exit Status" (OpenPBS src/include/job.h). The
# MoM keeps these over the job's own status (catch_child.c). JOB_EXEC_KILL_* came with OpenPBS
# 22.05 and PBS Professional 2021.1; before, a limit kill is SIGTERM, then SIGKILL after
# kill_delay, and the job's own status is reported (271, 265, or 143 and even 0 when the
# script caught the signal): see `ending`.
PBSPRO_EXEC_CODES: dict[int, str] = {
    -24: "limit",  # JOB_EXEC_KILL_NCPUS_BURST
    -25: "limit",  # JOB_EXEC_KILL_NCPUS_SUM
    -26: "memory",  # JOB_EXEC_KILL_VMEM
    -27: "memory",  # JOB_EXEC_KILL_MEM
    -28: "limit",  # JOB_EXEC_KILL_CPUT
    -29: "walltime",  # JOB_EXEC_KILL_WALLTIME
}
# TORQUE 6.1 Administrator Guide, "Job Exit Status" (the JOB_EXEC_* table). Torque's qstat
# shows no substate, so a deletion is read from its exit status: qdel ends a running job with
# SIGTERM, reported as 256 + 15 when the signal killed it and as the script's own 128 + 15 when
# it caught the signal and exited (as the runner does; its exit file decides first).
TORQUE_EXEC_CODES: dict[int, str] = {
    -10: "memory",  # JOB_EXEC_OVERLIMIT_MEM: job exceeded a memory limit
    -11: "walltime",  # JOB_EXEC_OVERLIMIT_WT: job exceeded a walltime limit
    -12: "limit",  # JOB_EXEC_OVERLIMIT_CPUT: job exceeded a CPU time limit
    256 + 15: "deleted",  # killed by qdel's SIGTERM
    128 + 15: "deleted",  # caught qdel's SIGTERM and exited
}
# PBS Professional substates of a finished job (OpenPBS src/include/job.h; svr_jobfunc.c sets
# them when the job enters history): 91 deleted (qdel), 92 finished, 93 failed (non-zero, or
# its MoM went down: then with no Exit_status at all).
_SUBSTATE_TERMINATED = 91
_SUBSTATE_FAILED = 93
# The comment OpenPBS gives a finished subjob shown through its array (src/server/array_func.c,
# update_sj_parent and set_subjob_tblstate): "Subjob finished", "Subjob failed" (a non-zero
# exit), "Subjob terminated" (deleted).
_SUBJOB_ENDINGS: dict[str, str] = {
    "Subjob finished": "ended",
    "Subjob failed": "failed",
    "Subjob terminated": "deleted",
}

# Every state the parsers yield: the native states, and "<F|X|C>/<ending>" once finished.
PBS_ALL_STATES: dict[str, TaskState] = {
    **PBS_STATES,
    **{f"{code}/{end}": state for code in _FINISHED for end, state in PBS_ENDINGS.items()},
}

_ENDING_REASONS: dict[str, str] = {
    "failed": "the job failed",
    "signal": "killed by a signal",
    "deleted": "deleted in PBS (qdel)",
    "walltime": "ran past its walltime (killed by PBS)",
    "memory": "went over its memory limit (killed by PBS)",
    "limit": "went over its CPU limit (killed by PBS)",
    "exec": "PBS could not run the job",
    "host": "its execution host went down and PBS did not rerun it (not rerunnable, qsub -r n)",
    "ended": "the subjob ended (PBS keeps no record of how without job history)",
}
PBS_REASONS: dict[str, str] = {
    "Q": "queued in PBS",
    "H": "held in PBS",
    "W": "waiting in PBS for its start time",
    "M": "moved to another PBS server",
    "S": "suspended in PBS",
    "U": "suspended in PBS while its workstation is busy",
    **{f"{code}/{end}": text for code in _FINISHED for end, text in _ENDING_REASONS.items()},
}

_JOB_ID = re.compile(r"\d+(\[\d*\])?(\.[A-Za-z0-9_.-]+)?")
# PBS Professional job arrays (Reference Guide, qsub(1B) -J; User's Guide, "Job Arrays"): qsub
# prints the array job's id, `1000[].server`; a subjob is `1000[3].server`.
_ARRAY_ID = re.compile(r"(\d+)\[\](\.[A-Za-z0-9_.-]+)?")
_SUBJOB_ID = re.compile(r"(\d+)\[(\d+)\](\.[A-Za-z0-9_.-]+)?")
# TORQUE 6.1 Administrator Guide, "Job arrays": qsub -t 0-N submits an array, printed as
# `123[].server`; each subjob `123[4].server` has its index in PBS_ARRAYID. TORQUE
# src/server/job_func.c (job_clone) appends "-<index>" to a subjob's Job_Name, Output_Path and
# Error_Path, and keeps the index in its job_array_id attribute.
TORQUE_ARRAY_INDEX = "PBS_ARRAYID"
_MAX_ARRAY_SIZE = re.compile(r'"max_array_size"\s*:\s*"?(\d+)')
_DEFAULT_MAX_ARRAY_SIZE = 10000
# TORQUE 6.1 "Server parameters", max_job_array_size: the most subjobs an array may have;
# unset, no limit (src/server/job_array.cpp, parse_array_request), and Klique's own bound holds.
_QUERY_OTHER_JOBS = re.compile(r'"?query_other_jobs"?\s*[=:]\s*"?(\w+)', re.IGNORECASE)
_MAX_JOB_ARRAY_SIZE = re.compile(r"^\s+max_job_array_size = (\d+)\s*$", re.MULTILINE)
# TORQUE's "Unknown Array ID" (PBSE_UNKARRAYID; src/server/req_stat.c rejects an array that has
# left the server with "unable to find array", which qstat prints after "MSG=").
_UNKNOWN_JOB = re.compile(r"^qstat: (Unknown Job Id|Unknown Array ID|.* Job has finished, use -x)")
_ATTRIBUTE = re.compile(r"^(?:    |\t)([A-Za-z_][A-Za-z0-9_.]*) = (.*)$")
# OpenPBS src/lib/Liblog/pbs_messages.c, PBSE_JOBHISTNOTSET: a status request with -x while
# job_history_enable is off (the default); qstat prints it per id and still exits 0.
_HISTORY_OFF = re.compile(r"PBS is not configured to maintain job history")
# PBSE_PERM, "Unauthorized Request " (OpenPBS pbs_messages.c, TORQUE pbs_error_db.h): a job of
# another user while query_other_jobs is false (Torque's default; PBS Professional's is true).
_OTHERS_HIDDEN = re.compile(r"^qstat: Unauthorized Request", re.MULTILINE)
# The MoM's note in the job's stderr when it kills a job for its walltime (OpenPBS
# mom_main.c, mom_over_limit: "walltime %lu exceeded limit %lu").
_WALLTIME_NOTE = re.compile(r"^=>> PBS: job killed: walltime \d+ exceeded limit \d+", re.M)


class PbsSettings(BatchSettings):
    kind: Literal["pbs"]
    dialect: Literal["pbspro", "torque"] = "pbspro"
    queue: str | None = None  # -q
    account: str | None = None  # -A


POOL_KIND = PoolKindSpec(
    name="pbs",
    settings=PbsSettings,
    driver="broker.pools.pbs:PbsDriver",
    queueing=True,
    spans_nodes=True,
    summary="a PBS Professional or Torque queue: qsub, one qstat per cycle, qdel",
)


class PbsDriver(BatchDriver):
    """A PBS Professional or Torque pool; `dialect: torque` switches resources and status."""

    kind = "pbs"
    STATES = PBS_ALL_STATES
    REASONS = PBS_REASONS
    PHASES = PBS_PHASES
    # The job script's own exit or signal: only the exit file tells how the task ended.
    SELF_ENDED = frozenset(
        f"{code}/{end}" for code in _FINISHED for end in ("completed", "failed", "signal", "ended")
    )
    OTHERS_HIDDEN = _OTHERS_HIDDEN
    # What a failed qsub proves. qsub sends a job in phases (OpenPBS src/lib/Libifl/
    # pbsD_submit.c: queue job, job script, commit, PBSD_commit) and the server queues it at
    # the commit: a reply lost after that leaves a job qsub calls failed. Its words are the
    # reply's decoding error (src/lib/Libdis dis_emsg: "Premature end of message", "Protocol
    # failure in commit", "End of File"; Torque's qsub: "qsub: submit error (End of File)"),
    # or, without a message, "qsub: Error (15031) submitting job" (src/cmds/qsub.c;
    # PBSE_PROTOCOL, src/include/pbs_error.h). All of these are unknown: the job may exist.
    # "cannot connect to server" (pbs_connect failed: nothing was sent) and the server's own
    # refusals (a queue, a resource) mean nothing was queued: the task fails with its words.
    SUBMIT_UNKNOWN = re.compile(
        r"End of File|Premature end of message|Protocol failure in commit|"
        r"Error \(15031\)|Connection reset by peer|[Tt]imed out"
    )
    # The client's wait for the server's reply: OpenPBS pbs_tcp_timeout
    # (PBS_DIS_TCP_TIMEOUT_SHORT, 30 s); the pool's `message_timeout` where a site differs.
    MESSAGE_TIMEOUT_S = 30.0
    # qsub(1B) -J X-Y: each subjob's index in PBS_ARRAY_INDEX (Torque's qsub -t: PBS_ARRAYID).
    # The server's max_array_size (Torque's max_job_array_size) bounds an array: the pool's
    # start reads it (the base's 1000 until it reads).
    ARRAY_INDEX = "PBS_ARRAY_INDEX"
    DIRECTIVE = "#PBS"

    def __init__(self, pool: Pool, context: Context, transport: Transport | None = None) -> None:
        super().__init__(pool, context, transport)
        self.dialect = str(pool.settings.get("dialect") or "pbspro")
        self._job_ids: dict[str, list[str]] = {}  # the jobs the next status query names
        # PBS Professional keeps finished jobs only with job_history_enable: until qstat says
        # it is off, status asks for them (-x); then finished jobs leave and the exit file
        # decides.
        self._keeps_history = self.dialect == "pbspro"
        self._server_read = False

    async def check(self) -> list[str]:
        problems = await super().check()
        await self._read_server()
        return problems

    async def _read_server(self) -> None:
        """The server's max_array_size (`qstat -B -f -F json`, pbs_server_attributes(7B);
        10000 where the server shows none, OpenPBS PBS_MAX_ARRAYJOB_DFLT_SIZE), until it
        reads. A queue's own max_array_size is not read: the queue refuses a larger array.
        Torque: max_job_array_size in `qstat -B -f -1`; where it is unset, the base's bound.
        Its query_other_jobs too (see `_hides_others`), where the pool does not say."""
        if not self._uses_arrays() and not self._detect_per_account:
            return
        torque = self.dialect == "torque"
        argv = ["qstat", "-B", "-f", *(["-1"] if torque else ["-F", "json"])]
        try:
            done = await self.transport.run(argv, account=self.query_account(), timeout=30)
        except KliqueError:
            return
        if done.returncode != 0:
            return
        self._server_read = True
        self._hides_others(done.stdout)
        if not self._uses_arrays():
            return
        found = (_MAX_JOB_ARRAY_SIZE if torque else _MAX_ARRAY_SIZE).search(done.stdout)
        default = self.MAX_ARRAY if torque else _DEFAULT_MAX_ARRAY_SIZE
        self.max_array = int(found[1]) if found else default

    def _hides_others(self, server: str) -> None:
        """query_other_jobs false: status runs as each mapped account from the start. The
        refusal (`Unauthorized Request`) cannot be waited for: Torque answers another
        account's array with nothing at all and exit 0 (TORQUE src/server/req_stat.c skips
        the permission error for an array's jobs), and its listing without ids shows only the
        asker's jobs, so the job of a task whose submission's outcome is unknown would not be
        found."""
        if not self._detect_per_account or self._per_account:
            return
        if query_others(server, self.dialect) is not False:
            return
        self._per_account = True
        log.warning(
            "pool %s: the %s server's query_other_jobs is false (it shows each account only "
            "its own jobs): status runs one query per mapped account. Set "
            "`status_per_account: true` on the pool to say so",
            self.pool.name,
            "Torque" if self.dialect == "torque" else "PBS",
        )

    def directives(self, task: Task, profile: Profile, job_dir: str) -> list[str]:
        settings = self.pool.settings
        found = [f"-N {task.tag}"]
        if settings.get("queue"):
            found.append(f"-q {settings['queue']}")
        if settings.get("account"):
            found.append(f"-A {settings['account']}")
        found += self._resources(profile)
        found += [f"-l walltime={walltime_hms(profile.walltime_s)}", "-j oe"]
        found.append(f"-o {job_dir}/pbs.out")
        return found

    def _resources(self, profile: Profile) -> list[str]:
        gpus = profile.whole_gpus
        memory = f"mem={profile.memory_mb}mb"
        count = profile.nodes
        if self.dialect == "torque":
            nodes = f"nodes={count}:ppn={profile.cpus}" + (f":gpus={gpus}" if gpus else "")
            return [f"-l {nodes}", f"-l {torque_memory(profile)}"]
        chunk = f"select={count}:ncpus={profile.cpus}" + (f":ngpus={gpus}" if gpus else "")
        # pbs_resources(7B) place=scatter: each chunk on a host of its own (one runner a node)
        scatter = ["-l place=scatter"] if count > 1 else []
        return [f"-l {chunk}:{memory}", *scatter]

    def node_launch(self, profile: Profile) -> Markup:
        """pbsdsh(1B): one runner on each of the job's nodes (Torque: -u, once per host
        whatever its ppn; PBS Professional: once per chunk, which place=scatter puts on hosts
        of their own)."""
        if profile.nodes <= 1:
            return Markup("")
        return Markup("pbsdsh -u --" if self.dialect == "torque" else "pbsdsh --")  # noqa: S704

    @property
    def array_index(self) -> str | None:
        return TORQUE_ARRAY_INDEX if self.dialect == "torque" else self.ARRAY_INDEX

    def array_directives(self, shared: Sequence[str], count: int) -> list[str]:
        option = "-t" if self.dialect == "torque" else "-J"  # Torque's qsub -t, qsub(1B) -J
        last = self.ARRAY_FIRST + count - 1
        return [*shared, f"{self.DIRECTIVE} {option} {self.ARRAY_FIRST}-{last}"]

    def element_id(self, array_id: str, index: int) -> str:
        number, _, server = array_id.partition("[]")
        return f"{number}[{index}]{server}"

    def element_index(self, native_id: str) -> int | None:
        match = _SUBJOB_ID.fullmatch(native_id)
        return int(match[2]) if match else None

    def submit_argv(self, script: str) -> list[str]:
        return ["qsub", script]

    def parse_submit(self, stdout: str) -> str:
        return parse_qsub(stdout)

    async def poll(self, tasks: Sequence[Task]) -> dict[int, Observation]:
        # qstat's long formats cannot be limited to users (PBS Professional's -u switches to the
        # one-line table), so the one query per cycle names the pool's jobs, by account.
        # A subjob is named by its array job with -t (qstat(1B): "-t: Displays status
        # information for jobs, job arrays, and subjobs"): one name per array, which every
        # version accepts, finished subjobs (X) listed while the array is there. A task whose
        # submission's outcome is unknown has no id: then every job is listed, to find it.
        if not self._server_read:
            await self._read_server()
        self._job_ids = {}
        unknown = any(t.state is TaskState.PLACED for t in tasks)
        for task in sorted(tasks, key=lambda t: t.native_id or ""):
            account = self.pool.user_map.account_for(task.owner)
            if task.native_id and account and not unknown:
                named = self._job_ids.setdefault(account, [])
                job_id = _array_of(task.native_id)
                if job_id not in named:
                    named.append(job_id)
        return await super().poll(tasks)

    def status_argv(self, accounts: Sequence[str]) -> list[str]:
        job_ids = [job_id for account in accounts for job_id in self._job_ids.get(account, [])]
        arrays = any(_ARRAY_ID.fullmatch(j) for j in job_ids)
        subjobs = ["-t"] if arrays or (not job_ids and self._uses_arrays()) else []
        if self.dialect == "torque":
            # Torque lists completed jobs (C) for keep_completed. Without -t its qstat asks the
            # server to summarize arrays, one record each; with -t, an array's id lists its
            # subjobs, each a job of its own (TORQUE src/cmds/qstat.c, summarize_arrays;
            # src/server/req_stat.c, tjstArray).
            return ["qstat", *subjobs, "-f", "-1", *job_ids]
        # -x: finished jobs (F) and their Exit_status, kept while job_history_enable is set.
        history = ["-x"] if self._keeps_history else []
        return ["qstat", *history, *subjobs, "-f", "-F", "json", *job_ids]

    def status_again(self, argv: Sequence[str], done: Completed) -> bool:
        if "-x" not in argv or not _HISTORY_OFF.search(done.stderr):
            return False
        if self._keeps_history:
            self._keeps_history = False
            log.warning(
                "pool %s: PBS keeps no job history (job_history_enable is off): status now "
                "runs without -x, and a job that leaves the queue is decided by its exit file",
                self.pool.name,
            )
        return True

    def status_listed(self, done: Completed) -> bool:
        # A named job that left the server's memory is reported on stderr, and the others
        # are listed all the same (qstat exits with the last error's PBSE_* number).
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        return all(_UNKNOWN_JOB.match(line) for line in lines)

    def parse_status(self, stdout: str) -> list[NativeStatus]:
        found = (
            parse_qstat_text(stdout, TORQUE_EXEC_CODES)
            if self.dialect == "torque"
            else parse_qstat_json(stdout)
        )
        # An array job's own record (N[], Torque's summary) is no task's: its subjobs are.
        return [s for s in found if not _ARRAY_ID.fullmatch(s.native_id)]

    def ending_note(self, job_dir: str) -> str | None:
        return f"{job_dir}/pbs.out"  # -j oe: the MoM's notes go to the job's output

    def parse_ending_note(self, text: str) -> str | None:
        return f"{_FINISHED[0]}/walltime" if _WALLTIME_NOTE.search(text) else None

    def cancel_argv(self, native_id: str) -> list[str]:
        return ["qdel", native_id]


def torque_memory(profile: Profile) -> str:
    """The memory request Torque honours. TORQUE 6.1 Administrator Guide, "Requesting
    resources": `mem` "will only work for single-node jobs. If your job requires multiple
    nodes, use pmem instead", and pmem bounds each process: a node's memory shared by the
    ppn processes it runs, rounded up."""
    if profile.nodes <= 1:
        return f"mem={profile.memory_mb}mb"
    return f"pmem={-(-profile.memory_mb // profile.cpus)}mb"


def query_others(server: str, dialect: str) -> bool | None:
    """The server's query_other_jobs in `qstat -B -f` (text or JSON); where it is not shown,
    the vendor's default: true on PBS Professional (OpenPBS pbsd_init.c), false on Torque
    (TORQUE 6.1 Administrator Guide, "Server parameters"), whose qstat shows only attributes
    that are set. None where the answer shows no server at all."""
    found = _QUERY_OTHER_JOBS.search(server)
    if found is None:
        return None if "Server" not in server else dialect != "torque"
    return found[1].lower() in ("true", "1", "t", "y")


def _array_of(native_id: str) -> str:
    """A subjob's array job (`1000[3].server` -> `1000[].server`); another id as it is."""
    match = _SUBJOB_ID.fullmatch(native_id)
    return f"{match[1]}[]{match[3] or ''}" if match else native_id


def parse_qsub(stdout: str) -> str:
    """qsub(1B) prints the job id: `<sequence>.<server>` (Torque and PBS Professional)."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    job_id = lines[-1] if lines else ""
    if not _JOB_ID.fullmatch(job_id):
        raise SubmitError(f"qsub printed no job id: {stdout.strip()!r}")
    return job_id


def parse_qstat_json(stdout: str) -> list[NativeStatus]:
    """`qstat [-x] -f -F json`: {"Jobs": {id: attributes}}, no "Jobs" when nothing is shown.
    Known versions print invalid JSON for some jobs: see pbs_json; a job whose record does
    not read is listed as unreadable, and the others as usual."""
    try:
        jobs, problems = job_records(stdout)
    except ValueError as exc:
        raise TransportError(f"qstat -F json printed no readable JSON: {exc}") from exc
    found = [_readable(job_id, attrs, PBSPRO_EXEC_CODES) for job_id, attrs in jobs]
    return found + [unreadable(job_id, problem) for job_id, problem in problems]


def parse_qstat_text(stdout: str, exec_codes: Mapping[int, str]) -> list[NativeStatus]:
    """`qstat -f`: `Job Id: <id>` then `name = value` lines, indented by four spaces (a tab
    in Slurm's Torque wrapper); long values continue on lines that start with a tab (indented
    further where the output was copied with its tabs expanded)."""
    return [_readable(job_id, attrs, exec_codes) for job_id, attrs in qstat_text_jobs(stdout)]


def qstat_text_jobs(stdout: str) -> list[tuple[str, dict[str, str]]]:
    jobs: list[tuple[str, dict[str, str]]] = []
    last = ""
    for line in stdout.splitlines():
        if line.startswith("Job Id:"):
            jobs.append((line[len("Job Id:") :].strip(), {}))
            last = ""
            continue
        if not jobs or not line.strip():
            continue
        attrs = jobs[-1][1]
        match = _ATTRIBUTE.match(line)
        if match:
            last = match.group(1)
            attrs[last] = match.group(2)
        elif line[:1].isspace() and last:
            attrs[last] += line[1:] if line.startswith("\t") else line.lstrip()
    return jobs


def _readable(job_id: str, attrs: Any, exec_codes: Mapping[int, str]) -> NativeStatus:
    if not isinstance(attrs, Mapping) or not attrs.get("job_state"):
        return unreadable(job_id, "its record has no job_state")
    return _status(job_id, attrs, exec_codes)


def _status(job_id: str, attrs: Mapping[str, Any], exec_codes: Mapping[int, str]) -> NativeStatus:
    state = str(attrs.get("job_state", ""))
    name = _job_name(attrs)
    status = _int(attrs.get("Exit_status", attrs.get("exit_status")))
    script, user = _script(attrs), str(attrs.get("Job_Owner", "")).split("@")[0]
    restarts = requeues(state, attrs)
    if state not in _FINISHED:
        comment = str(attrs.get("comment", ""))
        return NativeStatus(
            job_id, name, state, comment, script=script, user=user, restarts=restarts
        )
    if state in ("X", "F") and _SUBJOB_ID.fullmatch(job_id) and "array_index" not in attrs:
        # A PBS Professional subjob without a job of its own (no job history): OpenPBS
        # status_subjob (stat_job.c) shows its array's record in state X, the comment
        # "Subjob finished" and the array's Exit_status (update_sj_parent: 0, 1 or 2 for the
        # last subjob to end), none of them this subjob's. The exit file tells; the comment
        # says whether it failed or was deleted, where it names either.
        comment = str(attrs.get("comment", "")).strip()
        end = next((e for c, e in _SUBJOB_ENDINGS.items() if comment.startswith(c)), "ended")
        return NativeStatus(job_id, name, f"{state}/{end}", comment, script=script, user=user)
    overran = _overran(attrs)
    end = ending(status, _int(attrs.get("substate")), exec_codes, overran)
    detail = "no exit status" if status is None else f"exit status {status}"
    if end == "walltime" and overran and status not in exec_codes:
        detail += ", walltime used past its limit"
    code = _exit_code(status)
    return NativeStatus(
        job_id, name, f"{state}/{end}", detail, code, script=script, user=user, restarts=restarts
    )


def requeues(state: str, attrs: Mapping[str, Any]) -> int | None:
    """How often the job was requeued (qrerun, a failed start): PBS Professional's run_count
    (pbs_job_attributes(7B)) counts the times the job was sent to run (OpenPBS req_runjob.c
    svr_strtjob2), so a job waiting again after its runs was requeued that many times, and one
    running or ended once fewer. None where qstat shows no run_count: a job that never ran, a
    subjob shown through its array, and Torque (its qstat shows start_count, which the TORQUE
    6.1 guide does not describe as a count of requeues: it is not read)."""
    runs = _int(attrs.get("run_count"))
    if runs is None:
        return None
    return max(runs - (0 if state in _WAITING else 1), 0)


def _job_name(attrs: Mapping[str, Any]) -> str:
    """The job's name; a Torque subjob's is its array's, with the "-<index>" that TORQUE's
    job_clone appends (its job_array_id is the index) taken off."""
    name = str(attrs.get("Job_Name", ""))
    index = attrs.get("job_array_id")
    return name.removesuffix(f"-{index}") if index is not None else name


def _script(attrs: Mapping[str, Any]) -> str:
    """The script's path where qsub was given nothing else: qstat prints Submit_arguments as
    the arguments joined by spaces (OpenPBS qstat.c, decode_xml_arg_list_str)."""
    words = str(attrs.get("Submit_arguments", "")).split()
    return words[0] if len(words) == 1 and words[0].startswith("/") else ""


def ending(
    status: int | None,
    substate: int | None,
    exec_codes: Mapping[int, str],
    overran: bool = False,
) -> str:
    """Which PBS_ENDINGS entry a finished job names. A deletion is read from the substate (91)
    where qstat shows one (PBS Professional, every version); a limit kill from the MoM's code,
    or (PBS Professional before JOB_EXEC_KILL_WALLTIME) from walltime used past its limit,
    since the MoM kills only once it is exceeded; then the job's own status. A failed job
    (93) with no status at all lost its host: it was never deleted."""
    if substate == _SUBSTATE_FAILED and status is None:
        return "host"
    if substate == _SUBSTATE_TERMINATED or status is None:
        return "deleted"
    if status < 0:
        return exec_codes.get(status, "exec")
    if overran:
        return "walltime"
    if status in exec_codes:
        return exec_codes[status]
    if status >= 256:
        return "signal"
    return "completed" if status == 0 else "failed"


def _overran(attrs: Mapping[str, Any]) -> bool:
    """resources_used.walltime past Resource_List.walltime (JSON nests them; text does not)."""
    used = _seconds(_resource(attrs, "resources_used", "walltime"))
    limit = _seconds(_resource(attrs, "Resource_List", "walltime"))
    return used is not None and limit is not None and used > limit


def _resource(attrs: Mapping[str, Any], group: str, name: str) -> object:
    nested = attrs.get(group)
    if isinstance(nested, Mapping):
        return nested.get(name)
    return attrs.get(f"{group}.{name}")


def _seconds(value: object) -> int | None:
    """[[HH:]MM:]SS, or bare seconds (pbs_resources(7B), "duration")."""
    parts = str(value).split(":") if value is not None else []
    if not parts or len(parts) > 3 or not all(p.isdigit() for p in parts):
        return None
    total = 0
    for part in parts:
        total = total * 60 + int(part)
    return total


def _exit_code(status: int | None) -> int | None:
    """The exit status as a shell reports it: 128 + N for a job killed by signal N."""
    if status is None or status < 0:
        return None
    return 128 + status - 256 if status >= 256 else status


def _int(value: object) -> int | None:
    try:
        return int(str(value))
    except ValueError:
        return None
