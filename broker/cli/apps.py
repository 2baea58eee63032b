"""`klique app ...`: the app catalogue, launches (from flags or a JSON launch form), running apps,
locks and static routes. Thin: every command calls the API."""

from __future__ import annotations

import json
import sys
import time
import webbrowser
from pathlib import Path
from typing import Any

import click

from broker.cli.output import json_option, listing
from broker.cli.tasks import FINAL
from broker.client import ApiError, Client
from broker.quantities import parse_duration_s

INSTANCE_COLUMNS = [
    ("id", "ID"),
    ("app", "APP"),
    ("state", "STATE"),
    ("ready", "READY"),
    ("resource", "RESOURCE"),
    ("owner", "OWNER"),
    ("path", "ROUTE"),
    ("reason", "REASON"),
]


@click.group()
def app() -> None:
    """Apps: sessions (JupyterLab, a shell) and endpoints (vLLM, SGLang, any HTTP server)."""


@app.command("list")
@json_option
def list_apps(as_json: bool) -> None:
    """The app catalogue."""
    rows = Client().get("/apps")
    for row in rows:
        row["lock"] = row["lock_reason"] if row["locked"] else ""
    listing(
        rows,
        as_json,
        [("name", "APP"), ("kind", "KIND"), ("lock", "LOCKED"), ("description", "DESCRIPTION")],
        "the app catalogue is empty; the platform team adds app files to the folder that the "
        "estate's apps.catalogue names",
    )


@app.command("show")
@click.argument("name")
def show_app(name: str) -> None:
    """An app and its launch form (a JSON Schema)."""
    click.echo(json.dumps(Client().get(f"/apps/{name}"), indent=2))


def parse_params(items: tuple[str, ...]) -> dict[str, Any]:
    """NAME=VALUE pairs; a VALUE that reads as JSON (a number, a list, null) is taken as such."""
    params: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--param")
        try:
            params[key] = json.loads(value)
        except ValueError:
            params[key] = value
    return params


def read_form(path: str | None) -> dict[str, Any]:
    """The launch form a --form FILE holds (a JSON object); an empty one without it."""
    if path is None:
        return {}
    try:
        form = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise click.BadParameter(
            f"cannot read the launch form {path}: {exc}", param_hint="--form"
        ) from None
    if not isinstance(form, dict):
        raise click.BadParameter(f"{path} is not a JSON object", param_hint="--form")
    return form


def launch_options(function: Any) -> Any:
    """The launch form's flags, shared by `launch` and `export`."""
    for option in reversed(
        [
            click.option("--resource", "-r", help="The compute resource."),
            click.option(
                "--param",
                "params",
                multiple=True,
                metavar="NAME=VALUE",
                help="A launch form parameter (repeatable; JSON values are read as JSON).",
            ),
            click.option(
                "--form",
                "form_path",
                metavar="FILE",
                help="A launch form exported with `klique app export`; flags override.",
            ),
            click.option("--name", "-n", "task_name", help="A name for the task."),
            click.option("--project", "-p", help="The project it is metered to."),
            click.option("--route", help="A static route to serve behind (endpoints)."),
            click.option(
                "--team",
                "teams",
                multiple=True,
                help="A team that may call the endpoint (repeatable).",
            ),
            click.option("--walltime", help="How long it may run (default: the resource's)."),
        ]
    ):
        function = option(function)
    return function


def build_form(name: str | None, options: dict[str, Any]) -> dict[str, Any]:
    """The launch form: the file's, then the flags over it."""
    form = read_form(options.get("form_path"))
    form.setdefault("params", {})
    if name is not None:
        form["app"] = name
    if not form.get("app"):
        raise click.UsageError("name the app, or give a --form that names it")
    form["params"].update(parse_params(options.get("params") or ()))
    for key, option in (("resource",) * 2, ("name", "task_name"), ("project",) * 2, ("route",) * 2):
        if options.get(option) is not None:
            form[key] = options[option]
    if options.get("teams"):
        form["teams"] = list(options["teams"])
    if options.get("walltime"):
        try:
            form["walltime_s"] = parse_duration_s(options["walltime"])
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--walltime") from None
    return form


@app.command("launch")
@click.argument("name", required=False)
@launch_options
@click.option("--wait", is_flag=True, help="Wait until its route answers (or it ends).")
@json_option
def launch(name: str | None, wait: bool, as_json: bool, **options: Any) -> None:
    """Launch an app: klique app launch jupyter -r half-gpu [--param NAME=VALUE]..."""
    form = build_form(name, options)
    body = {k: v for k, v in form.items() if k != "app" and v is not None}
    client = Client()
    instance = client.post(f"/apps/{form['app']}/launch", body)
    if wait:
        instance = wait_ready(client, instance["id"])
    if as_json:
        click.echo(json.dumps(instance, indent=2))
        return
    click.echo(f"app {instance['app']} launched as task {instance['id']} on {instance['resource']}")
    click.echo(f"route: {instance['path']}  (in a browser: klique app open {instance['id']})")
    if wait and instance["state"] in FINAL:
        click.echo(f"it ended {instance['state']}: {instance['reason']}", err=True)
        sys.exit(1)


def wait_ready(client: Client, task_id: int, poll_s: float = 0.5) -> dict[str, Any]:
    """Until the app is ready to open (running, and its runner has had an answer from the app's
    ready path) or it ended. Meanwhile stderr says each step once, with the console's new lines,
    so that a long environment build shows its progress rather than silence."""
    said: tuple[str, str] | None = None
    offset = 0
    while True:
        instance: dict[str, Any] = client.get(f"/apps/instances/{task_id}")
        if instance["state"] in FINAL or ready_to_open(instance):
            return instance
        step = (instance["state"], instance["reason"] or "")
        if step != said:
            click.echo(f"app {instance['app']} (task {task_id}) {progress(instance)}", err=True)
            said = step
        if instance["state"] == "running":
            offset = _console_lines(client, task_id, offset)
        time.sleep(poll_s)


