"""The platform team's commands: the estate, batch templates, tokens, usage, policy dry runs."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from broker import config
from broker.cli_output import json_option, table, when
from broker.client import Client
from broker.domain import Estate
from broker.errors import KliqueError
from broker.names import AGENT_ID_PREFIX


@click.group()
def estate() -> None:
    """Check the estate file."""


@estate.command("check")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option(
    "--file-only",
    is_flag=True,
    help="Check the file alone, not the pools from this host (job roots, accounts, Python).",
)
def estate_check(path: str, file_only: bool) -> None:
    """Validate an estate file; every problem names the file, the line, the field and the fix.
    Then check each pool from this host as the server would at start."""
    from broker.estate import load_estate

    loaded = load_estate(path)
    problems = [] if file_only else asyncio.run(_pool_problems(loaded))
    for problem in problems:
        click.echo(f"{path}: {problem}", err=True)
    if problems:
        sys.exit(2)
    click.echo(
        f"{path}: ok ({len(loaded.resources)} compute resources, {len(loaded.pools)} pools, "
        f"{len(loaded.policies)} policies, {len(loaded.teams)} teams)"
    )
    for line in _templates_used(loaded):
        click.echo(line)


def _templates_used(estate: Estate) -> list[str]:
    """Which template file each compute resource's script comes from, on each batch pool."""
    from broker.pools.base import Context
    from broker.pools.batch import BatchDriver
    from broker.pools.registry import make_driver

    context = Context(estate, config.home(), Path("klique-runner.pyz"), None)
    lines = []
    for name, resource in estate.resources.items():
        for pool_name in resource.profile.pools:
            pool = estate.pools[pool_name]
            if not pool.queueing:
                continue
            driver = make_driver(pool, context)
            assert isinstance(driver, BatchDriver)
            try:
                where = str(driver.template(name).path)
            except KliqueError as exc:
                where = f"none: {exc}"
            lines.append(f"template for {name} on {pool_name}: {where}")
    return lines


async def _pool_problems(estate: Estate) -> list[str]:
    """The pools' own start-up checks, run from here: job roots, interpreters, accounts."""
    from broker.pools.base import Context
    from broker.pools.registry import make_driver

    if os.geteuid() != 0:
        click.echo(
            "note: the pools' checks (job roots, accounts, interpreters) act as the mapped "
            "accounts and need root; run `klique estate check` as root (or the server's account) "
            "on the login node to include them"
        )
        return []
    context = Context(estate, config.home(), Path("klique-runner.pyz"), None)
    problems: list[str] = []
    for name, pool in estate.pools.items():
        if not pool.queueing and not pool.user_map.maps_anyone:
            continue  # a single-user pool: which account it serves is the server's own
        driver = make_driver(pool, context)
        try:
            found = await asyncio.wait_for(driver.check(), 30)
        except (KliqueError, TimeoutError) as exc:
            click.echo(f"note: pool {name} could not be checked from here: {exc}")
            found = []
        finally:
            await driver.close()
        for note in driver.notes:
            click.echo(f"note: pool {name}: {note}")
        problems += [f"pools.{name}: {problem}" for problem in found]
    return problems


@click.group()
def token() -> None:
    """Tokens for users, service users (CI, bots) and pool agents: make, list, revoke."""


@token.command("create")
@click.argument("user", required=False)
@click.option("--service", metavar="NAME", help="A service user (CI, a bot) of --team.")
@click.option("--team", help="The service user's team: its runs count there.")
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    type=click.Choice(["submit", "read"]),
    help="What the token may do (repeatable; default both). read: look only; submit: submit "
    "and cancel.",
)
@click.option("--expires", metavar="DURATION", help="Expire after 30d, 12h, ... (default: never).")
@click.option("--admin", is_flag=True, help="Make an admin token.")
@json_option
def token_create(
    user: str | None,
    service: str | None,
    team: str | None,
    scopes: tuple[str, ...],
    expires: str | None,
    admin: bool,
    as_json: bool,
) -> None:
    """Print a new token for USER, or for the service user --service NAME (admin only)."""
    from broker.units import parse_duration_s

    if bool(user) == bool(service):
        raise click.UsageError("give either USER or --service NAME")
    body: dict[str, Any] = {"user": user or service, "admin": admin, "service": bool(service)}
    if team:
        body["team"] = team
    if scopes:
        body["scopes"] = sorted(set(scopes))
    if expires:
        try:
            body["expires_in"] = parse_duration_s(expires)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--expires") from None
    made = Client().post("/tokens", body)
    click.echo(json.dumps(made, indent=2) if as_json else made["token"])


