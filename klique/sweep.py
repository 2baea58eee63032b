"""Many runs in one request: a sweep (one id for all, to list and cancel together), made all
at once or not at all. Each run is its own argv: build it in Python, no templates needed.

    import klique
    made = klique.sweep(
        [{"command": ["python3", "train.py", f"--lr={lr}"], "parameters": {"lr": lr}}
         for lr in (0.1, 0.01, 0.001)],
        resource="1-gpu", name="lr sweep")
    made.id, made.task_ids
    made.cancel()
"""

from __future__ import annotations

from klique._api import Api, KliqueError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, List, Optional

_RUN_KEYS = {"command", "parameters", "name", "env", "requirements", "image"}


class Sweep:
    """A sweep that was made: its id and its tasks' ids, in the order of the runs."""

    def __init__(self, api: Api, sweep_id: int, task_ids: List[int]) -> None:
        self._api = api
        self.id = sweep_id
        self.task_ids = task_ids

    def states(self) -> Dict[str, int]:
        """How many of its tasks are in each state now."""
        return dict(self._api.get(f"/sweeps/{self.id}")["states"])

    def cancel(self) -> Dict[str, int]:
        """Cancel every task of the sweep that has not ended; the states after."""
        return dict(self._api.post(f"/sweeps/{self.id}/cancel")["states"])


def sweep(
    runs: Iterable[Dict[str, Any]],
    resource: Optional[str] = None,
    project: str = "default",
    name: str = "",
    api: Optional[Api] = None,
) -> Sweep:
    """Queue one task per run (a dict with `command`, and optionally `parameters`, `name`,
    `env`, `requirements`, `image`) on `resource`, as one sweep. Uses your token ($KLIQUE_TOKEN
    or `klique login`); the server's limits.max_batch bounds how many runs one call takes."""
    tasks = []
    for index, run in enumerate(runs):
        unknown = set(run) - _RUN_KEYS
        if "command" not in run or unknown:
            raise KliqueError(
                f"run {index} needs a command (a list of arguments) and only the keys "
                f"{', '.join(sorted(_RUN_KEYS))}; it has {', '.join(sorted(run))}"
            )
        tasks.append({"resource": resource, "project": project, **run})
    api = api or Api.here()
    made = api.post("/sweeps", {"name": name, "tasks": tasks})
    return Sweep(api, int(made["sweep"]), [int(t["id"]) for t in made["tasks"]])
