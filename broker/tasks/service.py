"""The operations on tasks, one place for every adapter: create, list, show, why, logs, cancel,
and what a task's runner reports. Each takes the caller and asks broker/authz.py whether they
may; each raises Klique's own errors (broker/errors.py), which the adapters answer their way."""

from __future__ import annotations

import asyncio
from typing import Any

from broker import authz
from broker.artifacts import ArtifactStore
from broker.authz import Action
from broker.domain import Limits, Task, TaskState
from broker.errors import Conflict, KliqueError
from broker.identity.resolve import Caller
from broker.tasks import artifacts, batches, keeping, records, reports
from broker.tasks.batches import BatchItem, BatchOut, SweepOut
from broker.tasks.cancelling import cancel_task
from broker.tasks.console import (
    check_report_bounds,
    checked_rank,
    log_chunk,
    read_console,
    save_console,
)
from broker.tasks.control import TaskControl
from broker.tasks.create import queue_task, spec_of
from broker.tasks.creations import Creations
from broker.tasks.report_schemas import ReportOut
from broker.tasks.reports import Served
from broker.tasks.schemas import ArtifactOut, LogChunk, Report, SubmitRequest, TaskOut, WhyOut
from broker.tasks.sdk_schemas import (
    CloneIn,
    EndIn,
    RecordIn,
    RecordOut,
    RemoteIn,
    SettingsOut,
    StepOut,
    StepsIn,
)
from broker.tasks.views import task_out, why_out


