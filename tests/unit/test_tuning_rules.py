"""Tuning's pure rules: parameter specs as `klique tune --param` reads them, the budget's
verdicts, a trial's objective from its scalars, and a study rebuilt from the trials' records."""

from __future__ import annotations

import pytest

from broker.tuning.budget import Budget, Spent, judge
from broker.tuning.specs import SpecError, grid_size, parse_param, parse_params
from broker.tuning.study import (
    distributions,
    objective_value,
    pruner_of,
    rebuilt,
    sampler_of,
    steps_of,
)


@pytest.mark.parametrize(
    ("item", "spec"),
    [
        ("lr=loguniform:1e-5:1e-1", {"name": "lr", "kind": "loguniform", "low": 1e-5, "high": 0.1}),
        ("drop=uniform:0:0.5", {"name": "drop", "kind": "uniform", "low": 0.0, "high": 0.5}),
        ("layers=int:2:8", {"name": "layers", "kind": "int", "low": 2, "high": 8}),
        ("bs=int:16:64:16", {"name": "bs", "kind": "int", "low": 16, "high": 64, "step": 16}),
        ("opt=choice:adam,sgd", {"name": "opt", "kind": "choice", "choices": ["adam", "sgd"]}),
        (
            "Args/k=choice:1,2.5,true",
            {"name": "Args/k", "kind": "choice", "choices": [1, 2.5, True]},
        ),
    ],
)
def test_a_param_spec_reads_as_written(item, spec):
    assert parse_param(item) == spec


@pytest.mark.parametrize(
    ("item", "says"),
    [
        ("lr", "is not NAME=KIND:ARGS"),
        ("1lr=uniform:0:1", "is not NAME=KIND:ARGS"),
        ("lr=normal:0:1", "unknown kind 'normal'; use one of uniform, loguniform, int, choice"),
        ("lr=uniform:1", "write lr=uniform:LOW:HIGH"),
        ("lr=uniform:0:1:2", "write lr=uniform:LOW:HIGH"),
        ("lr=uniform:a:1", "each bound must be a number"),
        ("n=int:1.5:3", "each bound must be an integer"),
        ("lr=uniform:1:0", "low bound 1.0 must be below its high bound 0.0"),
        ("lr=loguniform:0:1", "a log scale needs a low bound above 0"),
        ("lr=uniform:nan:1", "finite numbers"),
        ("n=int:1:9:0", "step must be 1 or more"),
        ("opt=choice:", "a choice needs 1 to 1000 values"),
        ("opt=choice:a,a", "a value is given twice"),
    ],
)
def test_a_bad_param_spec_says_what_and_how_to_fix(item, says):
    with pytest.raises(SpecError) as raised:
        parse_param(item)
    assert says in str(raised.value) and f"--param {item!r}" in str(raised.value)


def test_specs_name_each_parameter_once_and_at_least_one():
    with pytest.raises(SpecError, match="given twice"):
        parse_params(["x=uniform:0:1", "x=int:1:2"])
    with pytest.raises(SpecError, match="at least one parameter"):
        parse_params([])


def test_a_grid_counts_its_points_and_takes_no_float():
    specs = parse_params(["n=int:2:8:2", "opt=choice:a,b,c"])
    assert grid_size(specs) == 12
    assert grid_size(parse_params(["x=uniform:0:1"])) is None
    with pytest.raises(SpecError, match="grid sampler takes only choice and int"):
        sampler_of("grid", parse_params(["x=uniform:0:1"]), 0)


