"""Optuna's side of a tuning: the search space as distributions, the sampler and the pruner a
tuning names, a study rebuilt from the trials' records (so that a tuning outlives a server
restart: the store, not memory, is the truth), and a trial's objective read from its scalars."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.study import StudyDirection
from optuna.trial import TrialState, create_trial

from broker.tuning.specs import Spec, SpecError

optuna.logging.set_verbosity(logging.WARNING)  # the tuner logs what matters in its own words

# A trial's state as the tuning records it, and Optuna's.
STATES = {
    "running": TrialState.RUNNING,
    "complete": TrialState.COMPLETE,
    "pruned": TrialState.PRUNED,
    "failed": TrialState.FAIL,
}


def distributions(specs: Sequence[Spec]) -> dict[str, BaseDistribution]:
    found: dict[str, BaseDistribution] = {}
    for spec in specs:
        kind = spec["kind"]
        if kind == "choice":
            found[spec["name"]] = CategoricalDistribution(spec["choices"])
        elif kind == "int":
            found[spec["name"]] = IntDistribution(
                spec["low"], spec["high"], step=spec.get("step", 1)
            )
        else:
            found[spec["name"]] = FloatDistribution(
                spec["low"], spec["high"], log=kind == "loguniform"
            )
    return found


def sampler_of(name: str, specs: Sequence[Spec], seed: int) -> optuna.samplers.BaseSampler:
    """The named sampler; grid takes only choices and integers (each point once)."""
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    if name == "grid":
        space: dict[str, list[Any]] = {}
        for spec in specs:
            if spec["kind"] == "choice":
                space[spec["name"]] = list(spec["choices"])
            elif spec["kind"] == "int":
                space[spec["name"]] = list(
                    range(spec["low"], spec["high"] + 1, spec.get("step", 1))
                )
            else:
                raise SpecError(
                    "the grid sampler takes only choice and int parameters; "
                    f"{spec['name']} is {spec['kind']}: write it as "
                    f"{spec['name']}=choice:V1,V2,... or use --sampler tpe"
                )
        return optuna.samplers.GridSampler(space, seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def pruner_of(name: str, prune_after: int) -> optuna.pruners.BasePruner:
    """The named pruner; `prune_after`: completed trials before the median pruner judges."""
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=prune_after, n_warmup_steps=0)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1)
    return optuna.pruners.NopPruner()


def rebuilt(
    direction: str,
    sampler: optuna.samplers.BaseSampler,
    pruner: optuna.pruners.BasePruner,
    specs: Sequence[Spec],
    trials: Iterable[Mapping[str, Any]],
) -> optuna.Study:
    """A study holding the recorded trials, in their numbers' order: each with its parameters,
    state, value and the intermediate values its task reported."""
    way = StudyDirection.MINIMIZE if direction == "minimize" else StudyDirection.MAXIMIZE
    study = optuna.create_study(direction=way, sampler=sampler, pruner=pruner)
    space = distributions(specs)
    for trial in sorted(trials, key=lambda t: int(t["number"])):
        state = STATES[trial["state"]]
        study.add_trial(
            create_trial(
                params=dict(trial["params"]),
                distributions={k: space[k] for k in trial["params"] if k in space},
                value=trial["value"] if state is TrialState.COMPLETE else None,
                intermediate_values={int(k): float(v) for k, v in trial["steps"].items()},
                state=state,
            )
        )
    return study


def steps_of(scalars: Iterable[Mapping[str, Any]], objective: str) -> dict[int, float]:
    """The objective's values by step (a value without a step takes the next one): what the
    pruner judges. `objective` is a scalar's name, or TITLE/SERIES for a titled series."""
    found: dict[int, float] = {}
    for scalar in scalars:
        if not _is_objective(scalar, objective):
            continue
        step = scalar.get("step")
        found[int(step) if step is not None else len(found)] = float(scalar["value"])
    return found


def objective_value(
    scalars: Iterable[Mapping[str, Any]], objective: str, mode: str, direction: str
) -> float | None:
    """The trial's last reported value of the objective, or its best (`mode` "best"): the
    least when minimising, the most when maximising. None: it reported none."""
    values = [float(s["value"]) for s in scalars if _is_objective(s, objective)]
    if not values:
        return None
    if mode == "best":
        return min(values) if direction == "minimize" else max(values)
    return values[-1]


def _is_objective(scalar: Mapping[str, Any], objective: str) -> bool:
    series = scalar.get("series") or ""
    name = f"{scalar['name']}/{series}" if series else scalar["name"]
    return name == objective or (not series and scalar["name"] == objective)
