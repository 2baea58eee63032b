#!/usr/bin/env python3
"""Klique in CI: submit a training run with the `klique` CLI and wait for it, post its final
scalars on the pull (merge) request as a table with the change against the base branch's last
run, and fail when a named scalar got worse than a threshold.

The GitHub Action (integrations/github/action.yml) and the GitLab CI template
(integrations/gitlab/klique.gitlab-ci.yml) run it; it needs Python 3.8+ and the `klique` CLI,
nothing else. The Klique token (a service user's, `klique token create --service ...`) comes
from KLIQUE_TOKEN, the server from KLIQUE_API.

  klique_ci.py submit [--resource R] [--project P] [--env K=V]... [--no-code]
                      (-- CMD ARGS... | --command-line "CMD ARGS")
  klique_ci.py report [--task ID]
  klique_ci.py check --scalar NAME [--higher-is-better] [--worse-by 5%|0.01] [--min X] [--max X]

Runs are named `ci:<branch>:<commit>`, so the base branch's last completed run is found among
the service user's own tasks. `submit` keeps the task's id in klique-ci.json ($RUNNER_TEMP,
else the current folder; or $KLIQUE_CI_STATE) for `report` and `check`; a run that an event
does not start (an untrusted comment) is noted there, and they do nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

FINAL = {"completed", "failed", "cancelled", "timeout", "lost"}
TRUSTED = {"OWNER", "MEMBER", "COLLABORATOR"}  # who may start a run with a comment (GitHub)


class CiError(Exception):
    """What went wrong, in words for the CI log; the step fails."""


# Where the job runs: the branch, its base, the pull request and how to comment on it.


@dataclass
class Change:
    forge: str  # github, gitlab, or "" (elsewhere: no comments)
    branch: str
    commit: str
    base: Optional[str] = None  # the branch a pull/merge request goes into
    number: Optional[int] = None  # the pull request's number, the merge request's iid
    skip: str = ""  # why this event starts no run (a comment from someone untrusted...)


def github_change(env: Dict[str, str]) -> Change:
    event_name = env.get("GITHUB_EVENT_NAME", "push")
    payload = (
        json.loads(Path(env["GITHUB_EVENT_PATH"]).read_text())
        if env.get("GITHUB_EVENT_PATH")
        else {}
    )
    commit, branch = env.get("GITHUB_SHA", ""), env.get("GITHUB_REF_NAME", "")
    if event_name in ("pull_request", "pull_request_target"):
        pull = payload["pull_request"]
        return Change(
            "github", pull["head"]["ref"], pull["head"]["sha"], pull["base"]["ref"], pull["number"]
        )
    if event_name == "issue_comment":
        return _github_comment(env, payload)
    return Change("github", branch, commit)


def _github_comment(env: Dict[str, str], payload: Dict[str, Any]) -> Change:
    comment, issue = payload.get("comment") or {}, payload.get("issue") or {}
    trigger = env.get("KLIQUE_CI_TRIGGER", "/klique train")
    skip = ""
    if not issue.get("pull_request"):
        skip = "the comment is on an issue, not on a pull request"
    elif not str(comment.get("body", "")).strip().startswith(trigger):
        skip = f"the comment does not start with {trigger!r}"
    elif comment.get("author_association") not in TRUSTED:
        skip = (
            f"{comment.get('user', {}).get('login', 'someone')} is not an owner, member or "
            "collaborator of the repository: their comments start no run"
        )
    if skip:
        return Change("github", "", "", skip=skip)
    pull = forge_call(
        env, "github", "GET", f"/repos/{env['GITHUB_REPOSITORY']}/pulls/{issue['number']}"
    )
    return Change(
        "github", pull["head"]["ref"], pull["head"]["sha"], pull["base"]["ref"], issue["number"]
    )


def gitlab_change(env: Dict[str, str]) -> Change:
    iid = env.get("CI_MERGE_REQUEST_IID")
    return Change(
        "gitlab",
        env.get("CI_MERGE_REQUEST_SOURCE_BRANCH_NAME") or env.get("CI_COMMIT_REF_NAME", ""),
        env.get("CI_COMMIT_SHA", ""),
        env.get("CI_MERGE_REQUEST_TARGET_BRANCH_NAME") or None,
        int(iid) if iid else None,
    )


def current_change(env: Dict[str, str]) -> Change:
    if env.get("GITHUB_ACTIONS") == "true":
        return github_change(env)
    if env.get("GITLAB_CI") == "true":
        return gitlab_change(env)
    return Change("", env.get("KLIQUE_CI_BRANCH", "local"), env.get("KLIQUE_CI_COMMIT", ""))


def run_name(change: Change) -> str:
    return f"ci:{change.branch}:{change.commit[:12]}"


# The forges' REST APIs (GitHub: docs.github.com/rest; GitLab: docs.gitlab.com/ee/api/notes.html)


def forge_call(
    env: Dict[str, str], forge: str, method: str, path: str, body: Optional[Dict[str, Any]] = None
) -> Any:
    if forge == "github":
        base = env.get("GITHUB_API_URL", "https://api.github.com")
        token = env.get("GITHUB_TOKEN") or ""
        headers = {
            "Authorization": f"Bearer {token}",
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": "2022-11-28",
        }
    else:
        base = env.get("CI_API_V4_URL", "https://gitlab.com/api/v4")
        headers = {"PRIVATE-TOKEN": env.get("KLIQUE_GITLAB_TOKEN", "")}
    data = json.dumps(body).encode() if body is not None else None
    if data is not None:
        headers["Content-Type"] = "application/json"
    if not base.startswith(("https://", "http://")):
        raise CiError(f"the {forge} API URL {base!r} is not http(s)")
    url = base.rstrip("/") + path
    request = urllib.request.Request(url, data=data, headers=headers, method=method)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310
            text = answer.read().decode()
    except urllib.error.HTTPError as exc:
        raise CiError(
            f"{forge} answered {exc.code} to {method} {path}: {exc.read().decode()[:300]}"
        ) from None
    except urllib.error.URLError as exc:
        raise CiError(f"cannot reach the {forge} API at {base}: {exc.reason}") from None
    return json.loads(text) if text else None


def post_or_update(env: Dict[str, str], change: Change, marker: str, text: str) -> None:
    """One comment per project on the request, updated on every run rather than repeated."""
    if change.forge == "github":
        where = f"/repos/{env['GITHUB_REPOSITORY']}/issues"
        found = forge_call(env, "github", "GET", f"{where}/{change.number}/comments?per_page=100")
        mine = [c for c in found if marker in c.get("body", "")]
        if mine:
            forge_call(env, "github", "PATCH", f"{where}/comments/{mine[-1]['id']}", {"body": text})
        else:
            forge_call(env, "github", "POST", f"{where}/{change.number}/comments", {"body": text})
        return
    notes = f"/projects/{env['CI_PROJECT_ID']}/merge_requests/{change.number}/notes"
    found = forge_call(env, "gitlab", "GET", f"{notes}?per_page=100")
    mine = [n for n in found if marker in n.get("body", "")]
    if mine:
        forge_call(env, "gitlab", "PUT", f"{notes}/{mine[-1]['id']}", {"body": text})
    else:
        forge_call(env, "gitlab", "POST", notes, {"body": text})


# Klique, through its CLI


def klique(*args: str) -> Any:
    done = subprocess.run(["klique", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise CiError(
            f"klique {' '.join(args[:2])} failed: {done.stderr.strip() or done.stdout.strip()}"
        )
    return json.loads(done.stdout) if "--json" in args else done.stdout


def wait(task_id: int, poll_s: float) -> Dict[str, Any]:
    last = ""
    while True:
        task = klique("show", str(task_id), "--json")
        if task["state"] != last:
            last = task["state"]
            print(f"task {task_id}: {last} {task['reason']}".rstrip(), flush=True)
        if task["state"] in FINAL:
            return task
        time.sleep(poll_s)


def final_scalars(task: Dict[str, Any]) -> Dict[str, float]:
    """Each scalar's last value (by step, then time)."""
    found: Dict[str, Tuple[Tuple[float, float], float]] = {}
    for s in task.get("scalars") or []:
        key = (float(s["step"] if s["step"] is not None else -1), float(s["time"]))
        if s["name"] not in found or key >= found[s["name"]][0]:
            found[s["name"]] = (key, float(s["value"]))
    return {name: value for name, (_, value) in found.items()}


