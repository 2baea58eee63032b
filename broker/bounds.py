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


# The most one report of each kind beyond scalars may carry (its JSON and its file together):
# what a page shows at once, not a store for data (that is what artifacts are for). The SDK
# refuses larger ones before they leave the task (klique/logger.py keeps the same table).
ITEM_BYTES = {
    "single": 4 * 1024,
    "text": 1 * _MIB,
    "table": 4 * _MIB,
    "histogram": 4 * _MIB,
    "plot": 8 * _MIB,
    "image": 8 * _MIB,
    "media": 16 * _MIB,
}


def item_problem(task_id: int, kind: str, title: str, size: int) -> str | None:
    """Why one report of `size` bytes is refused, if it is: larger than its kind may be."""
    most = ITEM_BYTES[kind]
    if size <= most:
        return None
    return (
        f"task {task_id}'s {kind} report {title!r} takes {_mib(size)}, over {_mib(most)}, the "
        f"most one {kind} report may take; fix: report less (a sample, a smaller image), or "
        "keep it as an artifact (task.upload_artifact)"
    )


def reports_problem(
    limits: Limits,
    task_id: int,
    kept: dict[str, int],
    kept_bytes: int,
    adding: list[tuple[str, int]],
) -> str | None:
    """Why reports beyond scalars (`adding`: kind and bytes of each), on top of the `kept`
    ones (a count per kind, `kept_bytes` in all), are refused, if they are."""
    counts = dict(kept)
    for kind, _ in adding:
        counts[kind] = counts.get(kind, 0) + 1
        if counts[kind] > limits.max_reports:
            return (
                f"task {task_id} would have {counts[kind]} {kind} reports, over "
                f"{limits.max_reports}, the most of each kind a task keeps on the server (the "
                f"estate's limits.max_reports); the reports after it are dropped; fix: report "
                "less often, or ask the platform team to raise limits.max_reports"
            )
    total = kept_bytes + sum(size for _, size in adding)
    if total <= limits.max_report_bytes:
        return None
    return (
        f"task {task_id}'s reports would take {_mib(total)}, over "
        f"{_mib(limits.max_report_bytes)}, the most a task's reports beyond scalars keep on the "
        "server (the estate's limits.max_report_bytes); the reports after it are dropped; fix: "
        "report smaller images or tables, or ask the platform team to raise "
        "limits.max_report_bytes"
    )
