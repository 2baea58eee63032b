"""What a batch scheduler's commands say, as the drivers' parsers read it: one job's record in
a status or accounting listing, and the pool's free capacity."""

from __future__ import annotations

from dataclasses import dataclass


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
class Capacity:
    free_gpus: float = 0.0
    free_cpus: int | None = None
    free_nodes: int | None = None  # idle nodes (None: not counted)
