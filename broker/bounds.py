"""What one task may keep on the control plane, whatever its job sends: its console copy, its
scalars and its artifacts, each bounded by the estate's `limits:` (max_console, max_scalars,
max_artifacts). A report or upload past one is refused whole (413) with a sentence that names the
limit and the estate setting; the job's own files stay whole where it ran."""

from __future__ import annotations

from broker.domain import Limits

_MIB = 1024 * 1024


class OverBound(Exception):
    """What a task sent would pass one of its bounds; the message says which and how to fix it."""


def _mib(size: int) -> str:
    return f"{size / _MIB:g} MiB"


def console_problem(limits: Limits, task_id: int, end: int) -> str | None:
    """Why a console chunk ending at byte `end` of the task's console is refused, if it is."""
    if end <= limits.max_console_bytes:
        return None
    return (
        f"task {task_id}'s console copy would pass {_mib(limits.max_console_bytes)}, the most "
        "a task keeps on the server (the estate's limits.max_console); the whole console stays "
        "in the job's folder (console.log); fix: print less, or ask the platform team to raise "
        "limits.max_console"
    )


def scalars_problem(limits: Limits, task_id: int, kept: int, adding: int) -> str | None:
    """Why `adding` more scalar points, on top of the `kept` ones, are refused, if they are."""
    if kept + adding <= limits.max_scalars:
        return None
    return (
        f"task {task_id} would have {kept + adding} scalar points, over {limits.max_scalars}, "
        "the most a task keeps on the server (the estate's limits.max_scalars); fix: log "
        "scalars less often, or ask the platform team to raise limits.max_scalars"
    )


def artifacts_problem(limits: Limits, task_id: int, kept: int, size: int) -> str | None:
    """Why an artifact of `size` bytes, besides the task's other artifacts (`kept` bytes in all),
    is refused, if it is."""
    if kept + size <= limits.max_artifact_bytes:
        return None
    return (
        f"task {task_id}'s artifacts would take {_mib(kept + size)}, over "
        f"{_mib(limits.max_artifact_bytes)}, the most one task keeps (the estate's "
        "limits.max_artifacts); fix: keep large data on the shared filesystem and pass its "
        "path, or ask the platform team to raise limits.max_artifacts"
    )


def report_problem(
    limits: Limits, task_id: int, console_end: int | None, scalars_kept: int, scalars_adding: int
) -> str | None:
    """Why a runner's report is refused whole, if it passes a bound: its console chunk ending at
    `console_end` (None: no chunk), or its scalars."""
    if console_end is not None:
        problem = console_problem(limits, task_id, console_end)
        if problem:
            return problem
    if scalars_adding:
        return scalars_problem(limits, task_id, scalars_kept, scalars_adding)
    return None
