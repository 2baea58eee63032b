"""The CI integrations (integrations/) run as GitHub Actions and GitLab CI would run them,
against a live Klique server and a local stand-in for the GitHub and GitLab APIs that records
every call: a CI service user's runs are submitted, waited for, compared with the base
branch's last run on the pull request, checked against a threshold, and metered as that
service user, in its team."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT, TASK_PY, TRUST_CHECKOUTS, shared_folder
from fakes.forge_api import Forge, serve
from helpers.identity import TEAMS_ESTATE

ACTION = ROOT / "integrations" / "github" / "action.yml"
TEMPLATE = ROOT / "integrations" / "gitlab" / "klique.gitlab-ci.yml"
TRAIN = """\
import os
from inside_job import report
report.scalar("loss", float(os.environ["LOSS"]), step=1)
report.scalar("accuracy", float(os.environ["ACC"]), step=1)
print("trained with loss", os.environ["LOSS"])
"""
INPUT = re.compile(r"\$\{\{\s*inputs\.([A-Za-z0-9_-]+)\s*\}\}")


@pytest.fixture
def forge() -> Iterator[Forge]:
    found = Forge()
    server = serve(found)
    yield found
    server.shutdown()


@pytest.fixture
def repo(monkeypatch) -> Iterator[Path]:
    """A checkout of the trained project, alice's (the service user's runs run as alice)."""
    folder = shared_folder("klique-ci-repo-")
    repo = folder / "vision"
    repo.mkdir()
    git = ["git", "-c", "user.email=ci@example.com", "-c", "user.name=CI"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "train.py").write_text(TRAIN)
    subprocess.run([*git, "add", "."], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "train"], cwd=repo, check=True)
    subprocess.run(["chown", "-R", "alice:alice", str(repo)], check=True)
    for key, value in TRUST_CHECKOUTS.items():
        monkeypatch.setenv(key, value)
    yield repo
    subprocess.run(["rm", "-rf", str(folder)], check=False)


@pytest.fixture
def ci(server_factory) -> tuple[Any, str]:
    """A Klique server and a CI service user's token (team vision, submit and read)."""
    server = server_factory(TEAMS_ESTATE)
    made = server.cli("token", "create", "--service", "ci-bot", "--team", "vision", "--json")
    assert made.exit_code == 0, made.output
    return server, json.loads(made.output)["token"]


def commit_of(repo: Path) -> str:
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()


def base_env(tmp: Path) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)  # where `klique` is installed
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KLIQUE_", "GITHUB_", "CI_"))}
    env |= {"PATH": f"{bin_dir}:{env['PATH']}", "KLIQUE_HOME": str(tmp / "home")}
    return env | {"KLIQUE_CI_POLL": "0.2"}


def run_action(inputs: dict[str, str], env: dict[str, str], cwd: Path) -> list[Any]:
    """The composite action's steps as the GitHub runner runs them: each `run` with
    `bash --noprofile --norc -eo pipefail`, its `env` with the inputs put in, GITHUB_OUTPUT
    and GITHUB_ACTION_PATH set; the first step that fails ends the job."""
    action = yaml.safe_load(ACTION.read_text())
    values = {k: str(v.get("default", "")) for k, v in action["inputs"].items()} | inputs
    results = []
    for i, step in enumerate(action["runs"]["steps"]):
        assert "${{" not in step["run"], "inputs reach scripts only through env"
        step_env = {k: INPUT.sub(lambda m: values[m[1]], str(v)) for k, v in step["env"].items()}
        assert not any("${{" in v for v in step_env.values())
        output = Path(env["RUNNER_TEMP"]) / f"output-{i}"
        script = Path(env["RUNNER_TEMP"]) / f"step-{i}.sh"
        script.write_text(step["run"])
        done = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
            env={
                **env,
                **step_env,
                "GITHUB_OUTPUT": str(output),
                "GITHUB_ACTION_PATH": str(ACTION.parent),
            },
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        results.append(done)
        if done.returncode != 0:
            break
    return results


