"""IBM Spectrum LSF: `bsub < job.sh`, one `bjobs -a -o ... -json` per cycle for the pool's
accounts (`-o "... delimiter='^'"` text where LSF predates `-json`), bkill. An EXIT is told
apart by its termination reason; the exit file decides. A sweep's tasks go as one job array
(`bsub -J "name[1-N]"`, docs/job-arrays.md)."""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

from markupsafe import Markup

from broker.domain import Pool, Profile, Task, TaskState
from broker.errors import KliqueError, SubmitError, TransportError
from broker.execution import Observation
from broker.pools.base import Context
from broker.pools.batch import BatchDriver
from broker.pools.native import NativeStatus, unreadable
from broker.pools.registry import PoolKindSpec
from broker.pools.settings import BatchSettings, settings_as
from broker.transport import Completed, Transport

log = logging.getLogger("klique.pools")

# IBM Spectrum LSF 10.1 Command Reference, bjobs, "Job states" (the STAT field).
LSF_STATES: dict[str, TaskState] = {
    "PEND": TaskState.PENDING,  # pending: not yet started
    "PROV": TaskState.PENDING,  # dispatched to a power-saved host that is waking up
    "WAIT": TaskState.PENDING,  # a chunk job member waiting to run
    "PSUSP": TaskState.PENDING,  # suspended by its owner or an administrator while pending
    "RUN": TaskState.RUNNING,  # running
    "USUSP": TaskState.RUNNING,  # suspended by its owner or an administrator while running
    "SSUSP": TaskState.RUNNING,  # suspended by LSF (host load, or the queue's run window closed)
    "UNKWN": TaskState.RUNNING,  # mbatchd lost contact with the host's sbatchd; it may come back
    "ZOMBI": TaskState.LOST,  # killed while its host was unreachable; LSF keeps trying to kill it
    "DONE": TaskState.COMPLETED,  # terminated with status 0
    "EXIT": TaskState.FAILED,  # terminated with a non-zero status, or killed (see below)
}

# Running jobs whose execution LSF suspended (bjobs(1), "Job states": USUSP by its owner or an
# administrator, SSUSP by LSF for host load or a closed run window): not charged unless the
# pool's `charge_phases` names them, as Slurm's SUSPENDED and PBS's S and U (one rule,
# docs/pbs-lsf-sites.md).
LSF_PHASES: dict[str, str] = {
    "USUSP": "suspended",
    "SSUSP": "suspended",
}

# IBM Spectrum LSF 10.1, "Termination reasons" (bjobs -o exit_reason, bhist -l, bacct -l):
# why LSF ended an EXIT job, where the exit file cannot tell.
LSF_TERMINATIONS: dict[str, TaskState] = {
    "TERM_RUNLIMIT": TaskState.TIMEOUT,  # killed after reaching its run time limit (-W)
    "TERM_DEADLINE": TaskState.TIMEOUT,  # killed after its deadline
    "TERM_OWNER": TaskState.CANCELLED,  # killed by its owner (bkill)
    "TERM_FORCE_OWNER": TaskState.CANCELLED,  # killed by its owner without time for cleanup
    "TERM_ADMIN": TaskState.CANCELLED,  # killed by root or an LSF administrator
    "TERM_FORCE_ADMIN": TaskState.CANCELLED,  # the same, without time for cleanup
    "TERM_BUCKET_KILL": TaskState.CANCELLED,  # killed with bkill -b
    "TERM_MEMLIMIT": TaskState.FAILED,  # killed after reaching its memory limit
    "TERM_CPULIMIT": TaskState.FAILED,  # killed after reaching its CPU time limit
    "TERM_PREEMPT": TaskState.FAILED,  # killed after preemption
    "TERM_WINDOW": TaskState.FAILED,  # killed after the queue's run window closed
    "TERM_LOAD": TaskState.FAILED,  # killed after the host's load exceeded a threshold
    "TERM_CWD_NOTEXIST": TaskState.FAILED,  # its working directory was not accessible
    "TERM_ZOMBIE": TaskState.LOST,  # exited while LSF was not available
}
# The run limit's kill sequence starts with SIGUSR2, so a job LSF ended there exits 128 + 12
# even where the termination reason is not reported.
_RUNLIMIT_EXIT_CODE = 140

