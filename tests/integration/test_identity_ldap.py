"""LDAP logins against Debian's slapd on loopback (scripts/ldap-up): a password checked by a
simple bind over LDAPS or StartTLS, the team from the person's groups, and the refusals."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from helpers.identity import TEAMS_ESTATE, Directory, cli_env, ldap_estate

from broker.cli import main


@pytest.fixture
def directory(ldap_url) -> Directory:
    return Directory(ldap_url)


def cli_login(env: dict[str, str], user: str, password: str):
    return CliRunner().invoke(main, ["login", "--ldap", user], input=password + "\n", env=env)


def login(server, user: str, password: str):
    with server.api() as api:
        return api.post("/auth/ldap", json={"user": user, "password": password})


@pytest.mark.parametrize("transport", ["ldaps", "starttls"])
def test_an_ldap_login_keeps_a_token_with_the_team_of_the_persons_group(
    server_factory, directory, ldap_url, transport, tmp_path
) -> None:
    url = ldap_url if transport == "ldaps" else "ldap://127.0.0.1:3389"
    server = server_factory(TEAMS_ESTATE + ldap_estate(url, start_tls=transport == "starttls"))
    user, password = directory.person(["nlp-lab"])
    env = {**cli_env(server.url, tmp_path / "terminal"), "KLIQUE_TOKEN": ""}
    done = cli_login(env, user, password)
    assert done.exit_code == 0, done.output
    assert f"as {user}, team language" in done.output
    listed = CliRunner().invoke(main, ["token", "ls", "--json"], env=env)
    assert listed.exit_code == 0, listed.output
    (token,) = json.loads(listed.output)
    assert token["user"] == user and token["kind"] == "user" and token["expires_at"]


def test_wrong_empty_and_unknown_passwords_are_refused_alike(server_factory, directory, ldap_url):
    server = server_factory(TEAMS_ESTATE + ldap_estate(ldap_url))
    user, password = directory.person(["cv-lab"])
    answers = [
        login(server, user, "wrong"),
        login(server, "nobody-here", password),
    ]
    for answer in answers:
        assert answer.status_code == 401, answer.text
        assert answer.json()["detail"] == "wrong user name or password"
    empty = login(server, user, "")
    assert empty.status_code == 422  # an empty password would be an anonymous bind
    assert login(server, user, password).status_code == 201


def test_repeated_failures_for_one_user_are_slowed_down(server_factory, directory, ldap_url):
    server = server_factory(TEAMS_ESTATE + ldap_estate(ldap_url))
    user, password = directory.person(["cv-lab"])
    codes = [login(server, user, "guess").status_code for _ in range(6)]
    assert codes == [401] * 5 + [429]
    assert login(server, user, password).status_code == 429  # even the right one, for a minute


def test_a_group_change_in_the_directory_moves_the_person_at_the_next_login(
    server_factory, directory, ldap_url
) -> None:
    server = server_factory(TEAMS_ESTATE + ldap_estate(ldap_url))
    user, password = directory.person(["cv-lab"])
    with server.api(login(server, user, password).json()["token"]) as api:
        assert api.get("/whoami").json()["team"] == "vision"
    directory.move(user, ["cv-lab"], ["nlp-lab"])
    with server.api(login(server, user, password).json()["token"]) as api:
        assert api.get("/whoami").json()["team"] == "language"
        task = api.post("/tasks", json={"command": ["true"]}).json()
    assert (task["owner"], task["team"]) == (user, "language")


def test_a_person_in_no_mapped_group_is_refused(server_factory, directory, ldap_url) -> None:
    server = server_factory(TEAMS_ESTATE + ldap_estate(ldap_url))
    user, password = directory.person([])
    answer = login(server, user, password)
    assert answer.status_code == 403
    assert "in none of the groups that make a team" in answer.json()["detail"]