def base_run(base: str, project: Optional[str]) -> Optional[Dict[str, Any]]:
    """The base branch's last completed run of this project, among this user's tasks."""
    tasks = klique("ls", "--json", "--state", "completed", "--limit", "1000")
    for task in tasks:  # newest first
        if task["name"].startswith(f"ci:{base}:") and (
            project is None or task["project"] == project
        ):
            return klique("show", str(task["id"]), "--json")
    return None


# The commands


def submit(args: argparse.Namespace, env: Dict[str, str]) -> int:
    change = current_change(env)
    if change.skip:
        print(f"klique: no run: {change.skip}")
        save_state(env, {"skipped": change.skip})
        return 0
    command = shlex.split(args.command_line) if args.command_line else args.command
    if not command:
        raise CiError("no command to run: give one after --, or --command-line")
    argv = ["submit", "--json", "--project", args.project, "--name", run_name(change)]
    if args.resource:
        argv += ["--resource", args.resource]
    for item in args.env:
        argv += ["--env", item]
    if args.no_code:
        argv.append("--no-code")
    task = klique(*argv, "--", *command)
    who = f"{task['owner']} (team {task['team']})"
    print(f"klique: task {task['id']} queued on {task['resource']} as {who}")
    save_state(env, {"task": task["id"], "project": args.project, "change": change.__dict__})
    outputs(env, {"task-id": str(task["id"])})
    if not args.wait:
        return 0
    task = wait(task["id"], args.poll)
    print(klique("logs", str(task["id"])), end="")
    outputs(env, {"state": task["state"]})
    print(f"klique: task {task['id']} {task['state']}")
    return 0 if task["state"] == "completed" else 1


