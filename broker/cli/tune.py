"""`klique tune ...`: a search over a base task's parameters (Optuna, run by the server), and
`klique tune ls/show/stop`. Thin: the parameter specs are checked here (broker/tuning/specs.py)
for an early, clear error, and again by the server."""

from __future__ import annotations

import json
from typing import Any

import click

from broker.cli.output import json_option, listing, when
from broker.client import Client
from broker.errors import KliqueError
from broker.quantities import parse_duration_s
from broker.tuning.specs import PRUNERS, SAMPLERS, parse_params

COLUMNS = [
    ("id", "ID"),
    ("name", "NAME"),
    ("base_task_id", "BASE"),
    ("state", "STATE"),
    ("made", "TRIALS"),
    ("best_value", "BEST"),
    ("gpu_hours", "GPU-H"),
    ("created", "CREATED"),
]
TRIAL_COLUMNS = [
    ("number", "TRIAL"),
    ("task_id", "TASK"),
    ("state", "STATE"),
    ("value", "VALUE"),
    ("params", "PARAMETERS"),
    ("reason", "REASON"),
]


class _TuneGroup(click.Group):
    """`klique tune BASE ...` starts a tuning; `klique tune ls|show|stop` are subcommands."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["start", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_TuneGroup)
def tune() -> None:
    """Tune a task's parameters: `klique tune BASE_TASK_ID --param lr=loguniform:1e-5:1e-1
    --objective val_loss --trials 40` (the same as `klique tune start ...`); each trial is a
    clone of the task, run as you."""


@tune.command("start")
@click.argument("base_task", type=int)
@click.option(
    "--param",
    "params",
    multiple=True,
    required=True,
    help="NAME=KIND:ARGS: uniform:LOW:HIGH, loguniform:LOW:HIGH, int:LOW:HIGH[:STEP], "
    "choice:A,B,...",
)
@click.option("--objective", required=True, help="The scalar to optimise (NAME or TITLE/SERIES).")
@click.option("--minimize/--maximize", "minimize", default=True, help="Default: minimise.")
@click.option(
    "--objective-of",
    type=click.Choice(["last", "best"]),
    default="last",
    help="A trial's value: its last report of the objective, or its best.",
)
@click.option("--sampler", type=click.Choice(SAMPLERS), default="tpe")
@click.option("--pruner", type=click.Choice(PRUNERS), default="none")
@click.option("--prune-after", type=int, default=5, help="Trials completed before pruning.")
@click.option("--trials", type=int, required=True, help="How many trials at most.")
@click.option("--gpu-hours", type=float, help="Stop once the trials used this many GPU-hours.")
@click.option("--max-time", help="Stop after this wall time (90s, 30m, 2h).")
@click.option("--concurrency", type=int, default=1, help="Trials running at once.")
@click.option("--resource", help="The compute resource of the trials (default: the task's).")
@click.option("--name", default="", help="The tuning's name.")
@click.option("--seed", type=int, help="The sampler's seed, for a repeatable search.")
@json_option
def start(
    base_task: int,
    params: tuple[str, ...],
    objective: str,
    minimize: bool,
    objective_of: str,
    sampler: str,
    pruner: str,
    prune_after: int,
    trials: int,
    gpu_hours: float | None,
    max_time: str | None,
    concurrency: int,
    resource: str | None,
    name: str,
    seed: int | None,
    as_json: bool,
) -> None:
    """Start a tuning of BASE_TASK's parameters (`klique tune BASE_TASK ...` for short)."""
    body: dict[str, Any] = {
        "base_task": base_task,
        "params": parse_params(list(params)),
        "objective": objective,
        "direction": "minimize" if minimize else "maximize",
        "objective_mode": objective_of,
        "sampler": sampler,
        "pruner": pruner,
        "prune_after": prune_after,
        "trials": trials,
        "gpu_hours": gpu_hours,
        "max_time_s": _duration(max_time) if max_time else None,
        "concurrency": concurrency,
        "resource": resource,
        "name": name,
        "seed": seed,
    }
    made = Client().post("/tunings", body)
    if as_json:
        click.echo(json.dumps(made, indent=2))
        return
    click.echo(
        f"tuning {made['id']} started: up to {made['settings']['trials']} trials of task "
        f"{base_task} on {made['resource']}; `klique tune show {made['id']}` follows it"
    )


@tune.command("ls")
@click.option("--all", "all_users", is_flag=True, help="Everyone's tunings (admin).")
@json_option
def list_tunings(all_users: bool, as_json: bool) -> None:
    """Your tunings, newest first."""
    rows = Client().get("/tunings", all="true" if all_users else None)
    listing(
        rows if as_json else [_row(r) for r in rows],
        as_json,
        COLUMNS,
        "no tunings yet; `klique tune BASE_TASK_ID --param ... --objective ... --trials N`",
    )


@tune.command("show")
@click.argument("tuning_id", type=int)
@json_option
def show(tuning_id: int, as_json: bool) -> None:
    """A tuning: its state, best trial, and trials."""
    found = Client().get(f"/tunings/{tuning_id}")
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    settings = found["settings"]
    click.echo(
        f"tuning {found['id']} ({found['name']}) of task {found['base_task_id']}: "
        f"{found['state']}: {found['reason']}"
    )
    click.echo(
        f"  {settings['direction']} {settings['objective']} ({settings['objective_mode']}), "
        f"sampler {settings['sampler']}, pruner {settings['pruner']}, "
        f"{found['gpu_hours']:g} GPU-hours used"
    )
    best = found["best"]
    if best:
        model = best.get("model")
        made = f", model {model['name']} v{model['version']}" if model else ""
        click.echo(
            f"  best: trial {best['number']} (task {best['task_id']}) = {best['value']:g} "
            f"with {_params(best['params'])}{made}"
        )
    rows = [{**t, "params": _params(t["params"])} for t in found["trial_list"]]
    listing(rows, False, TRIAL_COLUMNS, "no trials yet")


@tune.command("stop")
@click.argument("tuning_id", type=int)
def stop(tuning_id: int) -> None:
    """Ask no more trials and cancel those running."""
    found = Client().post(f"/tunings/{tuning_id}/stop")
    click.echo(f"tuning {found['id']}: {found['state']}: {found['reason']}")


def _row(tuning: dict[str, Any]) -> dict[str, Any]:
    best = tuning["best"] or {}
    made = sum(tuning["trials"].values())
    return {
        **tuning,
        "made": f"{made}/{tuning['settings']['trials']}",
        "best_value": best.get("value"),
        "created": when(tuning["created_at"]),
    }


def _params(params: dict[str, Any]) -> str:
    return " ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()
    )


def _duration(text: str) -> int:
    try:
        return parse_duration_s(text)
    except ValueError as exc:
        raise KliqueError(f"--max-time: {exc}") from None
