"""Whether the kernel's OOM killer ended a process of the runner's memory cgroup: the cgroup's
own counter of OOM kills (v2 `memory.events`, v1 `memory.oom_control`, line `oom_kill N`), as
a container or a scheduler's job cgroup shows it.

A task killed by SIGKILL is out of memory only where that counter grew while it ran: a counter
that cannot be read (no memory controller, an older kernel) says nothing, and the task's end
keeps its plainer reason.
"""

from __future__ import annotations

import os

OOM_REASON = "out of memory: the kernel's OOM killer ended the task at its memory limit"
CGROUP_ROOT = "/sys/fs/cgroup"


def counter_files(proc_cgroup: str, root: str = CGROUP_ROOT) -> list[str]:
    """Where the OOM counter of the cgroups in /proc/self/cgroup's text may be read: at their
    paths below the mount, then at the mount itself (a container's cgroup namespace, or the
    cgroup a container runtime mounts as the root of its own)."""
    files = []
    for line in proc_cgroup.splitlines():
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        path = path.strip().lstrip("/")
        if controllers == "":  # cgroup v2
            files += [os.path.join(root, path, "memory.events"), f"{root}/memory.events"]
        elif "memory" in controllers.split(","):
            base = f"{root}/memory"
            files += [os.path.join(base, path, "memory.oom_control"), f"{base}/memory.oom_control"]
    return files


def oom_kill_count(text: str) -> int | None:
    """The `oom_kill N` line of memory.events or memory.oom_control."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def kills() -> int | None:
    """OOM kills in the runner's memory cgroup so far (None: not readable here)."""
    try:
        with open("/proc/self/cgroup", encoding="ascii") as f:
            files = counter_files(f.read())
    except OSError:
        return None
    for path in files:
        try:
            with open(path, encoding="ascii") as f:
                found = oom_kill_count(f.read())
        except OSError:
            continue
        if found is not None:
            return found
    return None


def killed_since(before: int | None) -> bool:
    """The OOM killer has struck in the runner's cgroup since `before` was counted."""
    after = kills()
    return before is not None and after is not None and after > before