@token.command("ls")
@json_option
def token_ls(as_json: bool) -> None:
    """List tokens: everyone's and the pool agents' with an admin token, else your own (never
    the tokens)."""
    client = Client()
    rows = client.get("/tokens")
    if client.get("/whoami")["admin"]:
        rows += client.get("/agent-tokens")
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    now = time.time()
    for row in rows:
        row["expires"] = when(row["expires_at"]) if row["expires_at"] else "never"
        row["last_used"] = when(row["last_used_at"]) if row["last_used_at"] else "never"
        row["state"] = _token_state(row, now)
    table(
        rows,
        [
            ("id", "ID"),
            ("kind", "KIND"),
            ("user", "USER"),
            ("team", "TEAM"),
            ("scopes", "SCOPES"),
            ("pools", "POOLS"),
            ("expires", "EXPIRES"),
            ("last_used", "LAST USED"),
            ("state", "STATE"),
        ],
    )


def _token_state(row: dict[str, Any], now: float) -> str:
    if row["revoked"]:
        return "revoked"
    return "expired" if row["expires_at"] and row["expires_at"] <= now else "in force"


@token.command("revoke")
@click.argument("token_ids", nargs=-1, required=True)
def token_revoke(token_ids: tuple[str, ...]) -> None:
    """Revoke tokens by id (`klique token ls` shows them): yours, or any with an admin token;
    an agent token (agent-...) with an admin token. A revoked token is refused at its next
    use."""
    client = Client()
    for token_id in token_ids:
        if token_id.startswith(AGENT_ID_PREFIX):
            done = client.post(f"/agent-tokens/{token_id}/revoke")
            click.echo(f"agent token {done['id']} of pools {', '.join(done['pools'])} revoked")
            continue
        done = client.post(f"/tokens/{token_id}/revoke")
        click.echo(f"token {done['id']} of {done['user']} revoked")


@token.command("create-agent")
@click.option("--pool", "pools", multiple=True, required=True, help="A pool it serves.")
@click.option(
    "--expires",
    metavar="DURATION",
    default="90d",
    show_default=True,
    help="Expire after 30d, 12h, ... (at most 366d).",
)
@json_option
def token_create_agent(pools: tuple[str, ...], expires: str, as_json: bool) -> None:
    """Print a new token for `klique agent`: it may act only for these pools (declared
    `agent: remote`) until it expires or is revoked (`klique token ls` shows its id)."""
    from broker.units import parse_duration_s

    try:
        expires_in = parse_duration_s(expires)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--expires") from None
    made = Client().post("/agent-tokens", {"pools": list(pools), "expires_in": expires_in})
    click.echo(json.dumps(made, indent=2) if as_json else made["token"])


@click.command()
@click.option("--pool", help="The pool to serve (declared `agent: remote`).")
@click.option("--server", help="The control plane's URL.")
@click.option(
    "--install-helper",
    "helper_path",
    type=click.Path(dir_okay=False),
    help="Install the helper program a sudo transport runs (root-owned, mode 755) and exit.",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, exists=True),
    help="A file holding the agent token (default: $KLIQUE_AGENT_TOKEN).",
)
def agent(
    pool: str | None, server: str | None, token_file: str | None, helper_path: str | None
) -> None:
    """Serve one pool from its login node: submit, follow and report its tasks."""
    import logging

    from broker.agent import install_helper, serve_pool

    if helper_path:
        click.echo(f"installed {install_helper(Path(helper_path))}")
        return
    if not pool or not server:
        raise KliqueError("give --pool NAME and --server URL (or --install-helper PATH)")
    token = (
        Path(token_file).read_text().strip() if token_file else os.environ.get("KLIQUE_AGENT_TOKEN")
    )
    if not token:
        raise KliqueError(
            "no agent token; fix: make one with `klique token create-agent --pool "
            f"{pool}` and pass it with --token-file FILE or $KLIQUE_AGENT_TOKEN"
        )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    asyncio.run(serve_pool(pool, server, token, config.home()))


