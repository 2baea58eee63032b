"""The batch driver: owns the flow for Slurm, PBS and LSF. A scheduler module supplies argv
builders, output parsers and a state table; BatchSubmitter (broker/pools/submission.py)
renders and submits as the mapped account, tagged; this class polls with one query per cycle,
reads exit files and the scheduler's accounting, and reconciles what they say with what
Klique believes through broker/pools/reconcile.py's rules.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from abc import abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar

from broker.domain import Pool, Task, TaskState
from broker.errors import KliqueError, TransportError
from broker.execution import Observation, PoolState
from broker.pools import reconcile
from broker.pools.arrays import array_dispatchers, elements_run
from broker.pools.base import (
    RUNNER_OUTCOMES,
    Context,
    observation_from_exit,
    parse_json,
)
from broker.pools.native import Capacity, NativeStatus
from broker.pools.submission import BatchSubmitter
from broker.transport import Completed, Transport

log = logging.getLogger("klique.pools")


class BatchDriver(BatchSubmitter):
    """A pool behind a batch scheduler. Subclasses fill in the hooks below and those of
    BatchSubmitter."""

    STATES: ClassVar[Mapping[str, TaskState]]
    REASONS: ClassVar[Mapping[str, str]] = {}
    PREEMPTED: ClassVar[frozenset[str]] = frozenset()  # native states that mean preempted
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
    # The status command shows every batch job's script: a job with a task's tag but no
    # script (a --wrap of another account's) is never taken for the task's.
    SHOWS_SCRIPT: ClassVar[bool] = False
    # Status errors that mean the scheduler shows each account only its own jobs: status then
    # runs one query per mapped account, as that account (the pool's `status_per_account`).
    OTHERS_HIDDEN: ClassVar[re.Pattern[str] | None] = None

    def __init__(self, pool: Pool, context: Context, transport: Transport | None = None) -> None:
        super().__init__(pool, context, transport)
        self.lost_after_s = float(self.settings.lost_after)
        # The agent's clock times the status queries (broker/agents/timing.py), at this interval.
        self.query_interval_s = self.interval_s
        self._polled_at = 0.0  # when the query the last observations come from was sent
        self._last: dict[str, NativeStatus] = {}
        self.memory = reconcile.JobMemory()  # of each task's job, between looks
        self._freed: set[tuple[str, int | None]] = set()  # held jobs acted on: (id, restarts)
        self._charged = frozenset(self.settings.charge_phases)
        self._capacity = Capacity()
        self._capacity_error = ""
        self.status_calls = 0
        per_account = self.settings.status_per_account
        self._per_account = bool(per_account)
        self._detect_per_account = per_account is None
        self._problems_seen: set[tuple[str, str]] = set()

    # Status hooks a scheduler module supplies.

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

    def capacity_argv(self) -> list[str] | None:
        return None

    def parse_capacity(self, stdout: str) -> Capacity:
        return Capacity()

    def history_argv(self, native_ids: Sequence[str]) -> list[str] | None:
        """The scheduler's accounting for jobs that left the queue (None: it has none)."""
        return None

    def parse_history(self, stdout: str) -> list[NativeStatus]:
        return []

    def held(self, status: NativeStatus) -> str:
        """What to do about a job the scheduler requeued and holds ("" for any other job): it
        waits for a release nobody gives unless told, so the task shows the phase `held`."""
        return ""

    @property
    def withdraws_held(self) -> bool:
        """A held job whose launch failed is withdrawn (cancelled; the task goes again from
        Klique's queue) rather than released in place (Slurm's `requeued_held`)."""
        return False

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
        """One status query for all of the pool's jobs; the agent's clock
        (broker/agents/timing.py) says when."""
        self._polled_at = time.monotonic()
        accounts = sorted({a for t in tasks if (a := self._account_or_none(t))})
        try:
            listing = await self._status(accounts or [self.query_account()])
            await self._refresh_capacity()
        except KliqueError as exc:
            self._capacity_error = f"status query failed: {exc}"
            raise
        self._capacity_error = ""
        self._submit_paused_until = 0.0  # the controller answers again
        self._last = {s.native_id: s for s in listing}
        return await self._observe(tasks)

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
            new_phase = self.memory.new_phase(task.id, seen.phase)
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
        listing = self._last.values()
        native_id = reconcile.found_by_tag(
            self.tables, task.tag, job_dir, listing, self.SHOWS_SCRIPT
        )
        if native_id is not None:
            return Observation(TaskState.SUBMITTED, native_id=native_id, job_dir=job_dir)
        if task.job_dir and exit_doc is not None:
            return Observation(TaskState.SUBMITTED, native_id="", job_dir=job_dir)
        return None

    def _missed(self, task: Task) -> Observation | None:
        """No job carries the task's tag: reconcile.missed decides when it goes again. Both
        looks are the pool's status query, which sees every account's jobs (per account where
        the scheduler hides others')."""
        first = self._missed_at.setdefault(task.id, self._polled_at)
        seen = reconcile.missed(first, self._polled_at, self.message_timeout_s)
        if seen is not None:
            self._missed_at.pop(task.id, None)
            self._unknown.pop(task.id, None)
        return seen

    async def _array_elements(self, placed: Sequence[Task]) -> dict[str, str]:
        """For tasks whose submission's outcome is unknown: the array element that runs each
        one's folder (folder: element id). The dispatcher of each array job in the queue is
        read as the tasks' accounts, and believed only where it lies in an array folder of
        the pool's job root that the account owns: another account's array job, whatever it
        names, is never taken for a task's."""
        scripts = array_dispatchers(self._last.values(), self.job_root, self._cancelled)
        wanted: dict[str, set[str]] = {}
        for task in placed:
            account = self._account_or_none(task)
            if task.job_dir and account:
                wanted.setdefault(account, set()).add(task.job_dir)
        found: dict[str, str] = {}
        for account, folders in sorted(wanted.items()) if scripts else []:
            texts = await self.transport.read_files(sorted(scripts), account=account)
            for path, data in texts.items():
                if await self._owned(path.removesuffix("/job.sh"), account):
                    text = data.decode(errors="replace")
                    found |= elements_run(text, scripts[path], folders, account, self.element_index)
        return found

    def _cancelled(self, status: NativeStatus) -> bool:
        return self.STATES.get(status.state) is TaskState.CANCELLED

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
            elif self._is_stranger(status) and status.native_id not in self.strangers:
                log.warning(
                    "pool %s: job %s (%s) carries Klique's tag but no task of this pool owns "
                    "it; leaving it alone",
                    self.pool.name,
                    status.native_id,
                    status.name,
                )
                self.strangers.add(status.native_id)

    def _is_stranger(self, status: NativeStatus) -> bool:
        submitting = self._submitting | set(self._submitting_arrays)
        return reconcile.is_stranger(self.tables, status, submitting)

    @property
    def tables(self) -> reconcile.StateTables:
        """The scheduler's state tables and the pool's settings that change a reading (read
        each time: a start-up check may change the driver's view of the pool)."""
        return self.state_tables(
            reruns_node_failures=self.reruns_node_failures,
            charged=self._charged,
            lost_after_s=self.lost_after_s,
        )

    @classmethod
    def state_tables(
        cls, *, reruns_node_failures: bool, charged: frozenset[str], lost_after_s: float
    ) -> reconcile.StateTables:
        """This scheduler's tables, with the pool's settings that change a reading."""
        return reconcile.StateTables(
            kind=cls.kind,
            states=cls.STATES,
            reasons=cls.REASONS,
            preempted=cls.PREEMPTED,
            self_ended=cls.SELF_ENDED,
            phases=cls.PHASES,
            never_ran=cls.NEVER_RAN,
            ending=cls.ENDING,
            node_failed=cls.NODE_FAILED,
            reruns_node_failures=reruns_node_failures,
            charged=charged,
            lost_after_s=lost_after_s,
        )

    def _from_status(
        self, task: Task, status: NativeStatus, exit_doc: Mapping[str, Any] | None
    ) -> Observation | None:
        if self.tables.state(status) is None:
            log.warning(
                "pool %s: unknown state %r for job %s",
                self.pool.name,
                status.state,
                status.native_id,
            )
            return None
        verdict = reconcile.listed(
            self.tables,
            self.memory.believed(task),
            status,
            exit_doc,
            time.monotonic(),
            self.held(status),
        )
        return self.memory.keep(task.id, verdict)

    def _held_after_failed_launch(self, status: NativeStatus) -> bool:
        pattern = self.HELD_AFTER_FAILED_LAUNCH
        fresh = (status.native_id, status.restarts) not in self._freed
        return bool(pattern and pattern.search(status.reason)) and fresh

    async def _free_held(self, task: Task, status: NativeStatus, seen: Observation) -> Observation:
        """The scheduler held a job whose launch failed: released in place, or withdrawn so
        that the task goes again (the pool's `requeued_held`); the reason says which."""
        self._freed.add((status.native_id, status.restarts))
        reason = seen.reason or reconcile.requeue_reason(self.tables, status)
        argv = self.release_argv(status.native_id)
        if self.withdraws_held or argv is None:
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

    def _final(
        self, task: Task, status: NativeStatus, exit_doc: Mapping[str, Any] | None
    ) -> Observation | None:
        """An ended job's reading (reconcile.ended), remembered for the next look."""
        verdict = reconcile.ended(
            self.tables, self.memory.believed(task), status, exit_doc, time.monotonic()
        )
        return self.memory.keep(task.id, verdict)

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
                self.memory.missing_since.pop(task.id, None)
                news[task.id] = await self._from_exit(task, doc)
        history = await self._history([*unsettled, *signalled])
        for task in signalled:
            seen = self._confirm(task, docs[task.id] or {}, history.get(task.native_id or ""))
            if seen is not None:
                news[task.id] = seen
        now = time.monotonic()
        for task in unsettled:
            record = history.get(task.native_id or "")
            verdict = reconcile.left_queue(self.tables, self.memory.believed(task), record, now)
            seen = self.memory.keep(task.id, verdict)
            if seen is not None:
                news[task.id] = seen
        return news

    def _confirms(self, task: Task, doc: Mapping[str, Any]) -> bool:
        """An exit file naming only a signal is checked against the scheduler's accounting,
        where it keeps one and leaves no note of its own in the job's output."""
        if (
            not reconcile.names_only_a_signal(doc)
            or self.ending_note(str(task.job_dir)) is not None
        ):
            return False
        return self.history_argv([str(task.native_id)]) is not None

    def _confirm(
        self, task: Task, doc: Mapping[str, Any], record: NativeStatus | None
    ) -> Observation | None:
        """An exit file that names only a signal, for a job gone from the queue: checked
        against the scheduler's accounting (reconcile.confirmed)."""
        verdict = reconcile.confirmed(
            self.tables, self.memory.believed(task), doc, record, time.monotonic()
        )
        return self.memory.keep(task.id, verdict)

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