def report(args: argparse.Namespace, env: Dict[str, str]) -> int:
    state = load_state(env)
    if state.get("skipped"):
        return 0
    task = klique("show", str(args.task or state["task"]), "--json")
    change = Change(**state["change"])
    base = base_run(change.base, state["project"]) if change.base else None
    text = table(task, base, change, state["project"])
    print(text)
    if change.forge and change.number is not None:
        post_or_update(env, change, marker(state["project"]), text)
        print(f"klique: posted on {change.forge} request {change.number}")
    return 0


def marker(project: str) -> str:
    return f"<!-- klique-ci:{project} -->"


def table(
    task: Dict[str, Any], base: Optional[Dict[str, Any]], change: Change, project: str
) -> str:
    mine = final_scalars(task)
    theirs = final_scalars(base) if base else {}
    against = f"{change.base} (#{base['id']})" if base else (change.base or "base")
    lines = [
        marker(project),
        f"**Klique run #{task['id']}** ({task['state']}, `{task['resource']}`, project {project})",
        "",
        f"| scalar | this run | {against} | change |",
        "|---|---|---|---|",
    ]
    for name in sorted(mine):
        value, old = mine[name], theirs.get(name)
        lines.append(f"| {name} | {value:.4g} | {_cell(old)} | {_delta(value, old)} |")
    if not mine:
        lines.append("| (no scalars reported) | | | |")
    if not base:
        lines += [
            "",
            f"No completed run of `{change.base}` to compare with." if change.base else "",
        ]
    return "\n".join(lines).rstrip() + "\n"


def _cell(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.4g}"


def _delta(value: float, old: Optional[float]) -> str:
    if old is None:
        return "new"
    diff = value - old
    relative = f" ({diff / old:+.1%})" if old else ""
    return f"{diff:+.4g}{relative}"


