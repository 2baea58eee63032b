"""PBS Professional and Torque (the pool's `dialect`): qsub, one `qstat -f` per cycle naming the
pool's jobs (one per account where the server hides other users' jobs), qdel. A finished job is
told apart by its exit status, substate and walltime used; the exit file decides. PBS
Professional's run_count tells a job requeued (qrerun) while it ran. A sweep goes as one job
array in both dialects (qsub -J, Torque's qsub -t; docs/job-arrays.md)."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Literal

from markupsafe import Markup

from broker.domain import Pool, Profile, Task, TaskState
from broker.errors import KliqueError
from broker.execution import Observation
from broker.pools.base import Context
from broker.pools.batch import BatchDriver
from broker.pools.native import NativeStatus
from broker.pools.pbs_parse import (
    ARRAY_ID,
    FINISHED,
    PBS_ALL_STATES,
    PBS_PHASES,
    PBS_REASONS,
    SUBJOB_ID,
    TORQUE_EXEC_CODES,
    array_of,
    parse_qstat_json,
    parse_qstat_text,
    parse_qsub,
)
from broker.pools.registry import PoolKindSpec
from broker.pools.settings import BatchSettings, settings_as
from broker.pools.staging import walltime_hms
from broker.transport import Completed, Transport

log = logging.getLogger("klique.pools")

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
    """A PBS Professional or Torque queue (docs/pbs-lsf-sites.md)."""

    kind: Literal["pbs"]
    """Says the pool is a PBS queue (`dialect` says which PBS)."""
    dialect: Literal["pbspro", "torque"] = "pbspro"
    """Which PBS: PBS Professional (OpenPBS) or Torque; their resource requests and
    listings differ."""
    queue: str | None = None
    """The queue jobs go to (`-q`; unset: the server's default)."""
    account: str | None = None
    """The account jobs are charged to (`-A`)."""


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

    settings: PbsSettings

    kind = "pbs"
    STATES = PBS_ALL_STATES
    REASONS = PBS_REASONS
    PHASES = PBS_PHASES
    # The job script's own exit or signal: only the exit file tells how the task ended.
    SELF_ENDED = frozenset(
        f"{code}/{end}" for code in FINISHED for end in ("completed", "failed", "signal", "ended")
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
    # How long a request may still be inside the server after its reply was lost: PBS names
    # no such bound. qsub itself waits up to 3 hours for a reply (OpenPBS pbsD_connect.c sets
    # pbs_tcp_timeout to PBS_DIS_TCP_TIMEOUT_VLONG once connected; int_rdrpy.c never waits
    # under PBS_DIS_TCP_TIMEOUT_LONG, 600 s), so Klique's own submit timeout ends it first.
    # 30 s (PBS_DIS_TCP_TIMEOUT_SHORT, the client's wait before it connects) is Klique's
    # choice; the pool's `message_timeout` sets a busy server's.
    MESSAGE_TIMEOUT_S = 30.0
    # qsub(1B) -J X-Y: each subjob's index in PBS_ARRAY_INDEX (Torque's qsub -t: PBS_ARRAYID).
    # The server's max_array_size (Torque's max_job_array_size) bounds an array: the pool's
    # start reads it (the base's 1000 until it reads).
    ARRAY_INDEX = "PBS_ARRAY_INDEX"
    DIRECTIVE = "#PBS"

    def __init__(self, pool: Pool, context: Context, transport: Transport | None = None) -> None:
        super().__init__(pool, context, transport)
        self.settings = settings_as(pool, PbsSettings)
        self.dialect = self.settings.dialect
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
        settings = self.settings
        found = [f"-N {task.tag}"]
        if settings.queue:
            found.append(f"-q {settings.queue}")
        if settings.account:
            found.append(f"-A {settings.account}")
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
        match = SUBJOB_ID.fullmatch(native_id)
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
                job_id = array_of(task.native_id)
                if job_id not in named:
                    named.append(job_id)
        return await super().poll(tasks)

    def status_argv(self, accounts: Sequence[str]) -> list[str]:
        job_ids = [job_id for account in accounts for job_id in self._job_ids.get(account, [])]
        arrays = any(ARRAY_ID.fullmatch(j) for j in job_ids)
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
        return [s for s in found if not ARRAY_ID.fullmatch(s.native_id)]

    def ending_note(self, job_dir: str) -> str | None:
        return f"{job_dir}/pbs.out"  # -j oe: the MoM's notes go to the job's output

    def parse_ending_note(self, text: str) -> str | None:
        return f"{FINISHED[0]}/walltime" if _WALLTIME_NOTE.search(text) else None

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