# Every state the parser yields: STAT, and "EXIT/<termination reason>".
LSF_ALL_STATES: dict[str, TaskState] = {
    **LSF_STATES,
    **{f"EXIT/{term}": state for term, state in LSF_TERMINATIONS.items()},
}
LSF_REASONS: dict[str, str] = {
    "PEND": "pending in LSF",
    "PSUSP": "suspended in LSF while pending",
    "USUSP": "suspended in LSF by its owner or an administrator",
    "SSUSP": "suspended by LSF",
    "UNKWN": "LSF lost contact with its execution host",
    "ZOMBI": "killed while its execution host was unreachable (LSF ZOMBI)",
    "EXIT": "the job failed (LSF EXIT)",
    "EXIT/TERM_RUNLIMIT": "ran past its walltime (LSF TERM_RUNLIMIT)",
    "EXIT/TERM_DEADLINE": "ran past its deadline (LSF TERM_DEADLINE)",
    "EXIT/TERM_OWNER": "killed by its owner in LSF (bkill)",
    "EXIT/TERM_FORCE_OWNER": "killed by its owner in LSF (bkill)",
    "EXIT/TERM_ADMIN": "killed by an LSF administrator",
    "EXIT/TERM_FORCE_ADMIN": "killed by an LSF administrator",
    "EXIT/TERM_BUCKET_KILL": "killed in LSF (bkill -b)",
    "EXIT/TERM_MEMLIMIT": "went over its memory limit (LSF TERM_MEMLIMIT)",
    "EXIT/TERM_CPULIMIT": "went over its CPU time limit (LSF TERM_CPULIMIT)",
    "EXIT/TERM_PREEMPT": "preempted (LSF TERM_PREEMPT)",
    "EXIT/TERM_WINDOW": "its queue's run window closed (LSF TERM_WINDOW)",
    "EXIT/TERM_LOAD": "its host was overloaded (LSF TERM_LOAD)",
    "EXIT/TERM_CWD_NOTEXIST": "its working directory was not accessible (LSF TERM_CWD_NOTEXIST)",
    "EXIT/TERM_ZOMBIE": "exited while LSF was not available (LSF TERM_ZOMBIE)",
}

# bjobs -o fields; -json prints each as a string, "" where the table shows "-". An array's
# elements are listed one a line under the array's number (JOBID, without the index unless
# lsf.conf LSB_BJOBS_DISPLAY_ENH=Y), each with its index (jobindex: 0 outside an array) and
# named "name[index]" (IBM Spectrum LSF 10.1, bjobs -o; "Job arrays").
_FIELDS = "jobid jobindex stat user job_name exit_code exit_reason pend_reason suspend_reason"
# An element's id as bkill takes it and bjobs shows it: "3000[3]" (bkill "job_ID[index]").
_ELEMENT_ID = re.compile(r"(\d+)\[(\d+)\]")
# Without -json (LSF before 10.1 Fix Pack 2), the same fields as text, one job a line, split
# on a character no field of Klique's jobs holds (bjobs -o "... delimiter='c'").
_DELIMITER = "^"
_SECURE_JOB_INFO_LEVEL = re.compile(r"^\s*SECURE_JOB_INFO_LEVEL\s*=\s*(\d+)", re.MULTILINE)
_SUBMITTED = re.compile(r"Job <(\d+)> is submitted")
# bjobs with nothing to show: "No unfinished job found", "No job found" (bjobs(1); with
# LSB_BJOBS_CONSISTENT_EXIT_CODE=Y it exits 255, by default 0).
_NOTHING_FOUND = re.compile(r"^No (\w+ )?job found")
# A named job that left mbatchd's memory (CLEAN_PERIOD): the others are listed all the same.
_NOT_FOUND = re.compile(r"^Job <[^>]+> is not found")
# A bjobs that does not know an option it was given answers with its usage.
_OPTION_REFUSED = re.compile(r"illegal option|invalid option|unknown option|^Usage:", re.I | re.M)


