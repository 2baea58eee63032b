"""One Klique user per person: the names a directory or a provider gives, normalised as the
directory compares them (broker/identity/canonical.py), and the estate's settings for it."""

from __future__ import annotations

import pytest

from broker.estate import parse_estate
from broker.identity.canonical import NotAName, normal_name, user_name


@pytest.mark.parametrize(
    "spelling",
    [
        "alice",
        "ALICE",
        "Alice",
        " alice",
        "alice ",
        "\talice\n",
        "\u00a0alice\u3000",  # a no-break space, an ideographic space
        "ａｌｉｃｅ",  # full-width letters
        "ＡＬＩＣＥ",
    ],
)
def test_every_spelling_the_directory_accepts_is_one_user(spelling: str) -> None:
    assert user_name(spelling) == "alice"


def test_the_kelvin_sign_and_ligatures_become_their_plain_letters() -> None:
    assert user_name("\u212aate") == "kate"  # KELVIN SIGN, then lower-cased
    assert user_name("\ufb01nn") == "finn"  # the "fi" ligature


def test_a_case_sensitive_site_keeps_the_case_but_still_normalises() -> None:
    assert user_name(" Alice ", case_sensitive=True) == "Alice"
    assert user_name("ＡＬＩＣＥ", case_sensitive=True) == "ALICE"
    assert normal_name("Alice", case_sensitive=True) != normal_name("alice", case_sensitive=True)


def test_names_keep_dots_underscores_and_dashes() -> None:
    assert user_name("J.Doe_2-x") == "j.doe_2-x"


@pytest.mark.parametrize(
    "given",
    [
        "",
        "   ",
        "al ice",  # a space inside is no insignificant space
        "*",
        "a)(uid=*",
        "admin,dc=klique",
        "-alice",
        ".alice",
        "ali\u0307ce",  # a combining dot stays a mark, not a letter
        "аlice",  # a Cyrillic "а": NFKC keeps it, so it is no Klique name
        "x" * 65,
    ],
)
def test_names_that_are_not_klique_names_once_normalised_are_refused_with_a_sentence(
    given: str,
) -> None:
    with pytest.raises(NotAName) as refused:
        user_name(given, where="the user name")
    message = str(refused.value)
    assert message.startswith(f"the user name {given!r} is not a Klique user name"), message
    assert "letters" in message


def test_normalising_twice_changes_nothing() -> None:
    for spelling in ("ALICE", " ａｌｉｃｅ ", "\u212aate", "Bob.Smith"):
        once = user_name(spelling)
        assert user_name(once) == once


IDENTITY = """
resources:
  cpu: {profile: {pools: [p]}}
pools:
  p: {kind: host, job_root: /tmp, query_account: alice, user_map: {rule: same-name}}
identity:
  oidc: {issuer: "https://sso.example.com/realms/acme", client_id: klique}
  ldap: {url: 'ldaps://dir', user_dn: 'uid={user},dc=x', group_base: x}
"""


def test_names_ignore_case_unless_the_estate_says_otherwise() -> None:
    identity = parse_estate(IDENTITY).identity
    assert identity is not None and identity.ldap is not None
    assert identity.ldap.user_attribute == "uid" and not identity.ldap.case_sensitive
    assert not identity.claims.username_case_sensitive
    exact = IDENTITY.replace(
        "group_base: x}", "group_base: x, user_attribute: cn, case_sensitive: true}"
    )
    exact += "  claims: {username: email, username_case_sensitive: true}\n"
    identity = parse_estate(exact).identity
    assert identity is not None and identity.ldap is not None
    assert identity.ldap.user_attribute == "cn" and identity.ldap.case_sensitive
    assert identity.claims.username_case_sensitive