@pytest.mark.parametrize(
    ("spent", "ask", "stop_live", "why"),
    [
        (Spent(asked=0, live=0, gpu_seconds=0, elapsed_s=0), 3, False, None),
        (Spent(asked=2, live=2, gpu_seconds=0, elapsed_s=0), 1, False, None),
        (Spent(asked=8, live=1, gpu_seconds=0, elapsed_s=0), 2, False, None),
        (Spent(asked=9, live=3, gpu_seconds=0, elapsed_s=0), 0, False, None),
        (Spent(asked=10, live=2, gpu_seconds=0, elapsed_s=0), 0, False, "made its 10 trials"),
        (Spent(asked=4, live=2, gpu_seconds=7200, elapsed_s=0), 0, True, "spent its 2 GPU-hours"),
        (Spent(asked=4, live=2, gpu_seconds=0, elapsed_s=3600), 0, True, "wall time of 1 h"),
    ],
)
def test_the_budget_asks_within_concurrency_and_stops_when_any_is_spent(spent, ask, stop_live, why):
    budget = Budget(trials=10, gpu_hours=2, max_time_s=3600, concurrency=3)
    verdict = judge(budget, spent)
    assert (verdict.ask, verdict.stop_live) == (ask, stop_live)
    assert (verdict.spent is None) if why is None else why in verdict.spent


def test_no_gpu_or_time_bound_means_only_trials_count():
    verdict = judge(Budget(trials=2), Spent(asked=1, live=0, gpu_seconds=1e9, elapsed_s=1e9))
    assert (verdict.ask, verdict.spent) == (1, None)


SCALARS = [
    {"name": "loss", "series": "", "value": 4.0, "step": 0},
    {"name": "acc", "series": "", "value": 0.1, "step": 0},
    {"name": "loss", "series": "", "value": 1.0, "step": 1},
    {"name": "loss", "series": "", "value": 2.0, "step": 2},
    {"name": "loss", "series": "val", "value": 9.0, "step": 2},
]


def test_a_trials_objective_is_its_last_or_best_value():
    assert objective_value(SCALARS, "loss", "last", "minimize") == 2.0
    assert objective_value(SCALARS, "loss", "best", "minimize") == 1.0
    assert objective_value(SCALARS, "loss", "best", "maximize") == 4.0
    assert objective_value(SCALARS, "loss/val", "last", "minimize") == 9.0
    assert objective_value(SCALARS, "f1", "last", "minimize") is None
    assert steps_of(SCALARS, "loss") == {0: 4.0, 1: 1.0, 2: 2.0}


def test_a_study_rebuilt_from_records_keeps_states_and_prunes_as_before():
    specs = parse_params(["x=uniform:0:10"])
    trials = [
        {
            "number": n,
            "params": {"x": float(n)},
            "state": "complete",
            "value": float(n),
            "steps": {0: float(n)},
        }
        for n in range(3)
    ]
    trials.append(
        {"number": 3, "params": {"x": 9.0}, "state": "running", "value": None, "steps": {0: 9.0}}
    )
    study = rebuilt("minimize", sampler_of("tpe", specs, 1), pruner_of("median", 2), specs, trials)
    states = [t.state.name for t in study.trials]
    assert states == ["COMPLETE", "COMPLETE", "COMPLETE", "RUNNING"]
    assert study.best_trial.params == {"x": 0.0}
    running = study.trials[3]
    assert study.pruner.prune(study, running)  # worse than the median at step 0


@pytest.mark.parametrize("name", ["tpe", "random", "grid", "cmaes"])
def test_every_sampler_asks_values_within_the_specs(name):
    specs = parse_params(["n=int:2:8:2", "opt=choice:adam,sgd"])
    if name == "cmaes":
        specs = parse_params(["lr=loguniform:1e-5:1e-1", "n=int:2:8"])
    study = rebuilt("minimize", sampler_of(name, specs, 7), pruner_of("none", 0), specs, [])
    space = distributions(specs)
    for _ in range(6):
        trial = study.ask(space)
        for spec in specs:
            value = trial.params[spec["name"]]
            if spec["kind"] == "choice":
                assert value in spec["choices"]
            else:
                assert spec["low"] <= value <= spec["high"]
        study.tell(
            trial.number, float(sum(v for v in trial.params.values() if not isinstance(v, str)))
        )