@click.group()
def template() -> None:
    """Preview the batch scripts Klique submits."""


@template.command("render")
@click.option("--resource", "-r", required=True, help="The compute resource.")
@click.option("--pool", help="The pool (default: the first batch pool in the profile's order).")
@click.option("--task", "task_id", type=int, help="Render for this task (fetched from the API).")
@click.option(
    "--spec",
    "spec_file",
    type=click.Path(exists=True, dir_okay=False),
    help="Render for a task spec in a JSON file (command, name, env, ...).",
)
@click.option("--owner", help="The Klique user to render for (default: the first mapped user).")
@click.option(
    "--estate",
    "estate_path",
    type=click.Path(dir_okay=False),
    help="The estate file (default: $KLIQUE_HOME/estate.yaml).",
)
@click.option(
    "--check",
    is_flag=True,
    help="Also run bash -n and, where the pool is reachable, the scheduler's test-only submission.",
)
def template_render(
    resource: str,
    pool: str | None,
    task_id: int | None,
    spec_file: str | None,
    owner: str | None,
    estate_path: str | None,
    check: bool,
) -> None:
    """Print the exact script that would be submitted."""
    from dataclasses import replace

    from broker.domain import spec_from_dict
    from broker.estate import load_estate
    from broker.preview import render_preview, sample_task

    estate_file = Path(estate_path) if estate_path else config.home() / "estate.yaml"
    loaded = load_estate(estate_file)
    task = sample_task(loaded, resource, owner)
    if task_id is not None:
        shown = Client().get(f"/tasks/{task_id}")
        task = replace(
            task,
            id=task_id,
            owner=shown["owner"],
            spec=replace(
                task.spec,
                command=tuple(shown["command"]),
                name=shown["name"],
                project=shown["project"],
            ),
        )
    elif spec_file is not None:
        data = json.loads(Path(spec_file).read_text())
        task = replace(task, spec=spec_from_dict({"resource": resource, **data}))
    preview = render_preview(loaded, task, pool, check)
    click.echo(preview.script, nl=False)
    for line in preview.checks:
        click.echo(f"# {line}", err=True)
    if not preview.ok:
        sys.exit(1)


@click.command()
@click.option(
    "--by",
    type=click.Choice(["team", "project", "user", "pool", "resource"]),
    default="team",
    show_default=True,
    help="What to sum the runs by.",
)
@click.option(
    "--since",
    metavar="WHEN",
    help="Only use from then on: 7d, 12h, 30m ago, a date (2026-11-01), or Unix seconds.",
)
@json_option
def usage(by: str, since: str | None, as_json: bool) -> None:
    """GPU-seconds and wall time from the ledger (yours; everyone's with an admin token)."""
    from broker.usage import parse_since

    start = None
    if since is not None:
        try:
            start = parse_since(since, time.time())
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--since") from None
    answer = Client().get("/usage", by=by, since=start)
    if as_json:
        click.echo(json.dumps(answer, indent=2))
        return
    rows = answer["rows"]
    for row in rows:
        row["gpu_seconds"] = f"{row['gpu_seconds']:.1f}"
        row["gpu_hours"] = f"{row['gpu_hours']:.3f}"
        row["wall_seconds"] = f"{row['wall_seconds']:.1f}"
    window = f"since {when(answer['since'])}" if answer["since"] is not None else "all time"
    whose = "everyone" if answer["everyone"] else "your runs only"
    click.echo(f"usage by {by}, {window} until {when(answer['until'])} ({whose})")
    table(
        rows,
        [
            ("key", by.upper()),
            ("runs", "RUNS"),
            ("ongoing", "ONGOING"),
            ("gpu_seconds", "GPU-SECONDS"),
            ("gpu_hours", "GPU-HOURS"),
            ("wall_seconds", "WALL-SECONDS"),
        ],
    )