# bsub reads '#BSUB' lines only from a script on its standard input (or with
# LSB_BSUB_PARSE_SCRIPT=Y); the script's path reaches the shell as data, never as text.
class LsfSettings(BatchSettings):
    """An LSF queue (docs/pbs-lsf-sites.md)."""

    kind: Literal["lsf"]
    """Says the pool is an LSF queue."""
    queue: str | None = None
    """The queue jobs go to (`-q`; unset: the cluster's default)."""
    account: str | None = None
    """The LSF project jobs are charged to (`-P`)."""
    bjobs_json: bool = True
    """Read status with `bjobs -json`; set false for LSF before 10.1 Fix Pack 2, which has
    none."""


POOL_KIND = PoolKindSpec(
    name="lsf",
    settings=LsfSettings,
    driver="broker.pools.lsf:LsfDriver",
    queueing=True,
    spans_nodes=True,
    summary="an IBM Spectrum LSF queue: bsub, one bjobs per cycle, bkill",
)


# blaunch(1) -z with the job's hosts: the odd words of LSB_MCPU_HOSTS ("host slots ...").
_BLAUNCH = "blaunch -z \"$(printf '%s %s\\n' $LSB_MCPU_HOSTS | cut -d' ' -f1 | xargs)\""


class LsfDriver(BatchDriver):
    settings: LsfSettings
    kind = "lsf"
    STATES = LSF_ALL_STATES
    REASONS = LSF_REASONS
    SELF_ENDED = frozenset({"DONE", "EXIT"})  # the job script's own exit or signal
    # Killed after preemption (TERMINATE_WHEN=PREEMPT in lsb.queues): a preempted task, run
    # again where the pool's `requeue_preempted` says, as Slurm's PREEMPTED is.
    PREEMPTED = frozenset({"EXIT/TERM_PREEMPT"})
    PHASES = LSF_PHASES
    # bsub -J "name[1-N]": an array whose elements LSF numbers from 1, each with its index in
    # LSB_JOBINDEX. lsb.params MAX_JOB_ARRAY_SIZE (default 1000) bounds the largest index, so
    # an array holds at most 1000 tasks (IBM Spectrum LSF 10.1 Command Reference, bsub -J;
    # "Passing arguments on the command line").
    ARRAY_INDEX = "LSB_JOBINDEX"
    ARRAY_FIRST = 1
    # What a failed bsub proves. bsub prints lsb_sysmsg() and "Job not submitted." for every
    # failure of lsb_submit, even one where mbatchd took the job and only its reply was
    # lost: LSBE_LSLIB "Failed in an LSF library call" with LSE_MSG_SYS "Failed in
    # sending/receiving a message" or LSE_TIME_OUT "Timeout on connect/receive call"
    # (lsberrno.h, lserrno.h), LSBE_PROTOCOL "LSF protocol error", a reset connection. Those
    # are unknown: the job may exist. mbatchd's own refusals (a queue, a limit) queued nothing.
    SUBMIT_UNKNOWN = re.compile(
        r"Failed in sending/receiving a message|Timeout on connect/receive call|"
        r"LSF protocol error|Connection reset by peer"
    )
    # lsf.conf LSB_API_RECVTIMEOUT: how long the API waits for mbatchd's reply (10 s by
    # default); the pool's `message_timeout` where a site sets it otherwise.
    MESSAGE_TIMEOUT_S = 10.0
    MAX_ARRAY = 1000
    DIRECTIVE = "#BSUB"

    def __init__(self, pool: Pool, context: Context, transport: Transport | None = None) -> None:
        super().__init__(pool, context, transport)
        self.settings = settings_as(pool, LsfSettings)
        self._requeues = RequeueCount()
        self._job_ids: dict[str, list[str]] = {}  # the jobs the next status query names

    async def check(self) -> list[str]:
        problems = await super().check()
        await self._read_params()
        return problems

    async def _read_params(self) -> None:
        """lsb.params SECURE_JOB_INFO_LEVEL (`bparams -a`): at 1 to 5 each user sees the
        details of only their own jobs, and bjobs answers another user's with nothing to tell
        it by, no refusal: status runs as each mapped account from the start (unless the
        pool's `status_per_account` says). Unread (an old bparams, LSF down), as before."""
        if not self._detect_per_account or self._per_account:
            return
        try:
            done = await self.transport.run(
                ["bparams", "-a"], account=self.query_account(), timeout=30
            )
        except KliqueError:
            return
        level = secure_job_info_level(done.stdout) if done.returncode == 0 else None
        if not level:
            return
        self._per_account = True
        log.warning(
            "pool %s: LSF's SECURE_JOB_INFO_LEVEL is %d (each user sees only their own jobs): "
            "status runs one bjobs per mapped account. Set `status_per_account: true` on the "
            "pool to say so",
            self.pool.name,
            level,
        )

    def directives(self, task: Task, profile: Profile, job_dir: str) -> list[str]:
        settings = self.settings
        found = [f"-J {task.tag}", f"-Jd {task.tag}"]
        if settings.queue:
            found.append(f"-q {settings.queue}")
        if settings.account:
            found.append(f"-P {settings.account}")
        # bsub(1) -n counts slots (CPUs); span[ptile=C] puts C of them on each host, so a task
        # on several nodes has one host per node.
        span = f"span[ptile={profile.cpus}]" if profile.nodes > 1 else "span[hosts=1]"
        found += [
            f"-n {profile.cpus * profile.nodes}",
            f'-R "{span}"',
            # A unit on mem keeps the request independent of the site's LSF_UNIT_FOR_LIMITS.
            f'-R "rusage[mem={profile.memory_mb}MB]"',
        ]
        gpus = profile.whole_gpus
        if gpus:
            found.append(f'-gpu "num={gpus}"')
        found += [f"-W {run_limit_minutes(profile.walltime_s)}", f"-o {job_dir}/lsf-%J.out"]
        return found

    def array_directives(self, shared: Sequence[str], count: int) -> list[str]:
        """The tasks' directives with the array in the job name, `-J "{tag}[1-N]"` (LSF has no
        option of its own for it), and each output file per element: `%J` is the array's number
        for every element, `%I` the element's index (IBM Spectrum LSF 10.1, "Job arrays",
        redirecting standard input and output)."""
        name = f"{self.DIRECTIVE} -J {{tag}}"
        array = f'{self.DIRECTIVE} -J "{{tag}}[{self.ARRAY_FIRST}-{self.ARRAY_FIRST + count - 1}]"'
        found = [array if line == name else _per_element(line) for line in shared]
        return found if array in found else [array, *found]

    def element_id(self, array_id: str, index: int) -> str:
        return f"{array_id}[{index}]"

    def element_index(self, native_id: str) -> int | None:
        match = _ELEMENT_ID.fullmatch(native_id)
        return int(match[2]) if match else None

    def node_launch(self, profile: Profile) -> Markup:
        """blaunch(1) -z HOSTS: one runner on each of the job's hosts, which LSB_MCPU_HOSTS
        lists as `host slots host slots ...` (without -z, blaunch starts one per slot)."""
        if profile.nodes <= 1:
            return Markup("")
        return Markup(_BLAUNCH)  # noqa: S704 - a constant

    # bsub(1) reads the script's #BSUB lines only from its stdin: `bsub < job.sh`.
    SUBMIT_STDIN = True

    def submit_argv(self, script: str) -> list[str]:
        return ["bsub"]

    def parse_submit(self, stdout: str) -> str:
        return parse_bsub(stdout)

    @property
    def json(self) -> bool:
        return self.settings.bjobs_json

    async def poll(self, tasks: Sequence[Task]) -> dict[int, Observation]:
        # The one query per cycle names the pool's jobs by id (an array by its number, which
        # names every element: bjobs(1), "job_ID"), not every job of the cluster (-u all). A
        # task whose submission's outcome is unknown has no id: then the accounts' jobs are
        # listed, to find it.
        self._job_ids = {}
        if not any(t.state is TaskState.PLACED for t in tasks):
            for task in sorted(tasks, key=lambda t: t.native_id or ""):
                account = self.pool.user_map.account_for(task.owner)
                if task.native_id and account:
                    named = self._job_ids.setdefault(account, [])
                    job_id = task.native_id.partition("[")[0]
                    if job_id not in named:
                        named.append(job_id)
        return await super().poll(tasks)

    def status_argv(self, accounts: Sequence[str]) -> list[str]:
        job_ids = [job_id for account in accounts for job_id in self._job_ids.get(account, [])]
        # -u takes one user name or "all"; jobs of accounts outside the pool are ignored.
        user = accounts[0] if len(accounts) == 1 else "all"
        scope = job_ids or ["-u", user]
        if not self.json:
            return ["bjobs", "-a", "-o", f"{_FIELDS} delimiter='{_DELIMITER}'", *scope]
        return ["bjobs", "-a", "-o", _FIELDS, "-json", *scope]

    def status_listed(self, done: Completed) -> bool:
        # With nothing to show bjobs exits 255 where LSB_BJOBS_CONSISTENT_EXIT_CODE=Y (0 by
        # default), and -json still prints an empty RECORDS list.
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        if not self.json:
            return all(_NOTHING_FOUND.match(line) or _NOT_FOUND.match(line) for line in lines)
        doc = _json_object(done.stdout)
        if doc is not None:
            return isinstance(doc.get("RECORDS"), list)
        if _OPTION_REFUSED.search(done.stderr):
            raise TransportError(
                f"bjobs refused `-json` ({lines[0] if lines else 'usage'}): it needs IBM "
                "Spectrum LSF 10.1 Fix Pack 2 or later; on an older LSF set `bjobs_json: false` "
                f"on pool {self.pool.name!r}, and Klique reads `bjobs -o` text instead"
            )
        return False

    def parse_status(self, stdout: str) -> list[NativeStatus]:
        found = parse_bjobs_json(stdout) if self.json else parse_bjobs_text(stdout)
        return [self._requeues.seen(status) for status in found]

    def cancel_argv(self, native_id: str) -> list[str]:
        return ["bkill", native_id]


