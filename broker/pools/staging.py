"""Staging a batch job's folder: what goes into it before the scheduler sees it. The job
script rendered from the pool's template (its directives checked), task.json beside it (free
text travels there, never in the script), and the runner. Pure: the driver writes the folder
and submits it through its transport."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup

from broker.domain import ComputeResource, Pool, Task
from broker.templates import safe_directive
from broker.transport import JobFolder

RUNNER = "klique-runner.pyz"
SCRIPT = "job.sh"


@dataclass(frozen=True)
class StagedJob:
    """One task of a batch of submissions: its place in the batch, and its job folder."""

    index: int
    task: Task
    folder: JobFolder


def kept_directives(
    pool: Pool, resource: ComputeResource, directives: Sequence[str]
) -> list[Markup]:
    """The driver's directives, then the pool's and the compute resource's extra ones, less
    those either skips; each checked before it may enter a script."""
    skip = set(pool.skip_directives) | set(resource.skip_directives)
    wanted = [*directives, *pool.extra_directives, *resource.extra_directives]
    return [
        safe_directive(d, f"pool {pool.name} / compute resource {resource.name}")
        for d in wanted
        if d.split("=", 1)[0].split(" ", 1)[0] not in skip and d not in skip
    ]


def script_fields(
    task: Task,
    pool: Pool,
    resource: ComputeResource,
    *,
    directives: Sequence[Markup],
    job_dir: str,
    python: str,
    node_launch: Markup,
    mail_domain: str | None,
) -> dict[str, Any]:
    """What a batch template sees of a task (templates/README.md): validated values only."""
    profile = resource.profile
    return {
        "task_id": task.id,
        "tag": task.tag,
        "owner": task.owner,
        "owner_email": owner_email(task.owner, mail_domain),
        "account": pool.user_map.account_for(task.owner) or "",
        "project": task.spec.project,
        "resource": resource.name,
        "pool": pool.name,
        "directives": list(directives),
        "gpus": profile.gpus,
        "cpus": profile.cpus,
        "memory_mb": profile.memory_mb,
        "walltime_s": profile.walltime_s,
        "nodes": profile.nodes,
        "node_launch": node_launch,
        "job_dir": job_dir,
        "python": python,
    }


def job_folder(
    job_dir: str,
    script: str,
    document: Mapping[str, Any],
    runner: bytes,
    submit_argv: Sequence[str],
    submit_stdin: bool,
) -> JobFolder:
    """The task's job folder: its files (in a new folder of mode 700, owned by the account)
    and the command that submits its script (reading it on its stdin where the scheduler
    wants it so)."""
    files = {
        "task.json": (json_bytes(document), 0o600),
        RUNNER: (runner, 0o600),
        SCRIPT: (script.encode(), 0o700),
    }
    return JobFolder(job_dir, files, submit_argv, SCRIPT if submit_stdin else None)


def json_bytes(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, indent=2).encode()


def owner_email(owner: str, domain: str | None) -> str:
    """The owner's mail address (a validated name at the estate's mail_domain), or ''."""
    return f"{owner}@{domain}" if domain else ""


def walltime_hms(seconds: int) -> str:
    """A walltime as the schedulers' directives write it: HH:MM:SS."""
    hours, rest = divmod(seconds, 3600)
    return f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"
