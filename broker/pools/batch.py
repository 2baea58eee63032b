"""The batch driver: owns the flow for Slurm, PBS and LSF. A scheduler module supplies argv
builders, output parsers and a state table; this class renders, submits as the mapped
account, tags, polls with one query per cycle, reads exit files and reconciles.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import time
from abc import abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from markupsafe import Markup

from broker.containers import container_fields
from broker.domain import Pool, Profile, Task, TaskState
from broker.errors import KliqueError, SubmitError, SubmitUnknown, TransportError
from broker.pools.arrays import (
    ARRAY_NAME,
    array_folder,
    array_folder_named,
    array_name,
    dispatcher,
    elements_of,
    is_array_folder,
    shared_directives,
)
from broker.pools.base import (
    PREEMPTED_MARKER,
    RUNNER_OUTCOMES,
    ClaimedEnds,
    Context,
    Observation,
    PoolDriver,
    Submission,
    observation_from_exit,
    parse_json,
)
from broker.scheduler.placement import PoolState
from broker.templates import (
    TemplateFile,
    find_template,
    render,
    safe_directive,
    search_roots,
)
from broker.transport import BATCH_ITEMS, Completed, JobFolder, Transport, make_transport

log = logging.getLogger("klique.pools")

_MAX_BACKOFF = 8
_NEVER_RAN_TRIES = 3  # attempts for a task whose jobs never ran (nodes that fail to boot)
# The phase of a pending task whose job the scheduler requeued and holds (see `held`).
HELD_PHASE = "held"
_TAG = re.compile(r"klique-\d+")


@dataclass(frozen=True)
class NativeStatus:
    """One job as the scheduler's status command shows it."""

    native_id: str
    name: str
    state: str
    reason: str = ""
    exit_code: int | None = None
    script: str = ""  # the submitted script's path, where the status command shows it
    problem: str = ""  # the job's record could not be read: why (it waits for the next cycle)
    restarts: int | None = None  # how often the scheduler requeued it, where it says
    user: str = ""  # the account that owns the job, where the status command shows it


def unreadable(native_id: str, problem: str) -> NativeStatus:
    """A job the status command listed but whose record could not be read this time."""
    return NativeStatus(native_id, "", "", problem=problem)


@dataclass(frozen=True)
class _Job:
    """One task of a batch of submissions: its place in the batch, and its job folder."""

    index: int
    task: Task
    folder: JobFolder


# An array to submit: the directive lines its tasks share (shared_directives), and its tasks.
_Array = tuple[tuple[str, ...], list[_Job]]


@dataclass(frozen=True)
class Capacity:
    free_gpus: float = 0.0
    free_cpus: int | None = None
    free_nodes: int | None = None  # idle nodes (None: not counted)