# A job LSF has started, and one that waits (again): bjobs(1), "Job states".
_STARTED = frozenset({"RUN", "USUSP", "SSUSP", "UNKWN"})
_WAITING = frozenset({"PEND", "PSUSP", "PROV", "WAIT"})


class RequeueCount:
    """How often each job went back to waiting after it started, as Klique saw it. bjobs
    shows no count of requeues (bjobs -o has no such field), and a requeued job keeps its
    id: brequeue, an exit value in lsb.queues REQUEUE_EXIT_VALUES and a rerunnable job whose
    host failed all put a started job back to PEND (IBM Spectrum LSF 10.1, "Automatic job
    requeue", brequeue(1)). A job seen started, then waiting, was requeued: its count is the
    base's restart count, so the task goes back to pending and its wait is not charged."""

    def __init__(self) -> None:
        self._jobs: dict[str, tuple[bool, int]] = {}  # id: (seen started since, requeues)

    def seen(self, status: NativeStatus) -> NativeStatus:
        started, count = self._jobs.get(status.native_id, (False, 0))
        if status.state in _STARTED:
            started = True
        elif status.state in _WAITING and started:
            started, count = False, count + 1
        elif status.state not in _WAITING:  # ended (DONE, EXIT): it runs no more
            self._jobs.pop(status.native_id, None)
            return replace(status, restarts=count)
        self._jobs[status.native_id] = (started, count)
        return replace(status, restarts=count)


