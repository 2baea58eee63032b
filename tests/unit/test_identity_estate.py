"""The estate's identity section and the user map's same-name rule."""

from __future__ import annotations

import pytest

from broker.errors import EstateError
from broker.estate import parse_estate
from broker.identity.teams import is_admin, team_for

BASE = """
teams: {vision: [carol], language: []}
resources:
  cpu: {profile: {pools: [p]}}
pools:
  p: {kind: host, job_root: /tmp, query_account: alice, user_map: {rule: same-name, deny: [svc]}}
"""
IDENTITY = """
identity:
  oidc: {issuer: "https://sso.example.com/realms/acme", client_id: klique}
  groups: {cv-lab: vision, nlp-lab: language}
  admin_groups: [klique-admins]
"""


def test_teams_come_from_the_estate_first_then_from_groups_in_order() -> None:
    estate = parse_estate(BASE + IDENTITY)
    assert team_for(estate, "carol", ["nlp-lab"]) == "vision"  # named under teams: wins
    assert team_for(estate, "dave", ["nlp-lab", "cv-lab"]) == "vision"  # the file's order
    assert team_for(estate, "dave", ["nlp-lab"]) == "language"
    assert team_for(estate, "dave", ["marketing"]) is None
    assert is_admin(estate, ["klique-admins"]) and not is_admin(estate, ["cv-lab"])
    assert estate.identity is not None and estate.identity.require_team


def test_the_same_name_rule_never_maps_root_nor_a_denied_account() -> None:
    user_map = parse_estate(BASE).pools["p"].user_map
    assert user_map.account_for("alice") == "alice"
    assert user_map.account_for("svc") is None
    assert user_map.account_for("root") is None
    assert user_map.maps_anyone


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            BASE + IDENTITY.replace("nlp-lab: language", "nlp-lab: sales"),
            "identity.groups.nlp-lab: team 'sales' is not declared",
        ),
        (
            BASE + IDENTITY.replace("https://", "http://"),
            "identity.oidc.issuer: String should match pattern",
        ),
        (
            BASE
            + "identity:\n  ldap: {url: 'ldap://dir', user_dn: 'uid={user},dc=x', group_base: x}\n",
            "identity.ldap.url: passwords would cross the network in clear",
        ),
        (
            BASE + "identity:\n  ldap: {url: 'ldaps://dir', user_dn: 'uid=x', group_base: x}\n",
            "identity.ldap.user_dn: needs {user}",
        ),
        (
            BASE.replace(", query_account: alice", ""),
            "pools.p.user_map: a user_map rule names no account in advance",
        ),
        (BASE.replace("same-name", "by-mail"), "pools.p.user_map.rule: Input should be"),
    ],
)
def test_mistakes_are_named_with_their_line_and_fix(text: str, problem: str) -> None:
    with pytest.raises(EstateError) as caught:
        parse_estate(text)
    assert any(problem in p for p in caught.value.problems), caught.value.problems