class TaskService:
    """The task service over one control loop (its store, its estate, its reasons)."""

    def __init__(self, loop: TaskControl) -> None:
        self.loop = loop
        self.store = loop.store
        self.creations = Creations(loop.store)

    def out(self, task: Task, detail: bool = False) -> TaskOut:
        return task_out(task, self.loop, detail)

    def find(self, who: Caller, task_id: int, action: Action = Action.READ_TASK) -> Task:
        """The caller's own task (any task for an admin), if authz lets them do `action` to
        it; NotFound for anyone else's."""
        return authz.find_task(self.store.get, who, action, task_id)

    async def submit(self, who: Caller, body: SubmitRequest) -> TaskOut:
        """One task, `klique submit`'s: checked, then written with the creates of other
        requests waiting at the same moment."""
        spec = spec_of(body, self.loop.estate.default_resource or "")
        return self.out(await queue_task(self.loop, self.creations, who, spec))

    def listing(
        self,
        who: Caller,
        states: str | None = None,
        all_users: bool = False,
        limit: int = 200,
        before: int | None = None,
        project: str | None = None,
        tag: str | None = None,
        archived: bool = False,
        team: bool = False,
    ) -> list[TaskOut]:
        """The newest tasks first, a page at a time: pass the last id seen as `before`.
        `team`: the caller's team's tasks (theirs and their teammates'); `archived`: the
        archived ones (hidden otherwise); `tag`: those with the tag."""
        owner = authz.owner_filter(who, None if all_users else who.user)
        tasks = self.store.tasks(
            owner=None if team else owner,
            states=parse_states(states),
            limit=limit,
            newest_first=True,
            before=before,
            with_diff=False,
            project=project,
            tag=tag,
            archived=archived,
            team=keeping.team_of(who) if team else None,
        )
        return [self.out(t) for t in tasks]

    def show(self, who: Caller, task_id: int) -> TaskOut:
        return self.out(self.find(who, task_id), detail=True)

    def why(self, who: Caller, task_id: int) -> WhyOut:
        return why_out(self.loop, self.find(who, task_id))

    async def logs(self, who: Caller, task_id: int, offset: int = 0, rank: int = 0) -> LogChunk:
        task = await asyncio.to_thread(self.find, who, task_id)
        data = await read_console(self.loop, task, offset, checked_rank(self.loop, task, rank))
        return log_chunk(task, offset, data)

    async def cancel(self, who: Caller, task_id: int) -> TaskOut:
        task = await asyncio.to_thread(self.find, who, task_id, Action.CANCEL)
        return await asyncio.to_thread(self.out, await cancel_task(self.loop, task))

    def report(self, task: Task, body: Report) -> None:
        """What a task's runner says: state, console, scalars, its end. The end is a claim:
        the task becomes final only when its pool sees the job gone (see SECURITY.md). The
        caller has checked that `task` is the one whose report token spoke; Conflict once
        the task's attempt is over."""
        refusal = authz.report_refusal(task)
        if refusal:
            raise Conflict(refusal)
        check_report_bounds(self.loop, task, body)
        reports.keep(self.loop, task, body.reports)  # first: past a bound, nothing is kept
        if body.console is not None:
            save_console(self.loop, task, body.console.offset, body.console.text)
        if body.scalars:
            self.store.add_scalars(task.id, [s.model_dump() for s in body.scalars])
        # One write at most: the start and the claimed end together, where both are news.
        claim: dict[str, Any] = {}
        if body.exit is not None and not task.state.final:
            claim["claim"] = body.exit.model_dump()
        starting = (TaskState.SUBMITTED, TaskState.PENDING)
        started = body.state is not None and body.state.state in ("running", "done")
        moved = None
        if started and task.state in starting:
            moved = self.store.change_state(task.id, TaskState.RUNNING, only_from=starting, **claim)
        if claim and moved is None:  # already running (or moved on meanwhile)
            self.store.update(task.id, **claim)
        if claim:
            self.loop.wake_pool(task.pool)  # the pool confirms at its next look

    # Reports beyond scalars (broker/tasks/reports.py), for whoever may read the task.

    def reports(self, who: Caller, task_id: int, kind: str | None) -> list[ReportOut]:
        return reports.listing(self.loop, self.find(who, task_id), kind)

    def report_file(self, who: Caller, task_id: int, report_id: int) -> tuple[bytes, Served]:
        return reports.file_of(self.loop, self.find(who, task_id), report_id)

    # What is kept of a run (broker/tasks/keeping.py): its tags, archived or not.

    def tag(self, who: Caller, task_id: int, body: keeping.TagsIn) -> TaskOut:
        return self.out(keeping.tag(self.loop, who, task_id, body), detail=True)

    def archive(self, who: Caller, task_id: int, archived: bool) -> TaskOut:
        return self.out(keeping.archive(self.loop, who, task_id, archived), detail=True)

    def delete(self, who: Caller, task_id: int, artifacts: ArtifactStore) -> None:
        keeping.delete(self.loop, who, task_id, artifacts)

    # Many at once: batches and sweeps (broker/tasks/batches.py has the rules).

    def create_many(self, who: Caller, items: list[BatchItem], sweep: str | None) -> BatchOut:
        return batches.create_many(self.loop, who, items, sweep)

    def sweep(self, who: Caller, sweep_id: int) -> SweepOut:
        return SweepOut(**batches.own_sweep(self.loop, sweep_id, who))

    def sweep_tasks(
        self, who: Caller, sweep_id: int, limit: int, before: int | None
    ) -> list[TaskOut]:
        return batches.sweep_tasks(self.loop, who, sweep_id, limit, before)

    async def cancel_sweep(self, who: Caller, sweep_id: int) -> SweepOut:
        return await batches.cancel_sweep(self.loop, who, sweep_id)

    # The SDK's: `actor` is a user's credential or a task's report token
    # (broker/tasks/records.py has the rules of which may do what).

    def sdk_settings(self) -> SettingsOut:
        return records.settings(self.loop)

    def record(self, actor: Caller, body: RecordIn) -> RecordOut:
        return records.record(self.loop, actor, body)

    def record_steps(self, actor: Caller, body: StepsIn) -> list[TaskOut]:
        return records.record_steps(self.loop, actor, body)

    def get_record(self, actor: Caller, task_id: int) -> TaskOut:
        return records.get_record(self.loop, actor, task_id)

    def find_record(self, actor: Caller, task_id: int) -> Task:
        """The task, if the actor acts on it; NotFound alike for another's and for none."""
        return records.find(self.loop, task_id, actor)

    def merge_parameters(
        self, actor: Caller, task_id: int, values: dict[str, Any], overwrite: bool
    ) -> dict[str, Any]:
        return records.merge_parameters(self.loop, actor, task_id, values, overwrite)

    def send_remote(self, actor: Caller, task_id: int, body: RemoteIn) -> TaskOut:
        return records.send_remote(self.loop, actor, task_id, body)

    def end(self, actor: Caller, task_id: int, body: EndIn) -> TaskOut:
        return records.end(self.loop, actor, task_id, body)

    def clone(self, actor: Caller, task: Task, body: CloneIn) -> TaskOut:
        return records.clone(self.loop, actor, task, body)

    def steps(self, actor: Caller, task_id: int) -> list[StepOut]:
        return records.steps(self.loop, actor, task_id)

    async def cancel_record(self, actor: Caller, task_id: int) -> TaskOut:
        return await records.cancel(self.loop, actor, task_id)

    def cached(self, actor: Caller, key: str) -> TaskOut:
        return records.cached(self.loop, actor, key)

    # Artifacts (broker/tasks/artifacts.py: who reads and writes them, the room left).

    @property
    def limits(self) -> Limits:
        return self.loop.estate.limits

    def artifact_writable(self, actor: Caller, task_id: int) -> Task:
        return artifacts.writable(self.loop, actor, task_id)

    def artifact_room(self, task: Task, name: str, declared: int | None, most: int) -> int:
        return artifacts.room_for(self.loop, task, name, declared, most)

    def artifact_stored(
        self, task: Task, name: str, kind: str, filename: str, digest: str, size: int
    ) -> ArtifactOut:
        return artifacts.stored(self.loop, task, name, kind, filename, digest, size)

    def artifact_list(self, actor: Caller, task_id: int) -> list[ArtifactOut]:
        return artifacts.listing(self.loop, actor, task_id)

    def artifact(self, actor: Caller, task_id: int, name: str) -> dict[str, Any]:
        """The artifact's record (digest, size), if the caller may read it."""
        return artifacts.readable(self.loop, actor, task_id, name)


def parse_states(text: str | None) -> list[TaskState] | None:
    """`running,queued` as states; None (every state) for nothing."""
    if not text:
        return None
    known = {s.value for s in TaskState}
    unknown = [s for s in text.split(",") if s not in known]
    if unknown:
        raise KliqueError(
            f"unknown states {', '.join(unknown)}; use any of {', '.join(sorted(known))}"
        )
    return [TaskState(s) for s in text.split(",")]
