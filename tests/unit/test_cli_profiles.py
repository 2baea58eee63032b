"""A CLI that remembers: `klique login` keeps each profile's server in the credentials file
(files from before profiles still read), `--profile` and $KLIQUE_PROFILE choose one,
`klique completion SHELL` prints the shell's script, and `klique ls --project P` filters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from broker import config
from broker.cli import main
from broker.client import Client, saved_token


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KLIQUE_HOME", str(tmp_path))
    for name in ("KLIQUE_API", "KLIQUE_PROFILE", "KLIQUE_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(config, "_chosen_profile", None)
    return tmp_path


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, dict[str, Any]]]:
    """Each GET the CLI makes, as (server, path, params); /whoami answers alice."""
    seen: list[tuple[str, str, dict[str, Any]]] = []

    def get(self: Client, path: str, **params: Any) -> Any:
        seen.append((self.api, path, params))
        return {"user": "alice"} if path == "/whoami" else []

    monkeypatch.setattr(Client, "get", get)
    return seen


def klique(*args: str, env: dict[str, str] | None = None) -> str:
    result = CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    config.use_profile(None)  # the group's option lasts one command, as in a real process
    return result.output


def test_login_keeps_the_server_so_later_commands_go_there(home: Path, calls: list) -> None:
    klique("login", "--api", "http://klique-a:8765/", "--token", "ta")
    saved = json.loads((home / "credentials.json").read_text())
    assert saved == {"http://klique-a:8765": "ta", "profiles": {"default": "http://klique-a:8765"}}
    klique("ls")
    assert calls[-1][:2] == ("http://klique-a:8765", "/tasks")


def test_profiles_keep_a_server_each_and_the_flag_or_variable_chooses(
    home: Path, calls: list
) -> None:
    klique("login", "--api", "http://klique-a:8765", "--token", "ta")
    klique("--profile", "prod", "login", "--api", "https://klique.prod", "--token", "tp")
    klique("ls")
    assert calls[-1][0] == "http://klique-a:8765"
    klique("--profile", "prod", "ls")
    assert calls[-1][0] == "https://klique.prod"
    klique("ls", env={"KLIQUE_PROFILE": "prod"})
    assert calls[-1][0] == "https://klique.prod"
    klique("--profile", "default", "ls", env={"KLIQUE_PROFILE": "prod"})
    assert calls[-1][0] == "http://klique-a:8765"  # the flag over the variable
    assert saved_token("https://klique.prod") == "tp"


def test_a_named_profile_without_a_server_says_how_to_give_it_one(calls: list) -> None:
    result = CliRunner().invoke(main, ["--profile", "lab", "ls"])
    config.use_profile(None)
    assert result.exit_code == 1
    assert "profile lab has no server yet; fix: klique --profile lab login --api URL" in (
        result.output
    )


def test_klique_api_still_wins_over_the_default_profile(calls: list) -> None:
    klique("login", "--api", "http://klique-a:8765", "--token", "ta")
    klique("ls", env={"KLIQUE_API": "http://other:1"})
    assert calls[-1][0] == "http://other:1"


def test_a_credentials_file_from_before_profiles_still_reads(home: Path, calls: list) -> None:
    (home / "credentials.json").write_text(json.dumps({"http://127.0.0.1:8765": "old"}))
    assert config.api_url() == "http://127.0.0.1:8765"
    assert saved_token("http://127.0.0.1:8765") == "old"
    klique("login", "--api", "http://klique-a:8765", "--token", "ta")
    saved = json.loads((home / "credentials.json").read_text())
    assert saved["http://127.0.0.1:8765"] == "old" and saved["http://klique-a:8765"] == "ta"


@pytest.mark.parametrize(
    ("shell", "mark"),
    [
        ("bash", "complete -o nosort -F"),
        ("zsh", "#compdef klique"),
        ("fish", "complete --no-files"),
    ],
)
def test_completion_prints_clicks_script_for_the_shell(shell: str, mark: str) -> None:
    script = klique("completion", shell)
    assert mark in script and "_KLIQUE_COMPLETE" in script


def test_ls_asks_for_one_projects_tasks(calls: list) -> None:
    klique("ls", "--project", "vision")
    assert calls[-1][1:] == (
        "/tasks",
        {
            "state": None,
            "all_users": None,
            "limit": 50,
            "before": None,
            "project": "vision",
            "tag": None,
            "team": None,
            "archived": None,
        },
    )