def github(tmp: Path, forge: Forge, event: str, payload: dict[str, Any], **more: str):
    event_path = tmp / f"{event}-{len(forge.calls)}.json"
    event_path.write_text(json.dumps(payload))
    runner_temp = tmp / f"runner-{len(list(tmp.glob('runner-*')))}"
    runner_temp.mkdir()
    return base_env(tmp) | {
        "GITHUB_ACTIONS": "true",
        "GITHUB_EVENT_NAME": event,
        "GITHUB_EVENT_PATH": str(event_path),
        "GITHUB_REPOSITORY": "acme/vision",
        "GITHUB_API_URL": forge.url,
        "RUNNER_TEMP": str(runner_temp),
        **more,
    }


def inputs(server: Any, token: str, loss: float, **more: str) -> dict[str, str]:
    return {
        "api-url": server.url,
        "token": token,
        "github-token": "gh-secret",
        "command": f"{TASK_PY} train.py",
        "env": f"LOSS={loss}\nACC=0.8",
        "project": "vision-ci",
        "check-scalar": "loss",
        "check-worse-by": "10%",
        **more,
    }


def tasks_of(server: Any) -> list[dict[str, Any]]:
    with server.api() as api:
        return api.get("/tasks", params={"all_users": True}).json()  # type: ignore[no-any-return]


def test_the_github_action_trains_compares_and_checks_as_the_ci_service_user(
    ci, repo, forge, tmp_path
) -> None:
    server, token = ci
    sha = commit_of(repo)
    push = github(tmp_path, forge, "push", {}, GITHUB_SHA=sha, GITHUB_REF_NAME="main")
    steps = run_action(inputs(server, token, 0.30), push, repo)
    assert [s.returncode for s in steps] == [0, 0, 0, 0], steps[-1].stderr
    assert "trained with loss 0.3" in steps[1].stdout
    assert forge.calls == []  # a push has no pull request to comment on

    pull = {"number": 7, "head": {"ref": "feature", "sha": sha}, "base": {"ref": "main"}}
    opened = github(tmp_path, forge, "pull_request", {"pull_request": pull})
    steps = run_action(inputs(server, token, 0.25), opened, repo)
    assert [s.returncode for s in steps] == [0, 0, 0, 0], steps[-1].stderr
    (comment,) = forge.bodies(7)
    base_id = min(t["id"] for t in tasks_of(server))
    assert f"| scalar | this run | main (#{base_id}) | change |" in comment
    assert "| loss | 0.25 | 0.3 | -0.05 (-16.7%) |" in comment
    assert "| accuracy | 0.8 | 0.8 | +0 (+0.0%) |" in comment
    assert forge.calls[-1].headers["authorization"] == "Bearer gh-secret"

    steps = run_action(inputs(server, token, 0.40), opened, repo)
    assert [s.returncode for s in steps] == [0, 0, 0, 1]
    assert "loss got worse: 0.4 against 0.3 on main (+0.1 (+33.3%))" in steps[3].stderr
    assert "::error title=klique check::" in steps[3].stdout
    (comment,) = forge.bodies(7)  # the same comment, updated
    assert "| loss | 0.4 | 0.3 | +0.1 (+33.3%) |" in comment
    assert [c.method for c in forge.calls].count("PATCH") == 1

    runs = tasks_of(server)
    assert {(t["owner"], t["team"], t["state"]) for t in runs} == {
        ("ci-bot", "vision", "completed")
    }
    assert sorted(t["name"] for t in runs) == sorted(
        [f"ci:main:{sha[:12]}", f"ci:feature:{sha[:12]}", f"ci:feature:{sha[:12]}"]
    )
    with server.api() as api:
        by_user = api.get("/usage", params={"by": "user"}).json()["rows"]
        by_team = api.get("/usage", params={"by": "team"}).json()["rows"]
    assert [(r["key"], r["runs"]) for r in by_user] == [("ci-bot", 3)]
    assert [(r["key"], r["runs"]) for r in by_team] == [("vision", 3)]


