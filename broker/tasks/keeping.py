"""What is kept of a run: its tags, whether it is archived (hidden from the default listings,
`klique ls --archived` shows it), its deletion with everything it reported and its artifacts,
and the estate's retention, which deletes archived runs past `retention.days` (or the project's
own) on the control loop's housekeeping. Its owner and admins tag, archive and delete it (and a
task's own report token tags it: `Task.init(tags=)` inside a job); its team only reads it
(broker/authz.py, rule 3)."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from broker import authz
from broker.artifacts import ArtifactStore
from broker.authz import Action, Who
from broker.domain import Task
from broker.errors import KliqueError
from broker.store import keeping as stored
from broker.tasks.console import console_copy
from broker.tasks.control import TaskControl

log = logging.getLogger("klique.retention")
DAY_S = 86400.0
RETENTION_EVERY_S = 600.0  # how often the housekeeping looks for runs past their retention

# A tag: a word of letters, digits and . _ : + = @ / - (no spaces, no quotes), as `klique ls
# --tag` and the web page's filter take it.
TAG = r"^[A-Za-z0-9][A-Za-z0-9._:+=@/-]{0,63}$"
MAX_TAGS = 50  # on one task


def _tag(text: str) -> str:
    if not re.fullmatch(TAG, text):
        raise ValueError(
            f"{text[:80]!r} is no tag: a tag is up to 64 letters, digits and . _ : + = @ / - "
            "(no spaces), starting with a letter or digit"
        )
    return text


Tag = Annotated[
    str,
    Field(max_length=200, description="A tag: up to 64 letters, digits and ._:+=@/-."),
    AfterValidator(_tag),
]


class TagsIn(BaseModel):
    """Tags to add to a task and tags to take off it (those it does not have: nothing)."""

    model_config = ConfigDict(extra="forbid")

    add: list[Tag] = Field([], max_length=MAX_TAGS)
    remove: list[Tag] = Field([], max_length=MAX_TAGS)


def retagged(current: Iterable[str], add: Iterable[str], remove: Iterable[str]) -> list[str]:
    """A task's tags after a change: sorted, each once; past MAX_TAGS, an error that says so."""
    tags = sorted((set(current) | set(add)) - set(remove))
    if len(tags) > MAX_TAGS:
        raise KliqueError(
            f"a task keeps at most {MAX_TAGS} tags; this would make {len(tags)}: remove some "
            "first (`klique tag ID --remove TAG`)"
        )
    return tags


def team_of(who: Who) -> str:
    """The caller's team, for a team listing; an error that says how to be in one."""
    if who.team is None:
        raise KliqueError(
            f"{who.user} is in no team, so there is no team's list to show; the estate's "
            "`teams:` (or identity.groups) puts a user in one"
        )
    return who.team


def tag(loop: TaskControl, who: Who, task_id: int, body: TagsIn) -> Task:
    """Change a task's tags: its owner, an admin, or the task's own report token."""
    task = authz.find_task(loop.store.get, who, Action.TAG_TASK, task_id)
    return loop.store.update(task.id, tags=retagged(task.tags, body.add, body.remove))


def archive(loop: TaskControl, who: Who, task_id: int, archived: bool = True) -> Task:
    """Archive a task that has ended (or take it out of the archive): its owner or an admin,
    with a user's credential. A task that is still running is cancelled first, by its owner."""
    task = authz.find_task(loop.store.get, who, Action.ARCHIVE_TASK, task_id)
    if authz.speaks_for_task(who) is not None:
        raise KliqueError("a task's report token does not archive tasks; its owner does")
    if archived and not task.state.final:
        raise KliqueError(
            f"task {task.id} is {task.state.value}; archive it once it has ended "
            f"(`klique cancel {task.id}` ends it now)"
        )
    if (task.archived_at is not None) == archived:
        return task
    return loop.store.update(task.id, archived_at=time.time() if archived else None)


def delete(loop: TaskControl, who: Who, task_id: int, artifacts: ArtifactStore) -> None:
    """Delete a run that has ended, with its reports, scalars, console and artifacts: its owner
    or an admin, with a user's credential."""
    task = authz.find_task(loop.store.get, who, Action.DELETE_TASK, task_id)
    if authz.speaks_for_task(who) is not None:
        raise KliqueError("a task's report token does not delete tasks; its owner does")
    if not task.state.final:
        raise KliqueError(
            f"task {task.id} is {task.state.value}; delete it once it has ended "
            f"(`klique cancel {task.id}` ends it now)"
        )
    forget(loop, task, artifacts)
    log.info("task %d deleted by %s", task.id, who.user)


def forget(loop: TaskControl, task: Task, artifacts: ArtifactStore) -> None:
    """The run's record goes (its row stays, emptied, for the usage ledger), then its console
    copy and the artifact contents nothing else refers to."""
    for digest in stored.delete_task(loop.store, task.id):
        artifacts.remove(digest)
    console_copy(loop, task).unlink(missing_ok=True)


def expired(loop: TaskControl, now: float) -> list[int]:
    """The archived runs past their retention: their project's `retention.projects` days,
    else `retention.days` (unset: kept for ever)."""
    retention = loop.estate.retention
    found: list[int] = []
    for project, days in retention.projects.items():
        found += stored.archived_before(loop.store, now - days * DAY_S, [project], ())
    if retention.days is not None:
        cutoff = now - retention.days * DAY_S
        found += stored.archived_before(loop.store, cutoff, None, list(retention.projects))
    return sorted(found)


class Retention:
    """The control loop's chore: every RETENTION_EVERY_S, delete the archived runs past their
    retention, each one logged."""

    def __init__(self, loop: TaskControl, artifacts: ArtifactStore) -> None:
        self.loop = loop
        self.artifacts = artifacts
        self.last = 0.0

    def __call__(self, now: float | None = None) -> list[int]:
        now = time.time() if now is None else now
        if now - self.last < RETENTION_EVERY_S:
            return []
        self.last = now
        deleted = []
        for task_id in expired(self.loop, now):
            try:
                task = self.loop.store.get(task_id)
                forget(self.loop, task, self.artifacts)
            except KliqueError as exc:  # made a model version, or gone meanwhile: kept
                log.warning("retention: task %d kept: %s", task_id, exc)
                continue
            deleted.append(task_id)
            log.info(
                "retention: task %d of project %s deleted, archived %.1f days ago",
                task.id,
                task.spec.project,
                (now - (task.archived_at or now)) / DAY_S,
            )
        return deleted