@click.group()
def policy() -> None:
    """Try a changed estate before it goes live."""


@policy.command("simulate")
@click.option(
    "--estate",
    "estate_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="The changed estate file.",
)
@click.option(
    "--trace",
    "trace_path",
    type=click.Path(dir_okay=False),
    help="Replay this recorded JSON trace here instead of the server's current queue.",
)
@click.option(
    "--save-trace",
    "save_path",
    type=click.Path(dir_okay=False, writable=True),
    help="Also write the server's queue, active tasks and pool states here, for --trace.",
)
@json_option
def policy_simulate(
    estate_path: str, trace_path: str | None, save_path: str | None, as_json: bool
) -> None:
    """Say what would start where, and who would wait, if NEW.yaml were the estate now."""
    from broker.estate import parse_estate
    from broker.simulate import parse_trace, simulate

    text = _read_text(estate_path, "estate file")
    new = parse_estate(text, estate_path)  # file:line errors before anything else happens
    if trace_path is not None:
        if save_path is not None:
            raise click.UsageError("--save-trace records a server's queue; drop it with --trace")
        trace = parse_trace(_read_text(trace_path, "trace"), trace_path)
        answer = simulate(new, trace.queued, trace.active, trace.pools, trace.usage, trace.now)
        result = answer.to_dict()
    else:
        body = {"estate": text, "source": estate_path, "include_trace": save_path is not None}
        result = Client().post("/policy/simulate", body)
        if save_path is not None:
            Path(save_path).write_text(json.dumps(result.pop("trace"), indent=2) + "\n")
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    _show_simulation(result, estate_path, trace_path)
    if save_path is not None:
        click.echo(f"trace written to {save_path} (replay it with --trace {save_path})")


def _read_text(path: str, what: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise KliqueError(f"{path}: cannot read the {what}: {exc.strerror}") from exc


def _show_simulation(result: dict[str, Any], estate_path: str, trace_path: str | None) -> None:
    source = f"the trace {trace_path}" if trace_path else "the server's current queue"
    click.echo(
        f"one placement cycle under {estate_path}, over {source} "
        f"({result['queued']} queued, {result['active']} active):"
    )
    for task in result["tasks"]:
        who = f"{task['owner']}, {task['team'] or '(no team)'}, {task['resource']}"
        click.echo(f"  task {task['id']} ({who}): {task['sentence']}")
        for pool, why in task["pools"].items():
            click.echo(f"      {pool}: {why}")
    for key, words in (
        ("preempted", "would be preempted to hand a reservation back"),
        ("withdrawn", "would be withdrawn from its pool's queue (spill-over)"),
    ):
        for task_id in result[key]:
            click.echo(f"  active task {task_id} {words}")
    if result["assumed_pools"]:
        click.echo(
            "  no recorded state for pools "
            + ", ".join(result["assumed_pools"])
            + ": taken as reachable, with nothing free beyond what Klique counts itself"
        )
    click.echo("by team:")
    rows = [
        {
            **team,
            "pools": ", ".join(f"{p}: {n}" for p, n in team["pools"].items()) or "-",
            "reasons": ", ".join(f"{r}: {n}" for r, n in team["reasons"].items()) or "-",
        }
        for team in result["teams"]
    ]
    table(
        rows,
        [
            ("team", "TEAM"),
            ("tasks", "TASKS"),
            ("start", "START"),
            ("wait", "WAIT"),
            ("pools", "WHERE"),
            ("reasons", "WHY WAITING"),
        ],
    )
