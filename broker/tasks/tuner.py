"""The tuner: runs every live tuning, a look at a time, on the replica that leads.

At each look, for each tuning: the trials' tasks that reported new steps of the objective feed
the study's pruner, and a trial it prunes is cancelled through Klique (the normal cancel, its
task's reason "pruned by the tuner at step N"); a trial whose task ended is told to the study
(completed with its objective, failed, or pruned); then the budget (broker/tuning/budget.py)
says how many new trials to ask, and those are made together, as one sweep, so that a batch
pool submits them as one job array where their directives match.

The study of each tuning is kept in memory between looks (a sampler keeps state) and rebuilt
from the trials' records whenever memory and the records disagree: at start, after a restart,
or after another replica led."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, replace
from typing import Any

import optuna

from broker.domain import Task, TaskState
from broker.errors import KliqueError
from broker.identity.resolve import Caller
from broker.store.tunings import RUNNING, TuningStore
from broker.tasks.control import TaskControl
from broker.tasks.create import check_task
from broker.tasks.tuning import LIVE_STATES, STOPPING
from broker.tuning.budget import Budget, Spent, judge
from broker.tuning.study import (
    distributions,
    objective_value,
    pruner_of,
    rebuilt,
    sampler_of,
    steps_of,
)

log = logging.getLogger("klique.tuner")
LOOK_EVERY_S = 0.5  # a runner reports every 0.5 s: a pruned trial stops within a report or two
_EARLY = (TaskState.CREATED, TaskState.QUEUED, TaskState.HELD, TaskState.PLACED)


@dataclass
class _Cancel:
    task: Task
    reason: str


class Tuner:
    """The live tunings of one control loop's store."""

    def __init__(self, loop: TaskControl) -> None:
        self.loop = loop
        self.store = TuningStore(loop.store)
        self.studies: dict[int, optuna.Study] = {}

    async def run(self, stop: asyncio.Event, leads: Any) -> None:
        """Look every LOOK_EVERY_S until `stop`, while `leads()` says this replica leads."""
        while not stop.is_set():
            if leads():
                try:
                    await self.look()
                except Exception:  # a bad look must not end tuning for good
                    log.exception("tuner: a look failed; looking again shortly")
            else:
                self.studies.clear()  # another replica may advance them meanwhile
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), LOOK_EVERY_S)

    async def look(self) -> None:
        for tuning in await asyncio.to_thread(self.store.running, LIVE_STATES):
            try:
                cancels = await asyncio.to_thread(self.follow, tuning)
                cancels += await asyncio.to_thread(self.advance, tuning)
                for cancel in cancels:
                    await self._cancel(cancel)
            except KliqueError as exc:
                log.warning("tuning %s: %s", tuning["id"], exc)

    # One tuning: follow its trials, then ask for more.

    def follow(self, tuning: dict[str, Any]) -> list[_Cancel]:
        """Tell the study what the trials' tasks did; the tasks to cancel (pruned or over
        budget)."""
        settings = tuning["settings"]
        trials = self.store.trials(tuning["id"])
        study = self._study(tuning, trials)
        running = [t for t in trials if t["state"] == RUNNING and t["task_id"] is not None]
        tasks = {t.id: t for t in self.loop.store.tasks(ids=[t["task_id"] for t in running])}
        cancels: list[_Cancel] = []
        for trial in running:
            task = tasks[trial["task_id"]]
            scalars = self.store.objective_scalars(task.id, settings["objective"])
            if task.state.final:
                self._ended(tuning, study, trial, task, scalars)
                continue
            if trial["pruned_step"] is not None or trial["reason"]:
                continue  # its cancel was asked; its task ends shortly
            step = self._pruned_at(study, trial["number"], steps_of(scalars, settings["objective"]))
            if step is not None:
                reason = f"pruned by the tuner at step {step}"
                self.store.update_trial(
                    tuning["id"], trial["number"], pruned_step=step, reason=reason
                )
                cancels.append(_Cancel(task, reason))
        return cancels

    def advance(self, tuning: dict[str, Any]) -> list[_Cancel]:
        """Ask new trials as the budget allows, or end the tuning once it is spent and no
        trial runs; the tasks to cancel, where a budget is spent."""
        settings, tuning_id = tuning["settings"], tuning["id"]
        trials = self.store.trials(tuning_id)
        live = [t for t in trials if t["state"] == RUNNING]
        ids = [t["task_id"] for t in trials if t["task_id"] is not None]
        now = time.time()
        budget = Budget(
            trials=settings["trials"],
            gpu_hours=settings.get("gpu_hours"),
            max_time_s=settings.get("max_time_s"),
            concurrency=settings["concurrency"],
        )
        spent = Spent(
            len(trials), len(live), self.store.gpu_seconds(ids, now), now - tuning["created_at"]
        )
        verdict = judge(budget, spent)
        if tuning["state"] == STOPPING:
            verdict = replace(verdict, ask=0, stop_live=True, spent="was stopped by its owner")
        self._keep_best(tuning, trials)
        cancels = []
        if verdict.stop_live:
            why = f"cancelled by the tuner: its tuning {verdict.spent}"
            cancels = self._stop_live(tuning, live, why)
        if verdict.spent is not None:
            if not live:
                self._finish(tuning, verdict.spent)
            return cancels
        if verdict.ask:
            self._ask(tuning, trials, verdict.ask)
            made = len(trials) + verdict.ask
            self.store.update(tuning_id, reason=f"running: {made} of {budget.trials} trials made")
        return cancels

    # The study.

    def _study(self, tuning: dict[str, Any], trials: list[dict[str, Any]]) -> optuna.Study:
        """The tuning's study, rebuilt from the records unless memory holds them all."""
        study = self.studies.get(tuning["id"])
        if study is not None and len(study.get_trials(deepcopy=False)) == len(trials):
            return study
        settings = tuning["settings"]
        done = []
        for trial in trials:
            steps = {}
            if trial["task_id"] is not None:
                scalars = self.store.objective_scalars(trial["task_id"], settings["objective"])
                steps = steps_of(scalars, settings["objective"])
            done.append({**trial, "steps": steps})
        study = rebuilt(
            settings["direction"],
            sampler_of(settings["sampler"], settings["params"], settings["seed"] + len(trials)),
            pruner_of(settings["pruner"], settings["prune_after"]),
            settings["params"],
            done,
        )
        self.studies[tuning["id"]] = study
        return study

    def _pruned_at(self, study: optuna.Study, number: int, steps: dict[int, float]) -> int | None:
        """Report the steps the study has not seen; the last step, if the pruner prunes."""
        frozen = study.get_trials(deepcopy=False)[number]
        new = {s: v for s, v in sorted(steps.items()) if s not in frozen.intermediate_values}
        if not new:
            return None
        # The study's own Trial, found by its id: how Optuna's ask-and-tell reports steps.
        trial = optuna.trial.Trial(study, frozen._trial_id)
        for step, value in new.items():
            trial.report(value, step)
        return max(new) if trial.should_prune() else None

    def _ended(
        self,
        tuning: dict[str, Any],
        study: optuna.Study,
        trial: dict[str, Any],
        task: Task,
        scalars: list[dict[str, Any]],
    ) -> None:
        settings, number = tuning["settings"], trial["number"]
        steps = steps_of(scalars, settings["objective"])
        self._pruned_at(study, number, steps)  # the last steps, for the study's record
        fields: dict[str, Any] = {"ended_at": task.finished_at or time.time()}
        if trial["pruned_step"] is not None and task.state is not TaskState.COMPLETED:
            study.tell(number, state=optuna.trial.TrialState.PRUNED)
            fields["state"] = "pruned"
            if task.reason != trial["reason"]:  # the cancel's own words; the tuner's are why
                self.loop.store.update(task.id, reason=trial["reason"])
        elif task.state is TaskState.COMPLETED:
            value = objective_value(
                scalars, settings["objective"], settings["objective_mode"], settings["direction"]
            )
            if value is None:
                study.tell(number, state=optuna.trial.TrialState.FAIL)
                fields.update(state="failed", reason=f"it reported no {settings['objective']}")
            else:
                study.tell(number, value)
                fields.update(state="complete", value=value)
        else:
            study.tell(number, state=optuna.trial.TrialState.FAIL)
            why = trial["reason"] or f"its task {task.state.value}: {task.reason}"
            fields.update(state="failed", reason=why)
        self.store.update_trial(tuning["id"], number, **fields)

    # Asking, stopping, ending.

    def _ask(self, tuning: dict[str, Any], trials: list[dict[str, Any]], count: int) -> None:
        """`count` new trials, their tasks made in one transaction as one sweep."""
        settings = tuning["settings"]
        study = self._study(tuning, trials)
        space = distributions(settings["params"])
        asked = [study.ask(space) for _ in range(count)]
        owner = Caller(user=tuning["owner"], admin=False, team=tuning["team"])
        made = []
        try:
            base = self.loop.store.get(tuning["base_task_id"])
            for trial in asked:
                spec = replace(
                    base.spec,
                    resource=tuning["resource"],
                    name=f"{tuning['name']} trial {trial.number}"[:200],
                )
                team = check_task(self.loop, owner, spec)  # the owner's policies, now
                gpus = self.loop.estate.resources[spec.resource].profile.gpu_share
                fields = {
                    "parameters": {**base.parameters, **trial.params},
                    "packages": list(base.packages),
                }
                made.append((spec, gpus, fields))
            sweep = f"tuning {tuning['id']}: {tuning['name']}"[:200]
            _, tasks = self.loop.store.create_queued(made, tuning["owner"], team, sweep)
        except KliqueError as exc:
            for trial in asked:
                study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
            failed = [
                {"number": t.number, "params": t.params, "state": "failed", "reason": str(exc)}
                for t in asked
            ]
            self.store.add_trials(tuning["id"], failed)
            self._finish(tuning, f"could not make its trials: {exc}", state="failed")
            return
        self.store.add_trials(
            tuning["id"],
            [
                {"number": t.number, "params": t.params, "task_id": task.id}
                for t, task in zip(asked, tasks, strict=True)
            ],
        )
        self.loop.wake()

    def _stop_live(
        self, tuning: dict[str, Any], live: list[dict[str, Any]], reason: str
    ) -> list[_Cancel]:
        cancels = []
        for trial in live:
            if trial["task_id"] is None or trial["reason"]:
                continue  # a cancel was asked already
            self.store.update_trial(tuning["id"], trial["number"], reason=reason)
            task = self.loop.store.get(trial["task_id"])
            if not task.state.final:
                cancels.append(_Cancel(task, reason))
        return cancels

    async def _cancel(self, cancel: _Cancel) -> None:
        """The normal cancel: at once while queued (with the tuner's reason), else asked of
        its pool, which confirms it shortly."""
        task = cancel.task
        done = await asyncio.to_thread(
            self.loop.store.change_state,
            task.id,
            TaskState.CANCELLED,
            cancel.reason,
            only_from=_EARLY,
        )
        if done is None:
            await self.loop.cancel(task, wait_s=0)

    def _keep_best(self, tuning: dict[str, Any], trials: list[dict[str, Any]]) -> None:
        done = [t for t in trials if t["state"] == "complete" and t["value"] is not None]
        if not done:
            return
        sign = 1 if tuning["settings"]["direction"] == "minimize" else -1
        best = min(done, key=lambda t: (sign * t["value"], t["number"]))
        if tuning["best"] and tuning["best"]["number"] == best["number"]:
            return
        model = self.store.model_of(best["task_id"])
        self.store.update(
            tuning["id"],
            best={
                "number": best["number"],
                "value": best["value"],
                "params": best["params"],
                "task_id": best["task_id"],
                "model": model,
            },
        )

    def _finish(self, tuning: dict[str, Any], why: str, state: str | None = None) -> None:
        best = self.store.get(tuning["id"])["best"]
        ended = state or ("stopped" if tuning["state"] == STOPPING else "completed")
        shown = f"; best trial {best['number']}: {best['value']:g}" if best else ""
        self.store.update(tuning["id"], state=ended, reason=f"{why}{shown}", ended_at=time.time())
        self.studies.pop(tuning["id"], None)
        log.info("tuning %s %s: %s", tuning["id"], ended, why)
