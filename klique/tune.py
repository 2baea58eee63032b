"""Tuning from Python: a search over a base task's parameters, run by the server with Optuna
(each trial a clone of the base task with sampled values, run as you).

    import klique
    tuning = klique.tune(
        42,
        params={"lr": "loguniform:1e-5:1e-1", "layers": "int:2:8", "opt": "choice:adam,sgd"},
        objective="val_loss", direction="minimize", sampler="tpe", pruner="median",
        trials=40, concurrency=4, gpu_hours=10, max_time="2h")
    tuning.wait()["best"]     # {"number", "value", "params", "task_id", "model"}
"""

from __future__ import annotations

import time

from klique._api import Api, KliqueError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Mapping, Optional, Union

_FINAL = ("completed", "stopped", "failed")


class Tuning:
    """A tuning that was started: its id, and what the server says of it."""

    def __init__(self, api: Api, tuning_id: int) -> None:
        self._api = api
        self.id = tuning_id

    def show(self) -> Dict[str, Any]:
        """Its state, settings, best trial and trials (`trial_list`)."""
        return dict(self._api.get(f"/tunings/{self.id}"))

    @property
    def best(self) -> Optional[Dict[str, Any]]:
        """The best trial so far: number, value, params, task_id and model (if it made one)."""
        return self.show()["best"]

    def stop(self) -> Dict[str, Any]:
        """Ask no more trials and cancel those running."""
        return dict(self._api.post(f"/tunings/{self.id}/stop"))

    def wait(self, timeout: Optional[float] = None, poll_s: float = 2.0) -> Dict[str, Any]:
        """Wait until it ends (its budget spent, or stopped); what `show` says then."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            shown = self.show()
            if shown["state"] in _FINAL:
                return shown
            if deadline is not None and time.monotonic() > deadline:
                raise KliqueError(f"tuning {self.id} is still {shown['state']} after {timeout} s")
            time.sleep(poll_s)


def tune(
    base_task: Union[int, Any],
    params: Mapping[str, Union[str, Dict[str, Any]]],
    objective: str,
    direction: str = "minimize",
    sampler: str = "tpe",
    pruner: str = "none",
    trials: int = 20,
    concurrency: int = 1,
    gpu_hours: Optional[float] = None,
    max_time: Optional[Union[str, float]] = None,
    objective_mode: str = "last",
    prune_after: int = 5,
    resource: Optional[str] = None,
    name: str = "",
    seed: Optional[int] = None,
    api: Optional[Api] = None,
) -> Tuning:
    """Start a tuning of `base_task` (a Task or its id). `params` maps each parameter to a
    spec: "uniform:LOW:HIGH", "loguniform:LOW:HIGH", "int:LOW:HIGH[:STEP]", "choice:A,B".
    `max_time` is seconds or text like "2h". The server checks everything and says what is
    wrong (KliqueError)."""
    task_id = int(getattr(base_task, "id", base_task))
    specs = [spec if isinstance(spec, dict) else f"{key}={spec}" for key, spec in params.items()]
    for key, spec in params.items():
        if isinstance(spec, dict):
            spec.setdefault("name", key)
    body = {
        "base_task": task_id,
        "params": specs,
        "objective": objective,
        "direction": direction,
        "objective_mode": objective_mode,
        "sampler": sampler,
        "pruner": pruner,
        "prune_after": prune_after,
        "trials": trials,
        "gpu_hours": gpu_hours,
        "max_time_s": _seconds(max_time),
        "concurrency": concurrency,
        "resource": resource,
        "name": name,
        "seed": seed,
    }
    api = api or Api.here()
    made = api.post("/tunings", body)
    return Tuning(api, int(made["id"]))


def _seconds(value: Optional[Union[str, float]]) -> Optional[float]:
    if value is None or isinstance(value, (int, float)):
        return value
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    text = str(value).strip().lower()
    try:
        return float(text[:-1]) * units[text[-1]] if text[-1:] in units else float(text)
    except ValueError:
        raise KliqueError(
            f"max_time {value!r} is not a duration; write it like 90s, 30m or 2h"
        ) from None
