"""The submitting half of a batch pool (BatchDriver is the other): each task's job folder
staged (broker/pools/staging.py) and submitted as its mapped account, alone, a batch to one
command, or a sweep as one array job (broker/pools/arrays.py); what a submit command's answer
proves, and which submissions' outcomes are unknown (their reply was lost)."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

from markupsafe import Markup

from broker.containers import container_fields
from broker.domain import Pool, Profile, Task
from broker.errors import KliqueError, SubmitError, SubmitUnknown, TransportError
from broker.execution import Submission
from broker.pools.arrays import (
    Array,
    array_folder,
    array_name,
    dispatcher,
    group_arrays,
    sweep_batches,
    without_runner,
)
from broker.pools.base import Context, PoolDriver
from broker.pools.login import make_transport
from broker.pools.settings import BatchSettings, settings_as
from broker.pools.staging import (
    RUNNER,
    SCRIPT,
    StagedJob,
    job_folder,
    kept_directives,
    script_fields,
)
from broker.templates import TemplateFile, find_template, render, search_roots
from broker.transport import BATCH_ITEMS, Completed, JobFolder, Transport

log = logging.getLogger("klique.pools")

MAX_BACKOFF = 8  # the longest wait, in poll intervals, after the controller was down


class BatchSubmitter(PoolDriver):
    """Submission to a batch scheduler. A scheduler's driver supplies the hooks below."""

    settings: BatchSettings  # each scheduler's driver narrows it to its own kind's model
    submit_batch = BATCH_ITEMS  # tasks the agent hands `submit_many` at once

    kind: ClassVar[str]
    UNREACHABLE: ClassVar[re.Pattern[str] | None] = None  # submit errors: controller is down
    # Submit errors after which the job may exist (the reply was lost): the task's tag is
    # looked up before it is submitted again. Checked before UNREACHABLE.
    SUBMIT_UNKNOWN: ClassVar[re.Pattern[str] | None] = None
    # How long a request whose reply was lost may still be inside the scheduler (its message
    # timeout): a lost submission is resubmitted only after two looks for its tag this far
    # apart both miss. The pool's `message_timeout`, else what the scheduler says, else this.
    MESSAGE_TIMEOUT_S: ClassVar[float] = 10.0
    SUBMIT_STDIN: ClassVar[bool] = False  # the submit command reads the script on its stdin
    # Job arrays, where the scheduler has them (docs/job-arrays.md).
    ARRAY_INDEX: ClassVar[str | None] = None  # the variable holding an element's index
    ARRAY_FIRST: ClassVar[int] = 0  # the first element's index
    DIRECTIVE: ClassVar[str] = ""  # how a directive line starts in a job script ("#SBATCH")
    MAX_ARRAY: ClassVar[int] = 1000  # elements in one array job

    def __init__(self, pool: Pool, context: Context, transport: Transport | None = None) -> None:
        super().__init__(pool, context)
        self.settings = settings_as(pool, BatchSettings)
        self.transport = transport or make_transport(pool)
        self.job_root = str(self.settings.job_root)
        self.python = self.settings.python or "python3"
        self.interval_s = float(self.settings.poll_interval)
        self.message_timeout_s = float(self.settings.message_timeout or self.MESSAGE_TIMEOUT_S)
        self._unknown: dict[int, str] = {}  # task id: why its submission's outcome is unknown
        self._missed_at: dict[int, float] = {}  # task id: the first look that missed its job
        self._submit_backoff = 0.0  # how long submissions wait after the controller was down
        self._submit_paused_until = 0.0
        self._submit_error = ""
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
    def cancel_argv(self, native_id: str) -> list[str]: ...

    def release_argv(self, native_id: str) -> list[str] | None:
        """Release a held job (None: the scheduler cannot)."""
        return None

    def test_only_argv(self, script: str) -> list[str] | None:
        """Validate a script without queueing it (None: the scheduler cannot)."""
        return None

    def node_launch(self, profile: Profile) -> Markup:
        """For a task on several nodes: the command that starts one runner on each of them
        (the scheduler's launcher, with validated numbers only); empty for one node."""
        return Markup("")

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

    # The flow.

    def query_account(self) -> str:
        """The account that runs status and capacity queries (they need no particular one)."""
        configured = self.settings.query_account
        if configured:
            return configured
        accounts = list(self.pool.user_map.accounts.values())
        return accounts[0] if accounts else str(self.pool.user_map.default)

    def check_account(self) -> str | None:
        return self.query_account()

    def render(self, task: Task, job_dir: str | None = None) -> str:
        """The task's job script, rendered from its compute resource's template here."""
        # A preview (no job folder yet) shows the folder as named by the tag alone.
        job_dir = job_dir or task.job_dir or f"{self.job_root.rstrip('/')}/{task.tag}"
        resource = self.context.estate.resources[task.resource]
        directives = self.directives(task, resource.profile, job_dir)
        fields = script_fields(
            task,
            self.pool,
            resource,
            directives=kept_directives(self.pool, resource, directives),
            job_dir=job_dir,
            python=self.python,
            node_launch=self.node_launch(resource.profile),
            mail_domain=self.context.estate.mail_domain,
        )
        runtime = self.settings.container_runtime
        fields.update(container_fields(self.pool, runtime, task, job_dir))
        return render(self.template(resource.name), fields, self.template_roots())

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
        groups: dict[str, list[StagedJob]] = {}
        for index, (task, report_token) in enumerate(tasks):
            try:
                account = self.account(task)
                await self.stage_uv(account)
                job = StagedJob(index, task, self._job_folder(task, report_token))
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
        self, account: str, jobs: Sequence[StagedJob]
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

    @property
    def array_index(self) -> str | None:
        """The variable holding an element's index (None: no arrays); a dialect may choose."""
        return self.ARRAY_INDEX

    def batches(self, tasks: Sequence[Task]) -> list[list[Task]]:
        """Each sweep's new tasks together (up to an array's size), the rest BATCH_ITEMS at a
        time."""
        if not self._uses_arrays():
            return super().batches(tasks)
        return sweep_batches(tasks, self.max_array, BATCH_ITEMS)

    def _uses_arrays(self) -> bool:
        return self.settings.job_arrays and self.array_index is not None and self.max_array > 1

    def _arrays(self, jobs: Sequence[StagedJob]) -> tuple[list[Array], list[StagedJob]]:
        """The tasks of one sweep whose directives agree, as arrays (arrays.group_arrays)."""
        if not self._uses_arrays():
            return [], list(jobs)
        return group_arrays(jobs, self.DIRECTIVE, self.max_array)

    async def _submit_array(
        self, account: str, shared: Sequence[str], elements: Sequence[StagedJob]
    ) -> dict[int, Submission | Exception]:
        """One array job for these tasks: their folders first (each without the runner), then
        the array's folder (the runner once, and the dispatcher), submitted with one command.
        A task whose folder could not be written is left out of the array with its error."""
        folders = [
            replace(job.folder, files=without_runner(job.folder.files), then=(), then_stdin=None)
            for job in elements
        ]
        written = await self.transport.write_folders(
            folders, account=account, timeout=60 + len(elements)
        )
        outcomes: dict[int, Submission | Exception] = {}
        members: list[StagedJob] = []
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
        files = {RUNNER: (self._runner_bytes(), 0o600), SCRIPT: (script.encode(), 0o700)}
        then_stdin = SCRIPT if self.SUBMIT_STDIN else None
        array = JobFolder(folder, files, self.submit_argv(f"{folder}/{SCRIPT}"), then_stdin)
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
        """The task's job folder, staged: its files and the command that submits its script."""
        job_dir = str(task.job_dir)
        script = self.render(task, job_dir)
        document = self.task_document(task, report_token)
        nodes = self.context.estate.resources[task.resource].profile.nodes
        if nodes > 1:  # one runner per node (inside_job/ranks.py)
            document["nodes"] = nodes
        argv = self.submit_argv(f"{job_dir}/{SCRIPT}")
        return job_folder(job_dir, script, document, self._runner_bytes(), argv, self.SUBMIT_STDIN)

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
        longest = self.interval_s * MAX_BACKOFF
        self._submit_backoff = min(max(self._submit_backoff * 2, self.interval_s), longest)
        self._submit_paused_until = time.monotonic() + self._submit_backoff
        self._submit_error = f"submission failed: {words}"
