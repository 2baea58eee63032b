"""The platform team's commands: the server and a login node's agent, the estate file, batch
templates, usage and policy dry runs. The server stack (the estate's pool settings, the pools'
drivers, the server itself) is loaded by the command that needs it: the CLI runs without it."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from broker import config
from broker.cli.output import json_option, table, when
from broker.client import Client
from broker.domain import Estate, spec_from_dict
from broker.errors import KliqueError
from broker.helper_install import install_helper
from broker.usage import parse_since

# Klique never runs a task as root, and the built-in pool has no user map to run it as anyone
# else: said at start, not discovered by the first task that waits for ever.
ROOT_WITHOUT_ESTATE = (
    "the server runs as root without an estate, and the built-in pool runs no task as root, "
    "so every task would wait; fix: give --estate a file whose pool maps users to an ordinary "
    "account (user_map, job_root), or run `klique demo`, which makes such an account and estate"
)

# `klique server` and `klique agent` alike (broker/logs.py).
log_format_option = click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one JSON object a line on standard error for each event (time, level, logger, "
    "message, and its task_id and pool where it has them), for a log shipper.",
)


@click.command()
@click.option(
    "--estate",
    "estate_path",
    type=click.Path(dir_okay=False),
    help="The estate file (default: $KLIQUE_HOME/estate.yaml if present, else one "
    "host pool on this machine).",
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=config.DEFAULT_PORT, show_default=True, type=int)
@click.option(
    "--routes-port",
    type=int,
    help="The port that serves routes (apps' pages), an origin apart from the UI's and API's "
    "(default: --port + 1).",
)
@click.option(
    "--routes-domain",
    metavar="DOMAIN",
    help="A wildcard DNS domain: route NAME is served at NAME.DOMAIN (a host of its own per "
    "route, on the routes port). Without it, all routes share the routes port's origin.",
)
@click.option(
    "--routes-url",
    metavar="URL",
    help="The routes' public address where a proxy (TLS) serves the routes port, `*` standing "
    "for the route's name: https://*.routes.example.org (default: from the options above).",
)
@click.option(
    "--forwarded-allow-ips",
    metavar="ADDRESSES",
    help="The reverse proxies (comma-separated addresses) whose X-Forwarded-For and "
    "X-Forwarded-Proto are believed. Default: none; every caller's address is its socket's, "
    "so login throttles count real addresses.",
)
@click.option(
    "--public-url",
    metavar="URL",
    help="The URL that jobs, pods, agents and browsers use to reach this server, when it is "
    "not the bind address: http://klique.example.org:8765 (default: the estate's "
    "server.public_url, else http://HOST:PORT). Required while any pool's nodes are not "
    "this host and the bind address is loopback or 0.0.0.0.",
)
@click.option(
    "--tls-cert",
    metavar="FILE",
    help="Serve HTTPS on both listeners with this certificate (PEM, chain included); needs "
    "--tls-key. Default: plain HTTP (behind a proxy that serves TLS, say).",
)
@click.option("--tls-key", metavar="FILE", help="The private key (PEM) of --tls-cert.")
@click.option(
    "--replica-id",
    metavar="ID",
    help="This server's name among replicas on one PostgreSQL store, shown by /readyz "
    "(default: HOST:PORT).",
)
@click.option(
    "--lease-ttl",
    type=click.FloatRange(min=2.0, max=300.0),
    default=8.0,
    show_default=True,
    help="Seconds the scheduler's lease holds unrenewed: with replicas, another takes over "
    "within about this long after the leader dies or is cut from the database.",
)
@log_format_option
def server(
    estate_path: str | None,
    host: str,
    port: int,
    routes_port: int | None,
    routes_domain: str | None,
    routes_url: str | None,
    forwarded_allow_ips: str | None,
    public_url: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    replica_id: str | None,
    lease_ttl: float,
    log_format: str,
) -> None:
    """Run the API, the scheduler and the pool agents in this process (with replicas on one
    PostgreSQL store, the scheduler and the agents run in one replica at a time)."""
    from broker.estate import builtin_estate, load_estate  # the server extra is optional
    from broker.logs import log_json  # the server extra is optional
    from broker.server import serve, tls_files  # the server extra is optional

    if log_format == "json":
        log_json()
    try:
        tls = tls_files(tls_cert, tls_key)
    except ValueError as exc:
        raise SystemExit(f"klique: {exc}") from None

    home = config.home()
    default = home / "estate.yaml"
    if estate_path is None and default.exists():
        estate_path = str(default)
    estate = load_estate(estate_path) if estate_path else builtin_estate()
    if estate_path is None and os.geteuid() == 0:
        click.echo(f"klique: {ROOT_WITHOUT_ESTATE}", err=True)
    serve(
        estate,
        home,
        config.store_url(),
        host,
        port,
        routes_port,
        routes_domain,
        routes_url,
        trusted_proxies=forwarded_allow_ips,
        public=public_url,
        tls=tls,
        json_logs=log_format == "json",
        replica=replica_id,
        lease_ttl_s=lease_ttl,
    )


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
@log_format_option
def agent(
    pool: str | None,
    server: str | None,
    token_file: str | None,
    helper_path: str | None,
    log_format: str,
) -> None:
    """Serve one pool from its login node: submit, follow and report its tasks."""
    if helper_path:  # the helper is standard-library Python: no server extra needed for it
        click.echo(f"installed {install_helper(Path(helper_path))}")
        return
    from broker.agents.remote import serve_pool  # the server extra is optional
    from broker.logs import log_json  # the server extra is optional

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
    if log_format == "json":
        log_json()
    else:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    asyncio.run(serve_pool(pool, server, token, config.home()))


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
    from broker.estate import load_estate  # the server extra is optional

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
    """Which template file each compute resource's script comes from, on each batch pool
    (a Kubernetes pool's pod template is checked with the pool's own checks instead)."""
    from broker.pools.base import Context  # the server extra is optional
    from broker.pools.batch import BatchDriver  # the server extra is optional
    from broker.pools.registry import make_driver  # the server extra is optional

    context = Context(estate, config.home(), Path("klique-runner.pyz"), None)
    lines = []
    for name, resource in estate.resources.items():
        for pool_name in resource.profile.pools:
            pool = estate.pools[pool_name]
            if not pool.queueing:
                continue
            driver = make_driver(pool, context)
            if not isinstance(driver, BatchDriver):
                continue
            try:
                where = str(driver.template(name).path)
            except KliqueError as exc:
                where = f"none: {exc}"
            lines.append(f"template for {name} on {pool_name}: {where}")
    return lines


async def _pool_problems(estate: Estate) -> list[str]:
    """The pools' own start-up checks, run from here: job roots, interpreters, accounts."""
    from broker.pools.base import Context  # the server extra is optional
    from broker.pools.registry import make_driver  # the server extra is optional

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
    from broker.estate import load_estate  # the server extra is optional
    from broker.preview import render_preview, sample_task  # the server extra is optional

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
    from broker.estate import parse_estate  # the server extra is optional
    from broker.scheduler.simulate import parse_trace, simulate  # a local run only

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
    """A file the command was given; one that cannot be read is the user's error, named."""
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise KliqueError(f"{path}: cannot read the {what}: {exc.strerror}") from exc


def _show_simulation(result: dict[str, Any], estate_path: str, trace_path: str | None) -> None:
    """A simulation for people: each task's fate and why, then a table by team."""
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
