"""Tuning's overhead: a TPE tuning of 40 trials with a median pruner on a cheap objective,
(x-3)^2 reported at 5 steps a tenth of a second apart, 4 at a time on the host pool, against
Optuna running the same objective (the same steps and pauses, 4 threads) in a local loop.
Prints trials per minute of each, their ratio (Klique's cost per trial as a factor), the best
value of each, and how many trials were pruned."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from typing import Any

import optuna
from _common import klique_server, last_line

TRIALS, CONCURRENCY, STEPS, PAUSE_S = 40, 4, 5, 0.1
ESTATE = """
resources:
  cpu: {{profile: {{cpus: 1, memory: 200M, walltime: 10m, pools: [local]}}}}
pools:
  local:
    kind: host
    slots: 8
    user_map: {{admin: alice}}
    job_root: {job_root}
"""
TRAIN = f"""
import time, klique
task = klique.Task.init()
x = float(task.connect({{"x": 0.0}})["x"])
for step in range({STEPS}):
    task.log.scalar("loss", (x - 3) ** 2, step=step)
    time.sleep({PAUSE_S})
"""


def local_loop() -> tuple[float, float]:
    """Optuna alone: seconds for the trials, and the best value."""

    def objective(trial: optuna.Trial) -> float:
        x = trial.suggest_float("x", -10, 10)
        for step in range(STEPS):
            trial.report((x - 3) ** 2, step)
            if trial.should_prune():
                raise optuna.TrialPruned()
            time.sleep(PAUSE_S)
        return (x - 3) ** 2

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        sampler=optuna.samplers.TPESampler(seed=1),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=5),
    )
    t0 = time.perf_counter()
    study.optimize(objective, n_trials=TRIALS, n_jobs=CONCURRENCY)
    return time.perf_counter() - t0, float(study.best_value)


def klique_tuning(api: Any, python: str) -> dict[str, Any]:
    body = {"command": [python, "-c", TRAIN], "resource": "cpu", "parameters": {"x": 0.0}}
    base = api.post("/sdk/tasks", json=body).json()["id"]
    spec = {
        "base_task": base,
        "params": ["x=uniform:-10:10"],
        "objective": "loss",
        "pruner": "median",
        "trials": TRIALS,
        "concurrency": CONCURRENCY,
        "seed": 1,
    }
    made = api.post("/tunings", json=spec)
    assert made.status_code == 201, made.text
    t0 = time.perf_counter()
    while True:
        shown = api.get(f"/tunings/{made.json()['id']}").json()
        if shown["state"] != "running":
            break
        time.sleep(0.2)
    shown["seconds"] = time.perf_counter() - t0
    return dict(shown)


def main() -> None:
    local_s, local_best = local_loop()
    print(f"optuna alone: {TRIALS} trials in {local_s:.1f} s, best {local_best:.4g}", flush=True)
    python = "/usr/bin/python3" if os.geteuid() == 0 else sys.executable
    with tempfile.TemporaryDirectory(prefix="klique-tune-") as job_root:
        os.chmod(job_root, 0o1777)
        estate = ESTATE.format(job_root=job_root) if os.geteuid() == 0 else None
        with klique_server(estate) as (api, _home):
            shown = klique_tuning(api, python)
    trials = shown["trial_list"]
    pruned = sum(t["state"] == "pruned" for t in trials)
    best = shown["best"]["value"] if shown["best"] else None
    print(f"klique: {len(trials)} trials in {shown['seconds']:.1f} s, best {best}, {pruned} pruned")
    klique_rate = len(trials) / shown["seconds"] * 60
    local_rate = TRIALS / local_s * 60
    last_line(
        {
            "trials": TRIALS,
            "concurrency": CONCURRENCY,
            "klique_trials_per_min": round(klique_rate, 1),
            "optuna_local_trials_per_min": round(local_rate, 1),
            "klique_best": best,
            "optuna_local_best": round(local_best, 6),
            "klique_pruned": pruned,
            "state": shown["state"],
            "ratio_local_to_klique": round(local_rate / klique_rate, 2),
        }
    )


if __name__ == "__main__":
    main()