def test_a_comment_starts_a_run_only_for_the_repositorys_own_people(
    ci, repo, forge, tmp_path
) -> None:
    server, token = ci
    sha = commit_of(repo)
    forge.pulls[9] = {"number": 9, "head": {"ref": "fix", "sha": sha}, "base": {"ref": "main"}}

    def comment(association: str) -> dict[str, Any]:
        return {
            "issue": {"number": 9, "pull_request": {"url": "..."}},
            "comment": {
                "body": "/klique train please",
                "author_association": association,
                "user": {"login": "someone"},
            },
        }

    stranger = github(tmp_path, forge, "issue_comment", comment("NONE"))
    steps = run_action(inputs(server, token, 0.3), stranger, repo)
    assert [s.returncode for s in steps] == [0, 0, 0, 0]
    assert "is not an owner, member or collaborator" in steps[1].stdout
    assert tasks_of(server) == [] and forge.bodies(9) == []

    member = github(tmp_path, forge, "issue_comment", comment("MEMBER"))
    steps = run_action(inputs(server, token, 0.3), member, repo)
    assert [s.returncode for s in steps] == [0, 0, 0, 0], steps[-1].stderr
    (task,) = tasks_of(server)
    assert task["name"] == f"ci:fix:{sha[:12]}" and task["owner"] == "ci-bot"
    assert ("GET", "/repos/acme/vision/pulls/9") in [(c.method, c.path) for c in forge.calls]
    (posted,) = forge.bodies(9)
    assert "No completed run of `main` to compare with." in posted


def run_gitlab(job: dict[str, str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    """The template's job as a GitLab runner runs it: the variables (the template's, then the
    job's), then the script lines in one bash with errexit and pipefail."""
    template = yaml.safe_load(TEMPLATE.read_text())[".klique-train"]
    variables = {k: str(v) for k, v in template["variables"].items()} | job
    script = "set -eo pipefail\n" + "\n".join(template["script"])
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", script],
        env={**env, **variables},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_gitlab_template_trains_comments_on_the_merge_request_and_checks(
    ci, repo, forge, tmp_path
) -> None:
    server, token = ci
    sha = commit_of(repo)
    env = base_env(tmp_path) | {
        "GITLAB_CI": "true",
        "CI_API_V4_URL": f"{forge.url}/api/v4",
        "CI_PROJECT_ID": "42",
        "CI_COMMIT_SHA": sha,
        "KLIQUE_API": server.url,
        "KLIQUE_TOKEN": token,
        "KLIQUE_GITLAB_TOKEN": "gl-secret",
    }
    job = {
        "KLIQUE_CI_COMMAND": f"{TASK_PY} train.py",
        "KLIQUE_CI_PROJECT": "vision-ci",
        "KLIQUE_CI_SCALAR": "accuracy",
        "KLIQUE_CI_HIGHER": "true",
        "KLIQUE_CI_WORSE_BY": "0.05",
        "KLIQUE_CI_DIR": str(ROOT / "integrations" / "ci"),
    }
    main = run_gitlab(
        job | {"KLIQUE_CI_ENV": "LOSS=0.3\nACC=0.9"}, env | {"CI_COMMIT_REF_NAME": "main"}, repo
    )
    assert main.returncode == 0, main.stderr
    merge_request = env | {
        "CI_MERGE_REQUEST_IID": "3",
        "CI_MERGE_REQUEST_SOURCE_BRANCH_NAME": "feature",
        "CI_MERGE_REQUEST_TARGET_BRANCH_NAME": "main",
    }
    worse = run_gitlab(job | {"KLIQUE_CI_ENV": "LOSS=0.3\nACC=0.8"}, merge_request, repo)
    assert worse.returncode == 1
    assert "accuracy got worse: 0.8 against 0.9 on main" in worse.stderr
    (note,) = forge.bodies(3)
    assert "| accuracy | 0.8 | 0.9 | -0.1 (-11.1%) |" in note
    assert {c.headers.get("private-token") for c in forge.calls} == {"gl-secret"}
    assert {(t["owner"], t["team"]) for t in tasks_of(server)} == {("ci-bot", "vision")}
