"""Tuning's operations for every adapter: start a search over a base task's parameters, list,
show and stop tunings. The tuner (broker/tasks/tuner.py) runs them.

Who may do what: a user tunes a base task they may read (the same NotFound as for a task that
does not exist otherwise); every trial is a new task of the tuning's owner, checked against the
owner's policies on the compute resource, never a task of the base task's owner. A tuning is
its owner's (and admins') to read and stop."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from broker import authz
from broker.apps.launch import APPLICATION
from broker.authz import Action
from broker.domain import LOCAL_POOL, Task
from broker.errors import KliqueError
from broker.identity.resolve import Caller
from broker.store.tunings import RUNNING, TuningStore
from broker.tasks.control import TaskControl
from broker.tasks.create import check_batch_size, check_task
from broker.tasks.tuning_schemas import TrialOut, TuningDetailOut, TuningIn, TuningOut
from broker.tuning.specs import check_specs, grid_size, parse_param
from broker.tuning.study import sampler_of

STOPPING = "stopping"
LIVE_STATES = (RUNNING, STOPPING)  # the tuner follows these


class TuningService:
    def __init__(self, loop: TaskControl) -> None:
        self.loop = loop
        self.store = TuningStore(loop.store)

    def create(self, who: Caller, body: TuningIn) -> TuningOut:
        """A new tuning, running: its first trials are asked at the tuner's next look."""
        authz.check_scope(who, "submit")
        base = authz.find_task(self.loop.store.get, who, Action.READ_TASK, body.base_task)
        specs = check_specs([parse_param(p) if isinstance(p, str) else p for p in body.params])
        _check_names(base, [s["name"] for s in specs])
        resource = _resource_of(base, body.resource)
        if base.spec.kind == APPLICATION:
            raise KliqueError(
                f"task {base.id} is an app; tune a training task (apps are launched, not cloned)"
            )
        check_task(self.loop, who, replace(base.spec, resource=resource))
        # The trials asked at one look are made in one request, as a sweep.
        check_batch_size(self.loop.estate, min(body.concurrency, body.trials), "trials at once")
        settings = body.model_dump(exclude={"base_task", "resource", "name"})
        settings["params"] = specs
        settings["seed"] = body.seed if body.seed is not None else base.id * 7919 % 2**31
        sampler_of(body.sampler, specs, settings["seed"])  # the grid's refusal, now
        size = grid_size(specs)
        if body.sampler == "grid" and size is not None and body.trials > size:
            settings["trials"] = size  # every point once
        name = body.name or f"tune {base.spec.name or base.id}"
        made = self.store.create(who.user, who.team, name, base.id, resource, settings)
        return self._out(made)

    def listing(self, who: Caller, all_users: bool = False, limit: int = 200) -> list[TuningOut]:
        owner = authz.owner_filter(who, None if all_users else who.user)
        return [self._out(t) for t in self.store.listing(owner, limit)]

    def show(self, who: Caller, tuning_id: int) -> TuningDetailOut:
        tuning = self.own(who, tuning_id)
        trials = self.store.trials(tuning_id)
        out = self._out(tuning, trials)
        return TuningDetailOut(**out.model_dump(), trial_list=[TrialOut(**t) for t in trials])

    def stop(self, who: Caller, tuning_id: int) -> TuningOut:
        """Stop asking for trials and cancel those running; the tuner ends it."""
        authz.check_scope(who, "submit")
        tuning = self.own(who, tuning_id)
        if tuning["state"] == RUNNING:
            self.store.update(tuning_id, state=STOPPING, reason="stopping: stopped by its owner")
            tuning = self.store.get(tuning_id)
        return self._out(tuning)

    def own(self, who: Caller, tuning_id: int) -> dict[str, Any]:
        """The caller's own tuning (any, for an admin); NotFound alike for another's."""
        refusal = f"no tuning {tuning_id} of yours; `klique tune ls` lists yours"
        return authz.find_owned(who, lambda: self.store.get(tuning_id), refusal)

    def _out(self, tuning: dict[str, Any], trials: list[dict[str, Any]] | None = None) -> TuningOut:
        trials = self.store.trials(tuning["id"]) if trials is None else trials
        counts: dict[str, int] = {}
        for trial in trials:
            counts[trial["state"]] = counts.get(trial["state"], 0) + 1
        ids = [t["task_id"] for t in trials if t["task_id"] is not None]
        end = tuning["ended_at"] or time.time()
        seconds = self.store.gpu_seconds(ids, end)
        return TuningOut(**tuning, trials=counts, gpu_hours=round(seconds / 3600, 6))


def _check_names(base: Task, names: list[str]) -> None:
    """Each searched parameter must be one the base task records: a typo would otherwise
    spend a whole budget on values that no trial reads."""
    unknown = [n for n in names if n not in base.parameters]
    if unknown:
        known = ", ".join(sorted(base.parameters)) or "none"
        raise KliqueError(
            f"task {base.id} has no parameter {', '.join(unknown)} (its parameters: {known}); "
            "fix: search the names it records (task.connect({...}) in its script)"
        )


def _resource_of(base: Task, asked: str | None) -> str:
    if asked:
        return asked
    if base.spec.resource == LOCAL_POOL:
        raise KliqueError(
            f"task {base.id} ran where it was started; give the compute resource its trials "
            "run on (--resource NAME)"
        )
    return base.spec.resource
