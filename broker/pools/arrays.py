"""Job arrays: the tasks of one sweep that share a pool, an account and every scheduler
directive go to the scheduler as one array job (docs/job-arrays.md).

Each task keeps its own job folder, written as for a job of its own (task.json and its rendered
job.sh). The array's folder holds the runner once and a dispatcher script: the scheduler
directives the tasks share, the array's size, and a table from each element's index to its
task's folder. An element links the runner into its folder and runs that folder's job.sh, so
it finds its own task.json by its index, and whatever the template does, it does per task.
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence

from broker.domain import Task
from broker.fileops import JOB_FOLDER
from broker.pools.native import NativeStatus
from broker.pools.staging import RUNNER, SCRIPT, StagedJob

# An array job's name: its folder's, marked as an array's (klique-array-<first task>-<hex>).
ARRAY_NAME = re.compile(r"klique-array-\d+-[0-9a-f]{12}")
_ARRAY_FOLDER = re.compile(r"klique-\d+-0-[0-9a-f]{12}")
_ELEMENT = re.compile(r"# (\d+) (/\S+)")
_CASE_ELEMENT = re.compile(r"(\d+)\) dir=(\S+) ;;")
_JOB_DIR = "{job_dir}"  # where a task's own folder stood in a directive, and its tag
_TAG = "{tag}"

# An array to submit: the directive lines its tasks share (shared_directives), and its tasks.
Array = tuple[tuple[str, ...], list[StagedJob]]


def array_folder(job_root: str, first_task_id: int) -> str:
    """A new array folder, named as job folders are, with attempt 0 (no task's attempt)."""
    return f"{job_root.rstrip('/')}/klique-{first_task_id}-0-{secrets.token_hex(6)}"


def is_array_folder(path: str, job_root: str) -> bool:
    """Whether `path` is named as an array folder directly in this job root."""
    parent, _, name = path.rpartition("/")
    return parent == job_root.rstrip("/") and bool(_ARRAY_FOLDER.fullmatch(name))


def array_name(folder: str) -> str:
    """The array job's name, from its folder's: one names the other."""
    _klique, first, _zero, token = folder.rsplit("/", 1)[-1].split("-")
    return f"klique-array-{first}-{token}"


def array_folder_named(job_root: str, name: str) -> str | None:
    """The array folder in this job root that an array job's name names (None: the name is
    no array's): where a scheduler shows no script, the name tells where its dispatcher lies."""
    if not ARRAY_NAME.fullmatch(name):
        return None
    _klique, _array, first, token = name.split("-")
    return f"{job_root.rstrip('/')}/klique-{first}-0-{token}"


def shared_directives(script: str, prefix: str, job_dir: str, tag: str) -> tuple[str, ...]:
    """The directive lines of a rendered job script (as the scheduler reads them: those
    before its first command), with the task's own folder and tag made placeholders: tasks
    whose lines are then equal can share one array job."""
    found = []
    for line in script.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        if stripped.startswith(prefix):
            found.append(_placeholders(stripped, job_dir, tag))
    return tuple(found)


def _placeholders(line: str, job_dir: str, tag: str) -> str:
    line = line.replace(job_dir, _JOB_DIR)
    return re.sub(rf"(?<![\w-]){re.escape(tag)}(?![\w-])", _TAG, line)


def dispatcher(
    directives: Sequence[str],
    index_variable: str,
    folder: str,
    name: str,
    elements: Sequence[str],
    first: int = 0,
) -> str:
    """The array job's script: its directives (the shared ones and the array's own, their
    placeholders filled with the array's folder and name), then each element's run in its
    task's folder, the first element's index being `first`. Every path in it is one Klique
    made (a job root and generated folder names).

    The table from index to folder ends the script, as comments that bash never reads (it
    stops at the exec): each element reads its own line from the array's folder. As a case of
    N branches that every element parsed, it cost an element's dispatcher (with its ln and
    job.sh) 7.1 ms of CPU at 500 elements and 8.7 at 1,000; read by line, 6.2 and 6.5."""
    for element in elements:
        if not JOB_FOLDER.fullmatch(element):
            raise ValueError(f"not a job folder Klique names: {element!r}")
    runner = shlex.quote(f"{folder}/klique-runner.pyz")
    head = [
        "#!/bin/bash",
        f"# Klique job array {name}: {len(elements)} tasks, each in its own job folder",
        *(d.replace(_JOB_DIR, folder).replace(_TAG, name) for d in directives),
        "",
        "# The element's folder: its index's line in the table that ends this script.",
        f'i="${{{index_variable}:-}}"; entry=',
    ]
    tail = [
        'case "$entry" in "# $i /"*) dir=${entry#"# $i "} ;; '
        '*) echo "klique: no task for array index $i" >&2; exit 1 ;; esac',
        "# The runner once for the array: each element links it into its own folder.",
        f'ln -f {runner} "$dir/klique-runner.pyz" 2>/dev/null || '
        f'cp -f {runner} "$dir/klique-runner.pyz" || exit 1',
        'exec >>"$dir/job.out" 2>&1',
        'exec "$dir/job.sh"',
        "# Each element's index and its task's folder:",
    ]
    before_table = "\n".join([*head, "lookup", *tail]).count("\n") + 1  # lines, all told
    lookup = (
        f'case "$i" in ""|*[!0-9]*) ;; *) [ "$i" -ge {first} ] && mapfile -t -n 1 '
        f"-s $((i - {first} + {before_table})) entry <{shlex.quote(folder)}/job.sh ;; esac"
    )
    table = [f"# {i} {e}" for i, e in enumerate(elements, start=first)]
    return "\n".join([*head, lookup, *tail, *table]) + "\n"


def elements_of(script: str) -> dict[str, int]:
    """A dispatcher's table: each task's job folder and its element's index (the table's
    comment lines, or the case branches of an array submitted before they replaced them)."""
    found = {}
    for line in script.splitlines():
        match = _ELEMENT.fullmatch(line.strip()) or _CASE_ELEMENT.fullmatch(line.strip())
        if match:
            words = shlex.split(match[2])
            if len(words) == 1 and JOB_FOLDER.fullmatch(words[0]):
                found[words[0]] = int(match[1])
    return found


def sweep_batches(tasks: Sequence[Task], max_array: int, batch_items: int) -> list[list[Task]]:
    """How the agent hands new tasks over where arrays are used: each sweep's tasks together
    (up to an array's size), the rest `batch_items` at a time."""
    sweeps: dict[int | None, list[Task]] = {}
    for task in tasks:
        sweeps.setdefault(task.sweep, []).append(task)
    found: list[list[Task]] = []
    for sweep, members in sweeps.items():
        size = batch_items if sweep is None else max_array
        found += [members[n : n + size] for n in range(0, len(members), size)]
    return found


def group_arrays(
    jobs: Sequence[StagedJob], directive: str, max_array: int
) -> tuple[list[Array], list[StagedJob]]:
    """The tasks of one sweep whose directives (lines starting `directive`) agree, as arrays
    of two or more (each with the directives its tasks share); the rest, one job each."""
    groups: dict[tuple[int, tuple[str, ...]], list[StagedJob]] = {}
    singles: list[StagedJob] = []
    for job in jobs:
        if job.task.sweep is None:
            singles.append(job)
            continue
        script = job.folder.files[SCRIPT][0].decode()
        shared = shared_directives(script, directive, job.folder.folder, job.task.tag)
        groups.setdefault((job.task.sweep, shared), []).append(job)
    arrays: list[Array] = []
    for (_sweep, shared), members in groups.items():
        for start in range(0, len(members), max_array):
            chunk = members[start : start + max_array]
            if len(chunk) > 1:
                arrays.append((shared, chunk))
            else:
                singles += chunk
    return arrays, singles


def without_runner(files: Mapping[str, tuple[bytes, int]]) -> dict[str, tuple[bytes, int]]:
    """An element's folder: the array's folder holds the runner once for all of them."""
    return {name: data for name, data in files.items() if name != RUNNER}


def dispatcher_path(status: NativeStatus, job_root: str) -> str:
    """Where the dispatcher of the array job a status shows lies: the script the status
    command shows (Slurm's squeue, PBS's Submit_arguments); where it shows none (LSF's bsub
    reads it on its stdin), the folder the array's name names in the job root, for a record
    that names its owner: the driver takes only that owner's elements, where it owns the
    folder."""
    if status.script or not status.user:
        return status.script
    folder = array_folder_named(job_root, status.name)
    return f"{folder}/{SCRIPT}" if folder else ""


def array_dispatchers(
    listing: Iterable[NativeStatus], job_root: str, cancelled: Callable[[NativeStatus], bool]
) -> dict[str, list[NativeStatus]]:
    """The dispatcher of each live array job in a listing (path: its elements' records),
    where it lies in an array folder of this job root that the job's name names."""
    found: dict[str, list[NativeStatus]] = {}
    for status in listing:
        script = dispatcher_path(status, job_root)
        folder = script.removesuffix(f"/{SCRIPT}")
        ours = is_array_folder(folder, job_root) and array_name(folder) == status.name
        if ours and not cancelled(status):
            found.setdefault(script, []).append(status)
    return found


def elements_run(
    script: str,
    elements: Iterable[NativeStatus],
    folders: Iterable[str],
    account: str,
    element_index: Callable[[str], int | None],
) -> dict[str, str]:
    """Which of these job folders an array's elements run (folder: element id), by the
    table of its dispatcher `script`. Only the account's own elements count: another
    account's job, named as this one's array, is never taken for a task's."""
    wanted = set(folders)
    at = {index: folder for folder, index in elements_of(script).items() if folder in wanted}
    found: dict[str, str] = {}
    for status in elements:
        if status.user and status.user != account:
            continue
        index = element_index(status.native_id)
        if index is not None and index in at:
            found[at[index]] = status.native_id
    return found