def secure_job_info_level(params: str) -> int | None:
    """`SECURE_JOB_INFO_LEVEL = N` in `bparams -a`; None where it is not shown."""
    found = _SECURE_JOB_INFO_LEVEL.search(params)
    return int(found[1]) if found else None


def _per_element(line: str) -> str:
    """An output or error file directive (-o/-oo/-e/-eo) named by the job's number, made one
    per element of an array."""
    words = line.split(maxsplit=2)
    if len(words) == 3 and words[1] in ("-o", "-oo", "-e", "-eo") and "%I" not in words[2]:
        return line.replace("%J", "%J.%I")
    return line


def run_limit_minutes(walltime_s: int) -> int:
    """bsub -W takes whole minutes; a walltime is rounded up so the job is never cut short."""
    return max(1, math.ceil(walltime_s / 60))


def parse_bsub(stdout: str) -> str:
    """bsub: `Job <id> is submitted to [default ]queue <name>.`"""
    match = _SUBMITTED.search(stdout)
    if match is None:
        raise SubmitError(f"bsub printed no job id: {stdout.strip()!r}")
    return match.group(1)


def parse_bjobs_json(stdout: str) -> list[NativeStatus]:
    """`bjobs -o "..." -json`: {"RECORDS": [...]}; a job id it does not know is an ERROR record.
    A slow mbatchd makes bjobs print "Cannot connect to LSF. Please wait ..." lines first."""
    if not stdout.strip():
        return []
    doc = _json_object(stdout)
    if doc is None:
        raise TransportError(f"bjobs -json printed no JSON: {stdout.strip()[:200]!r}")
    records = doc.get("RECORDS") or []
    found = [_record(r) for r in records if isinstance(r, dict) and "ERROR" not in r]
    return [status for status in found if status.native_id]


