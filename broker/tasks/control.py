"""What the task service asks of the control loop (broker/control/loop.py's `ControlLoop`
answers it): the store and the estate, the last cycle's reasons, a pool's console, a wake and a
cancel. Named here so that the service is handed exactly this, and tests can hand less."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from broker.domain import Estate, Task
from broker.scheduler.model import PendingReason
from broker.store.repository import Store


class ConsoleSource(Protocol):
    """A pool's driver, as far as reading a task's console goes."""

    async def read_console(
        self, task: Task, offset: int, limit: int, rank: int = 0
    ) -> bytes | None: ...


class TaskControl(Protocol):
    store: Store
    estate: Estate  # replaced as a whole when the estate file is reloaded
    home: Path
    pending: dict[int, PendingReason]

    @property
    def drivers(self) -> Mapping[str, ConsoleSource]: ...

    def wake(self) -> None: ...

    def wake_pool(self, pool: str | None) -> None: ...

    def why(self, task: Task) -> PendingReason | None: ...

    async def cancel(self, task: Task, wait_s: float = ...) -> Task: ...