def check(args: argparse.Namespace, env: Dict[str, str]) -> int:
    state = load_state(env)
    if state.get("skipped"):
        return 0
    task = klique("show", str(args.task or state["task"]), "--json")
    value = final_scalars(task).get(args.scalar)
    if value is None:
        return fail(env, f"the run reported no scalar {args.scalar!r}")
    sign = 1.0 if args.higher_is_better else -1.0  # how "better" moves
    problems = []
    if args.min is not None and value < args.min:
        problems.append(f"{args.scalar} is {value:.4g}, under the minimum {args.min:g}")
    if args.max is not None and value > args.max:
        problems.append(f"{args.scalar} is {value:.4g}, over the maximum {args.max:g}")
    change = Change(**state["change"])
    if args.worse_by is not None and change.base:
        base = base_run(change.base, state["project"])
        old = final_scalars(base).get(args.scalar) if base else None
        if old is not None:
            allowed = _allowed(args.worse_by, old)
            worse = (old - value) * sign
            if worse > allowed:
                problems.append(
                    f"{args.scalar} got worse: {value:.4g} against {old:.4g} on {change.base} "
                    f"({_delta(value, old)}), more than the allowed {args.worse_by}"
                )
    if problems:
        return fail(env, "; ".join(problems))
    print(f"klique: {args.scalar} = {value:.4g}: within bounds")
    return 0


def _allowed(text: str, old: float) -> float:
    if text.endswith("%"):
        return abs(old) * float(text[:-1]) / 100
    return float(text)


def fail(env: Dict[str, str], message: str) -> int:
    if env.get("GITHUB_ACTIONS") == "true":
        print(f"::error title=klique check::{message}")
    print(f"klique: check failed: {message}", file=sys.stderr)
    return 1


# State between the steps of one job


def state_path(env: Dict[str, str]) -> Path:
    """Outside the checkout where the CI gives a scratch folder (GitHub's RUNNER_TEMP)."""
    if env.get("KLIQUE_CI_STATE"):
        return Path(env["KLIQUE_CI_STATE"])
    return Path(env.get("RUNNER_TEMP") or ".") / "klique-ci.json"


def save_state(env: Dict[str, str], state: Dict[str, Any]) -> None:
    state_path(env).write_text(json.dumps(state))


def load_state(env: Dict[str, str]) -> Dict[str, Any]:
    try:
        return dict(json.loads(state_path(env).read_text()))
    except (OSError, ValueError):
        raise CiError(
            f"no run to look at: {state_path(env)} is missing; run `submit` first"
        ) from None


def outputs(env: Dict[str, str], values: Dict[str, str]) -> None:
    if env.get("GITHUB_OUTPUT"):
        with open(env["GITHUB_OUTPUT"], "a") as f:
            for key, value in values.items():
                f.write(f"{key}={value}\n")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = top.add_subparsers(dest="what", required=True)
    one = commands.add_parser("submit", help="submit a run and wait for it")
    one.add_argument("--resource")
    one.add_argument("--project", default=os.environ.get("KLIQUE_CI_PROJECT") or "ci")
    one.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    one.add_argument("--no-code", action="store_true")
    one.add_argument("--no-wait", dest="wait", action="store_false")
    poll = float(os.environ.get("KLIQUE_CI_POLL") or 3.0)  # seconds between looks at the run
    one.add_argument("--poll", type=float, default=poll, help=argparse.SUPPRESS)
    one.add_argument(
        "--command-line", help="the command as one line of shell words (for CI inputs)"
    )
    one.add_argument("command", nargs="*")
    two = commands.add_parser("report", help="post the run's final scalars on the request")
    two.add_argument("--task", type=int)
    three = commands.add_parser("check", help="fail when a scalar got worse than allowed")
    three.add_argument("--task", type=int)
    three.add_argument("--scalar", required=True)
    three.add_argument("--higher-is-better", action="store_true")
    three.add_argument("--worse-by", help="allowed worsening against the base: 0.01 or 5%%")
    three.add_argument("--min", type=float)
    three.add_argument("--max", type=float)
    return top


def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(argv)
    env = dict(os.environ)
    try:
        return {"submit": submit, "report": report, "check": check}[args.what](args, env)
    except CiError as exc:
        print(f"klique: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