def parse_bjobs_text(stdout: str) -> list[NativeStatus]:
    """`bjobs -o "<_FIELDS> delimiter='^'"`: a header line that names the fields, then one
    job a line, "-" for an empty field; a line with the wrong number of fields is
    unreadable."""
    names = [name.upper() for name in _FIELDS.split()]
    found: list[NativeStatus] = []
    for line in stdout.splitlines():
        values = line.split(_DELIMITER)
        if values[0] == "JOBID":
            names = [value.strip() for value in values]
            continue
        if not line.strip() or not _ELEMENT_ID.sub(r"\1", values[0].strip()).isdigit():
            continue
        if len(values) != len(names):
            found.append(unreadable(values[0].strip(), f"{len(values)} fields in {line!r}"))
            continue
        fields = ["" if value == "-" else value for value in values]
        found.append(_status(dict(zip(names, fields, strict=True))))
    return found


def _json_object(text: str) -> dict[str, Any] | None:
    """The JSON object in bjobs' output, past any lines LSF printed before it."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        return None
    try:
        doc = json.loads(text[start : end + 1])
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _record(record: Mapping[str, Any]) -> NativeStatus:
    """A record without its id cannot be told to anyone (it is dropped), one without STAT is
    unreadable (an array element's by its element's id)."""
    if not record.get("STAT"):
        native_id, _name = _ids(record)
        return unreadable(native_id if record.get("JOBID") else "", f"no STAT in {record!r}"[:200])
    return _status(record)


def _ids(record: Mapping[str, Any]) -> tuple[str, str]:
    return _element(
        str(record.get("JOBID") or ""),
        str(record.get("JOBINDEX") or ""),
        str(record.get("JOB_NAME") or ""),
    )


def _status(record: Mapping[str, Any]) -> NativeStatus:
    stat = str(record.get("STAT", ""))
    code = _int(record.get("EXIT_CODE"))
    detail = str(record.get("PEND_REASON") or record.get("SUSPEND_REASON") or "")
    if stat == "EXIT":
        stat = _exit_state(str(record.get("EXIT_REASON") or ""), code)
        detail = "" if code is None else f"exit code {code}"
    native_id, name = _ids(record)
    user = str(record.get("USER") or "")
    return NativeStatus(native_id, name, stat, detail, code, user=user)


def _element(job_id: str, index: str, name: str) -> tuple[str, str]:
    """An array element's id, "3000[3]" (its array's number and its index; a JOBID that
    shows the index already is kept), and its array's name without "[3]"; a job outside an
    array (index 0, or none) keeps its id and name."""
    match = _ELEMENT_ID.fullmatch(job_id)
    if match is None and index.isdigit() and int(index) > 0:
        match = _ELEMENT_ID.fullmatch(f"{job_id}[{int(index)}]")
    if match is None:
        return job_id, name
    return match[0], name.removesuffix(f"[{match[2]}]")


def _exit_state(exit_reason: str, code: int | None) -> str:
    """`EXIT/<reason>` for a termination reason the table knows, else EXIT."""
    term = exit_reason.split(":", 1)[0].strip()
    if not term and code == _RUNLIMIT_EXIT_CODE:
        term = "TERM_RUNLIMIT"
    return f"EXIT/{term}" if term in LSF_TERMINATIONS else "EXIT"


def _int(value: object) -> int | None:
    try:
        return int(str(value))
    except ValueError:
        return None