class BatchDriver(PoolDriver):
    """A pool behind a batch scheduler. Subclasses fill in the hooks below."""

    submit_batch = BATCH_ITEMS  # tasks the agent hands `submit_many` at once

    kind: ClassVar[str]
    STATES: ClassVar[Mapping[str, TaskState]]
    REASONS: ClassVar[Mapping[str, str]] = {}
    PREEMPTED: ClassVar[frozenset[str]] = frozenset()  # native states that mean preempted
    UNREACHABLE: ClassVar[re.Pattern[str] | None] = None  # submit errors: controller is down
    # Submit errors after which the job may exist (the reply was lost): the task's tag is
    # looked up before it is submitted again. Checked before UNREACHABLE.
    SUBMIT_UNKNOWN: ClassVar[re.Pattern[str] | None] = None
    # How long a request whose reply was lost may still be inside the scheduler (its message
    # timeout): a lost submission is resubmitted only after two looks for its tag this far
    # apart both miss. The pool's `message_timeout`, else what the scheduler says, else this.
    MESSAGE_TIMEOUT_S: ClassVar[float] = 10.0
    # Native end states that only say the job script ended by itself (any exit, a signal):
    # without the runner's exit file they tell nothing of how the task ended.
    SELF_ENDED: ClassVar[frozenset[str]] = frozenset()
    # Native states of a job that holds its allocation but does not run (nodes booting,
    # execution suspended): the phase it is observed in, charged only where the pool says.
    PHASES: ClassVar[Mapping[str, str]] = {}
    # Native end states of a job that never ran (its node failed to boot): it goes again.
    NEVER_RAN: ClassVar[frozenset[str]] = frozenset()
    # Native states, counted as running, of a job whose run is ending: seen with a restart
    # count that grew, the job was just requeued.
    ENDING: ClassVar[frozenset[str]] = frozenset()
    # Status reasons of a job the scheduler requeued and held after its launch failed: the
    # pool's `requeued_held` releases it, or withdraws it (the task goes again from Klique).
    HELD_AFTER_FAILED_LAUNCH: ClassVar[re.Pattern[str] | None] = None
    # Native end states of a job whose node failed: run again from Klique's queue where the
    # pool's driver says it reruns them (`reruns_node_failures`), a few times.
    NODE_FAILED: ClassVar[frozenset[str]] = frozenset()
    SUBMIT_STDIN: ClassVar[bool] = False  # the submit command reads the script on its stdin
    # The status command shows every batch job's script: a job with a task's tag but no
    # script (a --wrap of another account's) is never taken for the task's.
    SHOWS_SCRIPT: ClassVar[bool] = False
    # Status errors that mean the scheduler shows each account only its own jobs: status then
    # runs one query per mapped account, as that account (the pool's `status_per_account`).
    OTHERS_HIDDEN: ClassVar[re.Pattern[str] | None] = None

    def __init__(self, pool: Pool, context: Context, transport: Transport | None = None) -> None:
        super().__init__(pool, context)
        self.transport = transport or make_transport(pool)
        self.job_root = str(pool.settings.get("job_root"))
        self.python = str(pool.settings.get("python") or "python3")
        self.interval_s = float(pool.settings.get("poll_interval") or 10)  # type: ignore[arg-type]
        self.lost_after_s = float(pool.settings.get("lost_after") or 120)  # type: ignore[arg-type]
        timeout = pool.settings.get("message_timeout") or self.MESSAGE_TIMEOUT_S
        self.message_timeout_s = float(timeout)  # type: ignore[arg-type]
        self._unknown: dict[int, str] = {}  # task id: why its submission's outcome is unknown
        self._missed_at: dict[int, float] = {}  # task id: the first look that missed its job
        self._backoff = 1
        self._next_poll = 0.0
        self._polled_at = 0.0
        self._claims = ClaimedEnds(self.interval_s)
        self._last: dict[str, NativeStatus] = {}
        self._missing_since: dict[int, float] = {}
        self._phases: dict[int, str] = {}  # the phase last reported for each running task
        self._restarts: dict[int, int] = {}  # each running task's job's restart count
        self._freed: set[tuple[str, int | None]] = set()  # held jobs acted on: (id, restarts)
        phases = pool.settings.get("charge_phases")
        self._charged = frozenset(phases) if isinstance(phases, list) else frozenset()
        self._capacity = Capacity()
        self._capacity_error = ""
        self._submit_backoff = 0.0  # how long submissions wait after the controller was down
        self._submit_paused_until = 0.0
        self._submit_error = ""
        self.status_calls = 0
        per_account = pool.settings.get("status_per_account")
        self._per_account = bool(per_account)
        self._detect_per_account = per_account is None
        self._problems_seen: set[tuple[str, str]] = set()
        self._runner: bytes | None = None
        # Tags of tasks submitted but maybe not recorded yet (the agent records a batch after
        # its command ends): their jobs are no strangers.
        self._submitting: set[str] = set()
        self._submitting_arrays: dict[str, set[str]] = {}  # array job name: its tasks' tags
        self.max_array = self.MAX_ARRAY  # as the scheduler's settings allow, where it says

    # Hooks a scheduler module supplies.

    @abstractmethod
    def directives(self, task: Task, profile: Profile, job_dir: str) -> list[str]:
        """The scheduler directives for this task, tagged with its id."""

    @abstractmethod
    def submit_argv(self, script: str) -> list[str]: ...

    @abstractmethod
    def parse_submit(self, stdout: str) -> str:
        """The native job id from the submit command's output."""

    @abstractmethod
    def status_argv(self, accounts: Sequence[str]) -> list[str]:
        """One command that shows all of Klique's jobs in this pool, finished ones included."""

    @abstractmethod
    def parse_status(self, stdout: str) -> list[NativeStatus]: ...

    def status_listed(self, done: Completed) -> bool:
        """Whether a status query that exited non-zero still listed the jobs it knows (some
        schedulers exit non-zero when a named job has left, or when there is nothing to show)."""
        return False

    def status_again(self, argv: Sequence[str], done: Completed) -> bool:
        """Whether the answer taught the driver to ask differently (a server setting it could
        not know before): the query then runs again at once, with the new argv."""
        return False

    @abstractmethod
    def cancel_argv(self, native_id: str) -> list[str]: ...

    def capacity_argv(self) -> list[str] | None:
        return None

    def parse_capacity(self, stdout: str) -> Capacity:
        return Capacity()

    def test_only_argv(self, script: str) -> list[str] | None:
        """Validate a script without queueing it (None: the scheduler cannot)."""
        return None

    def history_argv(self, native_ids: Sequence[str]) -> list[str] | None:
        """The scheduler's accounting for jobs that left the queue (None: it has none)."""
        return None

    def parse_history(self, stdout: str) -> list[NativeStatus]:
        return []

    def release_argv(self, native_id: str) -> list[str] | None:
        """Release a held job (None: the scheduler cannot)."""
        return None

    def held(self, status: NativeStatus) -> str:
        """What to do about a job the scheduler requeued and holds ("" for any other job): it
        waits for a release nobody gives unless told, so the task shows the phase `held`."""
        return ""

    @property
    def reruns_node_failures(self) -> bool:
        """Klique, not the scheduler, runs again a job whose node failed (NODE_FAILED)."""
        return False

    def ending_note(self, job_dir: str) -> str | None:
        """A file in the job directory where the scheduler notes why it ended a job (its own
        lines in the job's output), read when the job left the queue and the exit file names
        only a signal (None: there is none)."""
        return None

    def parse_ending_note(self, text: str) -> str | None:
        """The native end state the note names (a walltime kill), or None."""
        return None

    # The flow.

    def query_account(self) -> str:
        """The account that runs status and capacity queries (they need no particular one)."""
        configured = self.pool.settings.get("query_account")
        if configured:
            return str(configured)
        accounts = list(self.pool.user_map.accounts.values())
        return accounts[0] if accounts else str(self.pool.user_map.default)

    def check_account(self) -> str | None:
        return self.query_account()

    def render(self, task: Task, job_dir: str | None = None) -> str:
        # A preview (no job folder yet) shows the folder as named by the tag alone.
        job_dir = job_dir or task.job_dir or f"{self.job_root.rstrip('/')}/{task.tag}"
        resource = self.context.estate.resources[task.resource]
        skip = set(self.pool.skip_directives) | set(resource.skip_directives)
        directives = [
            *self.directives(task, resource.profile, job_dir),
            *self.pool.extra_directives,
            *resource.extra_directives,
        ]
        kept = [
            safe_directive(d, f"pool {self.pool.name} / compute resource {resource.name}")
            for d in directives
            if d.split("=", 1)[0].split(" ", 1)[0] not in skip and d not in skip
        ]
        profile = resource.profile
        context: dict[str, Any] = {
            "task_id": task.id,
            "tag": task.tag,
            "owner": task.owner,
            "owner_email": _email(task.owner, self.context.estate.mail_domain),
            "account": self.pool.user_map.account_for(task.owner) or "",
            "project": task.spec.project,
            "resource": resource.name,
            "pool": self.pool.name,
            "directives": kept,
            "gpus": profile.gpus,
            "cpus": profile.cpus,
            "memory_mb": profile.memory_mb,
            "walltime_s": profile.walltime_s,
            "nodes": profile.nodes,
            "node_launch": self.node_launch(profile),
            "job_dir": job_dir,
            "python": self.python,
            **container_fields(self.pool, task, job_dir),
        }
        return render(self.template(resource.name), context, self.template_roots())

    def node_launch(self, profile: Profile) -> Markup:
        """For a task on several nodes: the command that starts one runner on each of them
        (the scheduler's launcher, with validated numbers only); empty for one node."""
        return Markup("")

    def template_roots(self) -> tuple[Path, ...]:
        return search_roots(self.context.estate.templates_dir)

    def template(self, resource: str) -> TemplateFile:
        """The file a compute resource's script is rendered from on this pool."""
        return find_template(self.kind, resource, self.pool.template, self.template_roots())

    def _runner_bytes(self) -> bytes:
        """The runner zipapp, read once: the server builds it once at start."""
        if self._runner is None:
            self._runner = self.context.runner.read_bytes()
        return self._runner

    async def submit(self, task: Task, report_token: str) -> Submission:
        account = self.account(task)
        await self.stage_uv(account)
        job = self._job_folder(task, report_token)
        answer: Completed | Exception
        try:  # the job directory is written and submitted in one command: one spawn, or session
            answer = await self.transport.write_files(
                job.folder,
                job.files,
                account=account,
                then=job.then,
                then_stdin=job.then_stdin,
                timeout=60,
            )
        except TransportError as exc:
            answer = exc
        outcome = self._note_outcome(task, self._outcome(job.folder, answer))
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def submit_many(self, tasks: Sequence[tuple[Task, str]]) -> list[Submission | Exception]:
        """`submit` for each task, with one command per account (up to BATCH_ITEMS each), and
        one array job for each sweep's tasks that share every directive: each task's outcome
        is what `submit` would raise or return for it."""
        results: dict[int, Submission | Exception] = {}
        groups: dict[str, list[_Job]] = {}
        for index, (task, report_token) in enumerate(tasks):
            try:
                account = self.account(task)
                await self.stage_uv(account)
                job = _Job(index, task, self._job_folder(task, report_token))
                groups.setdefault(account, []).append(job)
            except Exception as exc:  # this task's own fault (its user, its template)
                results[index] = exc
        answers = await asyncio.gather(
            *(self._submit_as(account, jobs) for account, jobs in groups.items())
        )
        for outcomes in answers:
            for index, outcome in outcomes.items():
                results[index] = self._note_outcome(tasks[index][0], outcome)
                if isinstance(outcome, Exception) and not isinstance(outcome, SubmitUnknown):
                    self._submitting.discard(tasks[index][0].tag)  # no job was queued
        return [results[index] for index in range(len(tasks))]

    async def _submit_as(
        self, account: str, jobs: Sequence[_Job]
    ) -> dict[int, Submission | Exception]:
        self._submitting |= {job.task.tag for job in jobs}
        arrays, singles = self._arrays(jobs)
        outcomes: dict[int, Submission | Exception] = {}
        for shared, elements in arrays:
            outcomes.update(await self._submit_array(account, shared, elements))
        folders = [job.folder for job in singles]
        done = await self.transport.write_and_submit_many(
            folders, account=account, timeout=60 + len(folders)
        )
        for job, answer in zip(singles, done, strict=True):
            outcomes[job.index] = self._outcome(job.folder.folder, answer)
        return outcomes

    def _outcome(self, job_dir: str, answer: Completed | Exception) -> Submission | Exception:
        """What one submit command's answer (or the transport's failure) means for its task.
        A transport that failed once the command was sent leaves the outcome unknown: the
        scheduler may have queued the job."""
        if isinstance(answer, TransportError):
            return SubmitUnknown(f"the submit command's outcome is unknown: {answer}")
        if isinstance(answer, Exception):
            return answer
        try:
            return self._submitted(job_dir, answer)
        except KliqueError as exc:
            return exc

    def _note_outcome(self, task: Task, outcome: Submission | Exception) -> Submission | Exception:
        """Remember which tasks' submissions have an unknown outcome (for `klique why`)."""
        self._missed_at.pop(task.id, None)
        if isinstance(outcome, SubmitUnknown):
            self._unknown[task.id] = str(outcome)
        else:
            self._unknown.pop(task.id, None)
        return outcome

    def outcome_unknown(self, task_id: int) -> str | None:
        """Why a placed task waits, where its submission's reply was lost; None otherwise."""
        words = self._unknown.get(task_id)
        if words is None:
            return None
        return (
            f"{words}; its job may exist: Klique looks for its tag twice, at least "
            f"{self.message_timeout_s:g} s apart, and submits it again only if neither finds it"
        )

    # Job arrays, where the scheduler has them (docs/job-arrays.md).

    ARRAY_INDEX: ClassVar[str | None] = None  # the variable holding an element's index
    ARRAY_FIRST: ClassVar[int] = 0  # the first element's index
    DIRECTIVE: ClassVar[str] = ""  # how a directive line starts in a job script ("#SBATCH")
    MAX_ARRAY: ClassVar[int] = 1000  # elements in one array job

    @property
    def array_index(self) -> str | None:
        """The variable holding an element's index (None: no arrays); a dialect may choose."""
        return self.ARRAY_INDEX

    def array_directives(self, shared: Sequence[str], count: int) -> list[str]:
        """The array job's directive lines: those its tasks share (with the placeholders of
        `shared_directives`), and what makes it an array of `count` elements from ARRAY_FIRST."""
        raise NotImplementedError

    def element_id(self, array_id: str, index: int) -> str:
        """One element's native id, as the status command lists it and cancel takes it."""
        return f"{array_id}_{index}"

    def element_index(self, native_id: str) -> int | None:
        """The index in an element's native id (None: not an element's)."""
        array, _, index = native_id.rpartition("_")
        return int(index) if array and index.isdigit() else None

    def batches(self, tasks: Sequence[Task]) -> list[list[Task]]:
        """Each sweep's new tasks together (up to an array's size), the rest BATCH_ITEMS at a
        time."""
        if not self._uses_arrays():
            return super().batches(tasks)
        sweeps: dict[int | None, list[Task]] = {}
        for task in tasks:
            sweeps.setdefault(task.sweep, []).append(task)
        found: list[list[Task]] = []
        for sweep, members in sweeps.items():
            size = BATCH_ITEMS if sweep is None else self.max_array
            found += [members[n : n + size] for n in range(0, len(members), size)]
        return found

    def _uses_arrays(self) -> bool:
        wanted = self.pool.settings.get("job_arrays") is not False
        return wanted and self.array_index is not None and self.max_array > 1

    def _arrays(self, jobs: Sequence[_Job]) -> tuple[list[_Array], list[_Job]]:
        """The tasks of one sweep whose directives agree, as arrays of two or more (each with
        the directives its tasks share); the rest, one job each."""
        if not self._uses_arrays():
            return [], list(jobs)
        groups: dict[tuple[int, tuple[str, ...]], list[_Job]] = {}
        singles: list[_Job] = []
        for job in jobs:
            if job.task.sweep is None:
                singles.append(job)
                continue
            script = job.folder.files["job.sh"][0].decode()
            shared = shared_directives(script, self.DIRECTIVE, job.folder.folder, job.task.tag)
            groups.setdefault((job.task.sweep, shared), []).append(job)
        arrays: list[_Array] = []
        for (_sweep, shared), members in groups.items():
            for start in range(0, len(members), self.max_array):
                chunk = members[start : start + self.max_array]
                if len(chunk) > 1:
                    arrays.append((shared, chunk))
                else:
                    singles += chunk
        return arrays, singles

    async def _submit_array(
        self, account: str, shared: Sequence[str], elements: Sequence[_Job]
    ) -> dict[int, Submission | Exception]:
        """One array job for these tasks: their folders first (each without the runner), then
        the array's folder (the runner once, and the dispatcher), submitted with one command.
        A task whose folder could not be written is left out of the array with its error."""
        without_runner = [
            replace(job.folder, files=_but_runner(job.folder.files), then=(), then_stdin=None)
            for job in elements
        ]
        written = await self.transport.write_folders(
            without_runner, account=account, timeout=60 + len(elements)
        )
        outcomes: dict[int, Submission | Exception] = {}
        members: list[_Job] = []
        for job, fault in zip(elements, written, strict=True):
            if fault is not None:  # nothing was submitted for it
                outcomes[job.index] = fault
            else:
                members.append(job)
        if not members:
            return outcomes
        first = members[0]
        folder = array_folder(self.job_root, first.task.id)
        name = array_name(folder)
        script = dispatcher(
            self.array_directives(shared, len(members)),
            str(self.array_index),
            folder,
            name,
            [job.folder.folder for job in members],
            first=self.ARRAY_FIRST,
        )
        files = {
            "klique-runner.pyz": (self._runner_bytes(), 0o600),
            "job.sh": (script.encode(), 0o700),
        }
        then_stdin = "job.sh" if self.SUBMIT_STDIN else None
        array = JobFolder(folder, files, self.submit_argv(f"{folder}/job.sh"), then_stdin)
        self._submitting_arrays[name] = {job.task.tag for job in members}
        [answer] = await self.transport.write_and_submit_many(
            [array], account=account, timeout=60 + len(members)
        )
        outcome = self._outcome(folder, answer)
        for index, job in enumerate(members, start=self.ARRAY_FIRST):
            if isinstance(outcome, Exception):
                outcomes[job.index] = outcome
            else:
                native_id = self.element_id(outcome.native_id, index)
                outcomes[job.index] = Submission(native_id, job.folder.folder)
        return outcomes

    def _job_folder(self, task: Task, report_token: str) -> JobFolder:
        """The task's job folder: its files (in a new folder of mode 700, owned by the
        account) and the command that submits its script."""
        job_dir = str(task.job_dir)
        script = self.render(task, job_dir)
        document = self.task_document(task, report_token)
        nodes = self.context.estate.resources[task.resource].profile.nodes
        if nodes > 1:  # one runner per node (inside_job/ranks.py)
            document["nodes"] = nodes
        files = {
            "task.json": (_json_bytes(document), 0o600),
            "klique-runner.pyz": (self._runner_bytes(), 0o600),
            "job.sh": (script.encode(), 0o700),
        }
        then_stdin = "job.sh" if self.SUBMIT_STDIN else None
        return JobFolder(job_dir, files, self.submit_argv(f"{job_dir}/job.sh"), then_stdin)

    def _submitted(self, job_dir: str, done: Completed) -> Submission:
        """What the submit command's answer means for the task (raised: its error)."""
        words = (done.stderr or done.stdout).strip() or f"exit {done.returncode}"
        if done.returncode != 0 and self.SUBMIT_UNKNOWN and self.SUBMIT_UNKNOWN.search(words):
            raise SubmitUnknown(f"the scheduler may have queued the job: {words}")
        if done.returncode != 0 and self.UNREACHABLE and self.UNREACHABLE.search(words):
            self._pause_submissions(words)
            raise TransportError(words)  # nothing was queued: the task waits for the pool
        self._submit_backoff = 0.0
        if done.returncode != 0:
            raise SubmitError(words)
        return Submission(native_id=self.parse_submit(done.stdout), job_dir=job_dir)

    def _pause_submissions(self, words: str) -> None:
        """The controller could not be reached: the pool shows unreachable and takes no
        submission for a while (doubling, up to the status backoff), or until a poll answers."""
        longest = self.interval_s * _MAX_BACKOFF
        self._submit_backoff = min(max(self._submit_backoff * 2, self.interval_s), longest)
        self._submit_paused_until = time.monotonic() + self._submit_backoff
        self._submit_error = f"submission failed: {words}"

    async def cancel(self, task: Task) -> None:
        if not task.native_id:
            return
        done = await self.transport.run(
            self.cancel_argv(task.native_id), account=self.account(task), timeout=60
        )
        if done.returncode != 0:
            log.warning(
                "pool %s: cancel of %s: %s", self.pool.name, task.native_id, done.stderr.strip()
            )

    async def capacity(self, active: Sequence[Task]) -> PoolState:
        waiting = sum(1 for t in active if t.state is not TaskState.RUNNING)
        error = "; ".join(self.problems) or self._capacity_error
        if not error and time.monotonic() < self._submit_paused_until:
            error = self._submit_error
        return PoolState(
            self.pool.name,
            free_gpus=self._capacity.free_gpus,
            free_cpus=self._capacity.free_cpus,
            free_nodes=self._capacity.free_nodes,
            queued=waiting,
            reachable=not error,
            reason=error,
        )

    async def poll(self, tasks: Sequence[Task]) -> dict[int, Observation]:
        """One status query for all of the pool's jobs, at the pool's interval with jitter, or
        sooner where a runner has claimed its end (at most once a second while claims come)."""
        now = time.monotonic()
        claimed = frozenset(t.id for t in tasks if t.claim is not None)
        early = self.confirm_in(claimed) == 0.0  # the rule the agent wakes by, too
        if now < self._next_poll and not early:
            return {}
        self._polled_at = now
        self._claims.seen(claimed)
        accounts = sorted({a for t in tasks if (a := self._account_or_none(t))})
        try:
            listing = await self._status(accounts or [self.query_account()])
            await self._refresh_capacity()
        except KliqueError as exc:
            self._backoff = min(self._backoff * 2, _MAX_BACKOFF)
            self._capacity_error = f"status query failed: {exc}"
            self._schedule_next(now)
            raise
        self._backoff = 1
        self._capacity_error = ""
        self._submit_paused_until = 0.0  # the controller answers again
        self._schedule_next(now)
        self._last = {s.native_id: s for s in listing}
        return await self._observe(tasks)

    def confirm_in(self, claimed: frozenset[int]) -> float | None:
        if self._backoff != 1:
            return None
        return self._claims.due_in(claimed, time.monotonic() - self._polled_at)

    def _schedule_next(self, now: float) -> None:
        interval = self.interval_s * self._backoff
        self._next_poll = now + interval * random.uniform(0.9, 1.1)

    def _account_or_none(self, task: Task) -> str | None:
        return self.pool.user_map.account_for(task.owner)

    async def _status(self, accounts: Sequence[str]) -> list[NativeStatus]:
        """One query for the pool, or one per account where the scheduler hides the jobs of
        other users; their listings are merged."""
        if not self._per_account:
            done = await self._query(accounts, self.query_account())
            if not self._others_hidden(done):
                return self._listing(done)
        answers = await asyncio.gather(*(self._query([a], a) for a in accounts))
        return [status for done in answers for status in self._listing(done)]

    async def _query(self, accounts: Sequence[str], account: str) -> Completed:
        argv = self.status_argv(accounts)
        done = await self._run_status(argv, account)
        if self.status_again(argv, done):
            done = await self._run_status(self.status_argv(accounts), account)
        return done

    async def _run_status(self, argv: Sequence[str], account: str) -> Completed:
        self.status_calls += 1
        return await self.transport.run(argv, account=account, timeout=max(30.0, self.interval_s))

    def _others_hidden(self, done: Completed) -> bool:
        """The scheduler refused to show other accounts' jobs: ask per account from now on."""
        hidden = self.OTHERS_HIDDEN
        if not (self._detect_per_account and hidden and hidden.search(done.stderr)):
            return False
        self._per_account = True
        log.warning(
            "pool %s: %s shows each account only its own jobs (%s); status now runs one query "
            "per mapped account. Set `status_per_account: true` on the pool to skip this check",
            self.pool.name,
            self.kind,
            done.stderr.strip().splitlines()[0],
        )
        return True

    def _listing(self, done: Completed) -> list[NativeStatus]:
        if done.returncode != 0 and not self.status_listed(done):
            raise TransportError(done.stderr.strip() or f"exit {done.returncode}")
        return self.parse_status(done.stdout)

    async def _refresh_capacity(self) -> None:
        argv = self.capacity_argv()
        if argv is None:
            return
        done = await self.transport.run(argv, account=self.query_account(), timeout=30)
        if done.returncode == 0:
            self._capacity = self.parse_capacity(done.stdout)
        elif self.UNREACHABLE and self.UNREACHABLE.search(done.stderr):
            raise TransportError(done.stderr.strip())  # the controller is down: so is the pool

    async def _observe(self, tasks: Sequence[Task]) -> dict[int, Observation]:
        placed = [t for t in tasks if t.state is TaskState.PLACED]
        elements = await self._array_elements(placed) if placed else {}
        self._note_strangers(tasks, found=elements.values())
        docs = await self._exit_files([t for t in tasks if self._needs_exit_file(t)])
        news: dict[int, Observation] = {}
        gone: list[Task] = []
        for task in tasks:
            if task.state is TaskState.PLACED:
                found = self._find(task, docs.get(task.id), elements)
                if found is not None:
                    news[task.id] = found
                continue
            status = self._last.get(task.native_id or "")
            if status is None:
                gone.append(task)
                continue
            if status.problem:
                self._note_problem(status)
                continue
            seen = self._from_status(task, status, docs.get(task.id))
            if seen is None:
                continue
            new_phase = self._new_phase(task, seen)
            if self._held_after_failed_launch(status):
                news[task.id] = await self._free_held(task, status, seen)
            elif seen.state != task.state or new_phase:
                news[task.id] = seen
        if gone:
            news.update(await self._settle(gone, docs))
        return news

    def _needs_exit_file(self, task: Task) -> bool:
        """Placed with an unknown outcome, gone from the queue, or ended in it."""
        if task.state is TaskState.PLACED:
            return True
        status = self._last.get(task.native_id or "")
        state = self.STATES.get(status.state) if status is not None else None
        return status is None or (state is not None and state.final)

    async def _exit_files(self, tasks: Sequence[Task]) -> dict[int, dict[str, Any] | None]:
        """Every exit file these tasks need, read as each account in one command: one per
        account per cycle, never one per task."""
        by_account: dict[str, list[Task]] = {}
        for task in tasks:
            account = self._account_or_none(task)
            if task.job_dir and account:
                by_account.setdefault(account, []).append(task)
        docs: dict[int, dict[str, Any] | None] = {}
        for account, group in by_account.items():
            paths = [f"{t.job_dir}/exit.json" for t in group]
            found = await self.transport.read_files(paths, account=account)
            for task, path in zip(group, paths, strict=True):
                docs[task.id] = parse_json(found.get(path))
        return docs

    def _find(
        self, task: Task, exit_doc: Mapping[str, Any] | None, elements: Mapping[str, str]
    ) -> Observation | None:
        """A task whose submission's outcome is unknown: its tag in the queue, its array
        element (`elements`: job folder to element id), or its files; None while it is
        still unknown (`_missed`)."""
        seen = self._seen(task, exit_doc, elements)
        if seen is None:
            return self._missed(task)
        self._unknown.pop(task.id, None)
        self._missed_at.pop(task.id, None)
        return seen

    def _seen(
        self, task: Task, exit_doc: Mapping[str, Any] | None, elements: Mapping[str, str]
    ) -> Observation | None:
        """The task's job, found by its tag, its array element or its exit file; None."""
        job_dir = str(task.job_dir)
        if job_dir in elements:
            return Observation(TaskState.SUBMITTED, native_id=elements[job_dir], job_dir=job_dir)
        for status in self._last.values():
            # The tag alone may be another installation's, or an earlier attempt's: where the
            # scheduler shows the script, it must be this attempt's.
            scripts = (f"{job_dir}/job.sh",) if self.SHOWS_SCRIPT else ("", f"{job_dir}/job.sh")
            ours = status.name == task.tag and status.script in scripts
            if ours and self.STATES.get(status.state) is not TaskState.CANCELLED:
                return Observation(TaskState.SUBMITTED, native_id=status.native_id, job_dir=job_dir)
        if task.job_dir and exit_doc is not None:
            return Observation(TaskState.SUBMITTED, native_id="", job_dir=job_dir)
        return None

    def _missed(self, task: Task) -> Observation | None:
        """No job carries the task's tag. A request whose reply was lost may still be inside
        the scheduler (Slurm's slurmctld works on it until MessageTimeout), so one look proves
        nothing: the task goes again only when a second look, taken at least the message
        timeout after the first, misses it too. Both are the pool's status query, which sees
        every account's jobs (per account where the scheduler hides others')."""
        first = self._missed_at.setdefault(task.id, self._polled_at)
        if self._polled_at - first < self.message_timeout_s:
            return None
        self._missed_at.pop(task.id, None)
        self._unknown.pop(task.id, None)
        return Observation(
            TaskState.QUEUED,
            "no job carries its tag in two looks "
            f"{self._polled_at - first:.0f} s apart after a submission whose "
            "outcome was unknown; submitting it again",
        )

    async def _array_elements(self, placed: Sequence[Task]) -> dict[str, str]:
        """For tasks whose submission's outcome is unknown: the array element that runs each
        one's folder (folder: element id). The dispatcher of each array job in the queue is
        read as the tasks' accounts, and believed only where it lies in an array folder of
        the pool's job root that the account owns: another account's array job, whatever it
        names, is never taken for a task's."""
        scripts: dict[str, list[NativeStatus]] = {}
        for status in self._last.values():
            cancelled = self.STATES.get(status.state) is TaskState.CANCELLED
            script = _dispatcher(status, self.job_root)
            folder = script.removesuffix("/job.sh")
            ours = is_array_folder(folder, self.job_root) and array_name(folder) == status.name
            if ours and not cancelled:
                scripts.setdefault(script, []).append(status)
        wanted: dict[str, set[str]] = {}
        for task in placed:
            account = self._account_or_none(task)
            if task.job_dir and account:
                wanted.setdefault(account, set()).add(task.job_dir)
        found: dict[str, str] = {}
        for account, folders in sorted(wanted.items()) if scripts else []:
            texts = await self.transport.read_files(sorted(scripts), account=account)
            for path, data in texts.items():
                if not await self._owned(path.removesuffix("/job.sh"), account):
                    continue
                table = elements_of(data.decode(errors="replace"))
                at = {index: folder for folder, index in table.items() if folder in folders}
                for status in scripts[path]:
                    if status.user and status.user != account:
                        continue  # another account's job, named as this one's array
                    index = self.element_index(status.native_id)
                    if index is not None and index in at:
                        found[at[index]] = status.native_id
        return found

    async def _owned(self, folder: str, account: str) -> bool:
        """Whether the folder is the account's own (not a link, not another's)."""
        try:
            await self.transport.private_dir(folder, account=account)
        except KliqueError:
            return False
        return True

    def _note_problem(self, status: NativeStatus) -> None:
        """An unreadable record: logged once; the job is left alone until it reads again."""
        if (status.native_id, status.problem) not in self._problems_seen:
            self._problems_seen.add((status.native_id, status.problem))
            log.warning(
                "pool %s: the status of job %s could not be read (%s); it is left as it was "
                "until its record reads again",
                self.pool.name,
                status.native_id,
                status.problem,
            )

    def _note_strangers(self, tasks: Sequence[Task], found: Iterable[str] = ()) -> None:
        """Jobs with Klique's tag that Klique does not know (`found`: array elements found
        this cycle for tasks whose submission's outcome was unknown): reported, never
        cancelled."""
        known = {t.tag for t in tasks}
        followed = {t.native_id for t in tasks if t.native_id} | set(found)
        self._submitting -= known  # recorded: followed from now on
        self._submitting_arrays = {
            name: tags & self._submitting
            for name, tags in self._submitting_arrays.items()
            if tags & self._submitting
        }
        for status in self._last.values():
            if status.name in known or status.native_id in followed:
                self.strangers.discard(status.native_id)
            elif self._stranger(status) and status.native_id not in self.strangers:
                log.warning(
                    "pool %s: job %s (%s) carries Klique's tag but no task of this pool owns "
                    "it; leaving it alone",
                    self.pool.name,
                    status.native_id,
                    status.name,
                )
                self.strangers.add(status.native_id)

    def _stranger(self, status: NativeStatus) -> bool:
        """A live job named as Klique names jobs, not one whose submission is being recorded."""
        if status.name in self._submitting or status.name in self._submitting_arrays:
            return False
        tagged = _TAG.fullmatch(status.name) or ARRAY_NAME.fullmatch(status.name)
        return bool(tagged) and not self.STATES.get(status.state, TaskState.RUNNING).final

    def _from_status(
        self, task: Task, status: NativeStatus, exit_doc: Mapping[str, Any] | None
    ) -> Observation | None:
        state = self.STATES.get(status.state)
        if state is None:
            log.warning(
                "pool %s: unknown state %r for job %s",
                self.pool.name,
                status.state,
                status.native_id,
            )
            return None
        if not state.final:
            self._missing_since.pop(task.id, None)
            advice = self.held(status)
            if self._requeued(task, status, state):
                reason = "; ".join(p for p in (self._requeue_reason(status), advice) if p)
                phase = HELD_PHASE if advice else ""
                return Observation(TaskState.PENDING, reason, phase=phase, requeued=True)
            if advice:
                reason = "; ".join(p for p in (self._reason(status), advice) if p)
                return Observation(state, reason, phase=HELD_PHASE, charged=False)
            phase = self.PHASES.get(status.state, "")
            charged = not phase or phase in self._charged
            return Observation(state, self._reason(status), phase=phase, charged=charged)
        return self._final(task, status, exit_doc)

    def _requeued(self, task: Task, status: NativeStatus, state: TaskState) -> bool:
        """A running task's job was requeued: its restart count grew since it was seen. The
        job may still show its old run ending (Slurm's COMPLETING), or run again already when
        the next listing comes; the count alone tells. A listing older than the runner's report
        has no greater count, and without a count nothing moves a running task back. A job
        first seen running with a count (the agent has just started) was requeued before: the
        count is only remembered."""
        if status.restarts is None:
            return False
        known = self._restarts.get(task.id)
        self._restarts[task.id] = max(known or 0, status.restarts)
        if task.state is not TaskState.RUNNING or status.restarts <= (known or 0):
            return False
        if state is TaskState.RUNNING and known is None:
            return status.state in self.ENDING
        return True

    def _requeue_reason(self, status: NativeStatus) -> str:
        why = status.reason if status.reason not in ("", "None") else "no reason given"
        return f"requeued by {self.kind} (restart {status.restarts}): {why}"

    def _held_after_failed_launch(self, status: NativeStatus) -> bool:
        pattern = self.HELD_AFTER_FAILED_LAUNCH
        fresh = (status.native_id, status.restarts) not in self._freed
        return bool(pattern and pattern.search(status.reason)) and fresh

    async def _free_held(self, task: Task, status: NativeStatus, seen: Observation) -> Observation:
        """The scheduler held a job whose launch failed: released in place, or withdrawn so
        that the task goes again (the pool's `requeued_held`); the reason says which."""
        self._freed.add((status.native_id, status.restarts))
        reason = seen.reason or self._requeue_reason(status)
        argv = self.release_argv(status.native_id)
        if self.pool.settings.get("requeued_held") == "withdraw" or argv is None:
            await self.cancel(task)
            return Observation(
                TaskState.LOST,
                f"{reason}; withdrawn by Klique (requeued_held: withdraw)",
                retry=True,
            )
        done = await self.transport.run(argv, account=self.account(task), timeout=60)
        if done.returncode != 0:
            words = (done.stderr or done.stdout).strip() or f"exit {done.returncode}"
            return replace(seen, reason=f"{reason}; Klique could not release it: {words}")
        return replace(seen, reason=f"{reason}; released by Klique (requeued_held: release)")

    def _new_phase(self, task: Task, seen: Observation) -> bool:
        """A phase change is news even where the state stays (running, then suspended); a
        task first seen in a phase since start is reported, so the ledger pauses."""
        known = self._phases.get(task.id, "")
        self._phases[task.id] = seen.phase
        return known != seen.phase

    def _final(
        self, task: Task, status: NativeStatus, exit_doc: Mapping[str, Any] | None
    ) -> Observation | None:
        """The exit file decides, unless the scheduler ended the job (walltime, cancel, node).
        A job that ended by itself with no exit file is LOST once the grace period is over
        (None until then: the file may still appear)."""
        state = self.STATES[status.state]
        if exit_doc is None and status.state in self.SELF_ENDED:
            exit_code = "" if status.exit_code is None else f", exit code {status.exit_code}"
            return self._lost_after_grace(
                task,
                f"job {status.native_id} ended ({self.kind} {status.state}{exit_code}) but the "
                "runner wrote no exit file",
            )
        self._missing_since.pop(task.id, None)
        self._phases.pop(task.id, None)
        self._restarts.pop(task.id, None)
        if exit_doc is not None and state is TaskState.TIMEOUT:
            # The scheduler's limit came while the task ran. A task that exits on the limit's
            # SIGTERM may end before its runner has seen the signal, and the runner then writes
            # "completed": the scheduler's record decides, the exit code is the task's.
            code = observation_from_exit(exit_doc).exit_code
            return Observation(state, self._reason(status) or "ran past its walltime", code)
        if exit_doc is not None and exit_doc.get("outcome") in RUNNER_OUTCOMES:
            return observation_from_exit(exit_doc)
        if exit_doc is None and status.state in self.NEVER_RAN:
            return self._never_ran(task, status)
        if exit_doc is not None and state is TaskState.COMPLETED:
            state = TaskState.FAILED  # the runner says the task was stopped: it did not complete
        code = exit_doc.get("exit_code") if exit_doc else status.exit_code
        reason = self._reason(status) or f"the scheduler reports {status.state}"
        if exit_doc is None and state is not TaskState.CANCELLED:
            reason += f"; the runner wrote no exit file: see the job's output in {task.job_dir}"
        preempted = status.state in self.PREEMPTED or bool(
            exit_doc and exit_doc.get("outcome") == "preempted"
        )
        if status.state in self.NODE_FAILED and self.reruns_node_failures:
            return self._node_failed(task, reason, code)
        return Observation(state, reason, code, preempted=preempted)

    def _node_failed(self, task: Task, reason: str, code: int | None) -> Observation:
        """The job's node failed and the pool leaves reruns to Klique: it goes again, a few
        times, as a job that never ran does."""
        if task.attempts >= _NEVER_RAN_TRIES:
            return Observation(
                TaskState.LOST, f"{reason}; its node failed in {task.attempts} attempts", code
            )
        return Observation(TaskState.LOST, f"{reason}; run again by Klique", code, retry=True)

    def _never_ran(self, task: Task, status: NativeStatus) -> Observation:
        """The job never ran: it goes again, like a job whose node failed, a few times."""
        reason = self._reason(status) or f"the scheduler reports {status.state}"
        if task.attempts >= _NEVER_RAN_TRIES:
            return Observation(
                TaskState.LOST, f"{reason}; its job never ran in {task.attempts} attempts"
            )
        return Observation(TaskState.LOST, f"{reason}; the job never ran", retry=True)

    def _lost_after_grace(self, task: Task, what: str) -> Observation | None:
        now = time.monotonic()
        if now - self._missing_since.setdefault(task.id, now) < self.lost_after_s:
            return None
        self._missing_since.pop(task.id, None)
        return Observation(
            TaskState.LOST,
            f"{what} within {self.lost_after_s:g} s: the runner was killed hard, or its node "
            f"failed; see the job's output in {task.job_dir}",
        )

    def _reason(self, status: NativeStatus) -> str:
        base = self.REASONS.get(status.state, "")
        detail = status.reason if status.reason not in ("", "None") else ""
        return "; ".join(p for p in (base, detail) if p)

    async def _settle(
        self, gone: Sequence[Task], docs: Mapping[int, dict[str, Any] | None]
    ) -> dict[int, Observation]:
        """Jobs no longer in the queue: exit file, then accounting, then LOST after a grace."""
        news: dict[int, Observation] = {}
        unsettled: list[Task] = []
        signalled: list[Task] = []
        for task in gone:
            doc = docs.get(task.id)
            if doc is None:
                unsettled.append(task)
            elif self._confirms(task, doc):
                signalled.append(task)
            else:
                self._missing_since.pop(task.id, None)
                news[task.id] = await self._from_exit(task, doc)
        history = await self._history([*unsettled, *signalled])
        for task in signalled:
            seen = self._confirm(task, docs[task.id] or {}, history.get(task.native_id or ""))
            if seen is not None:
                news[task.id] = seen
        now = time.monotonic()
        for task in unsettled:
            status = history.get(task.native_id or "")
            state = self.STATES.get(status.state) if status else None
            if status is not None and state is not None and state.final:
                seen = self._final(task, status, None)
                if seen is not None:
                    news[task.id] = seen
                continue
            since = self._missing_since.setdefault(task.id, now)
            if now - since >= self.lost_after_s:
                self._missing_since.pop(task.id, None)
                news[task.id] = Observation(
                    TaskState.LOST,
                    f"job {task.native_id} left the queue with no exit file and no accounting "
                    f"record for {self.lost_after_s:g} s (killed hard, or its node failed)",
                )
        return news

    def _confirms(self, task: Task, doc: Mapping[str, Any]) -> bool:
        """An exit file naming only a signal is checked against the scheduler's accounting,
        where it keeps one and leaves no note of its own in the job's output."""
        if not _signalled(doc) or self.ending_note(str(task.job_dir)) is not None:
            return False
        return self.history_argv([str(task.native_id)]) is not None

    def _confirm(
        self, task: Task, doc: Mapping[str, Any], record: NativeStatus | None
    ) -> Observation | None:
        """An exit file that names only a signal, for a job gone from the queue: the
        scheduler's accounting says who sent it (walltime, a cancel, else a failure). Without a
        record within the grace period, the exit file alone decides."""
        state = self.STATES.get(record.state) if record else None
        if record is not None and state is not None and state.final:
            return self._final(task, record, doc)
        now = time.monotonic()
        if now - self._missing_since.setdefault(task.id, now) < self.lost_after_s:
            return None
        self._missing_since.pop(task.id, None)
        seen = observation_from_exit(doc)
        return replace(
            seen, reason=f"{seen.reason}; the scheduler's accounting has no record of the job"
        )

    async def _from_exit(self, task: Task, doc: Mapping[str, Any]) -> Observation:
        """A job that left the queue: the exit file decides; where it names only a signal, the
        scheduler's note in the job's output may still say why it ended (walltime)."""
        note = self.ending_note(task.job_dir) if task.job_dir else None
        if doc.get("outcome") in RUNNER_OUTCOMES or note is None:
            return observation_from_exit(doc)
        data = await self.transport.read_file(note, account=self._account_or_none(task))
        state = self.parse_ending_note(data.decode(errors="replace")) if data else None
        if state is None:
            return observation_from_exit(doc)
        seen = self._final(task, NativeStatus(task.native_id or "", task.tag, state), doc)
        return seen or observation_from_exit(doc)

    async def _history(self, tasks: Sequence[Task]) -> dict[str, NativeStatus]:
        """Accounting for jobs that left the queue: one query, or one per account where the
        scheduler hides other users' jobs (as status does)."""
        groups: dict[str, list[str]] = {}
        for task in tasks:
            account = self._account_or_none(task) if self._per_account else self.query_account()
            if task.native_id and account:
                groups.setdefault(account, []).append(task.native_id)
        found: dict[str, NativeStatus] = {}
        for account, native_ids in groups.items():
            found.update(await self._history_as(account, native_ids))
        return found

    async def _history_as(self, account: str, native_ids: Sequence[str]) -> dict[str, NativeStatus]:
        argv = self.history_argv(native_ids)
        if argv is None:
            return {}
        try:
            done = await self.transport.run(argv, account=account, timeout=60)
        except TransportError:
            return {}
        if done.returncode != 0:
            return {}
        return {s.native_id: s for s in self.parse_history(done.stdout)}

    async def close(self) -> None:
        await self.transport.close()


def _signalled(doc: Mapping[str, Any]) -> bool:
    """The runner saw only a signal: the scheduler's record says who sent it."""
    return doc.get("outcome") not in (*RUNNER_OUTCOMES, PREEMPTED_MARKER)


def _dispatcher(status: NativeStatus, job_root: str) -> str:
    """Where the dispatcher of the array job a status shows lies: the script the status command
    shows (Slurm's squeue, PBS's Submit_arguments); where it shows none (LSF's bsub reads it on
    its stdin), the folder the array's name names in the job root, for a record that names its
    owner: `_array_elements` takes only that owner's elements, where it owns the folder."""
    if status.script or not status.user:
        return status.script
    folder = array_folder_named(job_root, status.name)
    return f"{folder}/job.sh" if folder else ""


def _but_runner(files: Mapping[str, tuple[bytes, int]]) -> dict[str, tuple[bytes, int]]:
    return {name: data for name, data in files.items() if name != "klique-runner.pyz"}


def _json_bytes(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, indent=2).encode()


def _email(owner: str, domain: str | None) -> str:
    """The owner's mail address (a validated name at the estate's mail_domain), or ''."""
    return f"{owner}@{domain}" if domain else ""


def walltime_hms(seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    return f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"
