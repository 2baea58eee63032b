"""The request and response bodies of tuning (broker/api/tunings.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from broker.names import LINE, NAME
from broker.tasks.schemas import _Body

Sampler = Literal["tpe", "random", "grid", "cmaes"]
Pruner = Literal["none", "median", "hyperband"]
OBJECTIVE = r"^[A-Za-z0-9_][A-Za-z0-9_ .:/-]{0,199}$"


class TuningIn(_Body):
    """A search over base task `base_task`'s parameters (specs as broker/tuning/specs.py
    checks them), each trial a clone of it with sampled values."""

    base_task: int = Field(ge=1, lt=2**63)
    # Each a spec ({"name", "kind", "low", "high"[, "step"]} or {"name", "kind", "choices"})
    # or the CLI's text, NAME=KIND:ARGS.
    params: list[dict[str, Any] | Annotated[str, Field(max_length=20_000)]] = Field(
        min_length=1, max_length=64
    )
    objective: str = Field(pattern=OBJECTIVE, description="A scalar's name, or TITLE/SERIES.")
    direction: Literal["minimize", "maximize"] = "minimize"
    objective_mode: Literal["last", "best"] = "last"
    sampler: Sampler = "tpe"
    pruner: Pruner = "none"
    prune_after: int = Field(5, ge=0, le=10_000, description="Trials completed before pruning.")
    trials: int = Field(ge=1, le=100_000)
    gpu_hours: float | None = Field(None, gt=0, le=1e9)
    max_time_s: float | None = Field(None, gt=0, le=1e9)
    concurrency: int = Field(1, ge=1, le=10_000)
    resource: str | None = Field(None, pattern=NAME)
    name: str = Field("", max_length=200, pattern=LINE)
    seed: int | None = Field(None, ge=0, lt=2**32)


class TrialOut(BaseModel):
    number: int
    task_id: int | None
    params: dict[str, Any]
    state: str  # running, complete, pruned, failed
    value: float | None
    pruned_step: int | None
    reason: str
    created_at: float
    ended_at: float | None


class TuningOut(BaseModel):
    id: int
    owner: str
    team: str | None
    name: str
    base_task_id: int
    resource: str
    state: str  # running, stopping, completed, stopped, failed
    reason: str
    settings: dict[str, Any]
    best: dict[str, Any] | None  # number, value, params, task_id, model
    created_at: float
    ended_at: float | None
    trials: dict[str, int] = {}  # how many trials are in each state
    gpu_hours: float = 0.0  # the trials' GPU-hours, from the ledger


class TuningDetailOut(TuningOut):
    trial_list: list[TrialOut] = []