def ready_to_open(instance: dict[str, Any]) -> bool:
    """Its route answers: the app runs and answered its ready path through its tunnel."""
    return bool(instance["ready"]) and instance["state"] == "running"


def progress(instance: dict[str, Any]) -> str:
    """One step of a launch, as a user waits for it."""
    reason = f": {instance['reason']}" if instance.get("reason") else ""
    if instance["state"] == "running":
        return "runs: its environment is made, then the app starts; its route opens when it answers"
    return f"is {instance['state']}{reason}"


def _console_lines(client: Client, task_id: int, offset: int) -> int:
    """The console's new whole lines on stderr, indented; the offset after them."""
    try:
        chunk = client.get(f"/tasks/{task_id}/logs", offset=offset)
    except ApiError:  # the console is a courtesy while waiting: its absence ends nothing
        return offset
    text = str(chunk.get("text") or "")
    whole = text[: text.rfind("\n") + 1]
    for line in whole.splitlines():
        click.echo(f"  | {line}", err=True)
    return offset + len(whole.encode()) if whole else offset


@app.command("export")
@click.argument("name", required=False)
@launch_options
@click.option("--id", "task_id", type=int, help="The form of a launch made before (a task id).")
def export(name: str | None, task_id: int | None, **options: Any) -> None:
    """Print a launch form as JSON, to keep in git and launch again with --form."""
    client = Client()
    if task_id is not None:
        click.echo(json.dumps(client.get(f"/apps/instances/{task_id}")["form"], indent=2))
        return
    form = build_form(name, options)
    described = client.get(f"/apps/{form['app']}")
    defaults = {
        key: prop["default"]
        for key, prop in (described["form"].get("properties") or {}).items()
        if isinstance(prop, dict) and "default" in prop
    }
    form["params"] = {**defaults, **form["params"]}
    click.echo(json.dumps(form, indent=2))


@app.command("ls")
@click.option("--all", "all_users", is_flag=True, help="Everyone's apps (admin).")
@click.option("--ended", is_flag=True, help="Ended apps too.")
@json_option
def list_instances(all_users: bool, ended: bool, as_json: bool) -> None:
    """Your running apps and their routes."""
    rows = Client().get("/apps/instances", all_users=all_users or None, ended=ended or None)
    none = "no apps are running" + (" or ended" if ended else "")
    listing(rows, as_json, INSTANCE_COLUMNS, f"{none}; start one with `klique app launch NAME`")


@app.command("open")
@click.argument("target")
@click.option("--browser", is_flag=True, help="Open the address in this machine's web browser.")
def open_route(target: str, browser: bool) -> None:
    """An app's route in a browser: prints a one-time address (good once, for 60 s) that signs
    the browser in to that route only, as you. TARGET: the app's task id or its route's name."""
    client = Client()
    name = target
    if target.isdigit():
        path = str(client.get(f"/apps/instances/{target}").get("path") or "")
        name = path[len("/routes/") :].strip("/")  # str.removeprefix is Python 3.9+
        if not path.startswith("/routes/") or not name:
            raise click.ClickException(f"task {target} has no route; `klique app ls` lists apps")
    made = client.post(f"/routes/{name}/code")
    click.echo(made["url"])
    click.echo(
        f"(good once, within {made['expires_in_s']} s: run this again for another)", err=True
    )
    if browser:
        webbrowser.open(made["url"])


@app.command("stop")
@click.argument("task_ids", type=int, nargs=-1, required=True)
def stop(task_ids: tuple[int, ...]) -> None:
    """Stop apps: their routes finish what is in flight, then their compute resources are freed."""
    client = Client()
    for task_id in task_ids:
        instance = client.post(f"/apps/instances/{task_id}/stop")
        click.echo(f"app {instance['app']} (task {instance['id']}) {instance['state']}")


@app.command("lock")
@click.argument("name")
@click.option("--reason", required=True, help="What users read when a launch is refused.")
def lock(name: str, reason: str) -> None:
    """(admin) Refuse new launches of an app."""
    Client().call("PUT", f"/apps/{name}/lock", json={"reason": reason})
    click.echo(f"app {name} locked: {reason}")


@app.command("unlock")
@click.argument("name")
def unlock(name: str) -> None:
    """(admin) Let an app be launched again."""
    Client().call("DELETE", f"/apps/{name}/lock")
    click.echo(f"app {name} unlocked")


@app.command("routes")
@json_option
def routes(as_json: bool) -> None:
    """The static routes, and the instances behind each."""
    listing(
        Client().get("/routes"),
        as_json,
        [
            ("name", "ROUTE"),
            ("teams", "TEAMS"),
            ("apps", "APPS"),
            ("instances", "INSTANCES"),
            ("ready", "READY"),
            ("path", "PATH"),
        ],
        "no static routes; an admin makes one with `klique app route create NAME`",
    )


@app.group("route")
def route() -> None:
    """(admin) Make and remove static routes."""


@route.command("create")
@click.argument("name")
@click.option("--team", "teams", multiple=True, help="A team that may call it (repeatable).")
@click.option("--app", "apps", multiple=True, help="An app that may serve it (default: any).")
def route_create(name: str, teams: tuple[str, ...], apps: tuple[str, ...]) -> None:
    made = Client().post("/routes", {"name": name, "teams": list(teams), "apps": list(apps)})
    click.echo(f"route {made['name']} created: {made['path']}")


@route.command("delete")
@click.argument("name")
def route_delete(name: str) -> None:
    Client().call("DELETE", f"/routes/{name}")
    click.echo(f"route {name} deleted")
