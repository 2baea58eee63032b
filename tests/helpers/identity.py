"""The identity team, played by the tests: realms, users and groups at the OpenID Connect
provider of scripts/oidc-up, the browser and the terminal a person logs in with."""

from __future__ import annotations

import os
import re
import secrets
import ssl
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urljoin, urlparse

import httpx

from helpers.estates import estate_yaml, profile

CA = Path(os.environ.get("KLIQUE_CA_DIR", "/tmp/klique-ca")) / "ca.pem"
OIDC_DIR = Path(os.environ.get("KLIQUE_OIDC_DIR", "/tmp/klique-oidc"))
CLIENT_ID = "klique"
# The groups of the sign-on and of the directory, as the estate maps them to teams.
GROUPS = {"cv-lab": "vision", "nlp-lab": "language"}
TLS = ssl.create_default_context(cafile=str(CA)) if CA.exists() else None


@dataclass
class Realm:
    url: str  # the provider's
    name: str
    issuer: str
    secret: str

    def _admin(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, verify=TLS, headers={"X-Admin-Secret": self.secret}, timeout=30
        )

    def user(self, username: str, groups: list[str], password: str | None = None) -> str:
        password = password or secrets.token_hex(8)
        with self._admin() as admin:
            answer = admin.put(
                f"/admin/realms/{self.name}/users/{username}",
                json={"groups": groups, "password": password},
            )
        answer.raise_for_status()
        return password

    def groups(self, username: str, groups: list[str]) -> None:
        with self._admin() as admin:
            admin.put(
                f"/admin/realms/{self.name}/users/{username}", json={"groups": groups}
            ).raise_for_status()

    def drop(self, username: str) -> None:
        with self._admin() as admin:
            admin.delete(f"/admin/realms/{self.name}/users/{username}").raise_for_status()

    def rotate(self, retire: bool = False) -> str:
        with self._admin() as admin:
            answer = admin.post(f"/admin/realms/{self.name}/rotate", json={"retire": retire})
        answer.raise_for_status()
        return str(answer.json()["kid"])

    def client(self, client_id: str, redirect_uris: list[str], secret: str | None = None) -> None:
        with self._admin() as admin:
            admin.put(
                f"/admin/realms/{self.name}/clients/{client_id}",
                json={"redirect_uris": redirect_uris, "secret": secret},
            ).raise_for_status()

    def approve(self, user_code: str, username: str, password: str) -> httpx.Response:
        """What the person does in the browser at the verification address."""
        with httpx.Client(verify=TLS, timeout=30) as browser:
            return browser.post(
                f"{self.issuer}/device",
                data={"user_code": user_code, "username": username, "password": password},
            )

    def device_tokens(self, username: str, password: str, client_id: str = CLIENT_ID) -> Any:
        """A whole device login without the CLI: the provider's tokens."""
        with httpx.Client(verify=TLS, timeout=30) as http:
            started = http.post(
                f"{self.issuer}/device_authorization",
                data={"client_id": client_id, "scope": "openid profile groups offline_access"},
            ).json()
            self.approve(started["user_code"], username, password).raise_for_status()
            answer = http.post(
                f"{self.issuer}/token",
                data={
                    "grant_type": "urn:ietf:params:oauth:grant-type:device_code",
                    "device_code": started["device_code"],
                    "client_id": client_id,
                },
            )
        answer.raise_for_status()
        return answer.json()

    def estate(self, **oidc: object) -> str:
        """The estate's identity section for this realm (client `klique`, no clock leeway)."""
        settings: dict[str, object] = {"issuer": self.issuer, "client_id": CLIENT_ID}
        settings |= {"ca_file": str(CA), "clock_leeway": 0, **oidc}
        identity = {"oidc": settings, "groups": GROUPS, "admin_groups": ["klique-admins"]}
        return estate_yaml(identity=identity)


def make_realm(
    oidc_url: str, token_lifetime: int = 300, redirect_uris: list[str] | None = None
) -> Realm:
    secret = (OIDC_DIR / "admin.secret").read_text().strip()
    name = f"r{secrets.token_hex(6)}"
    with httpx.Client(verify=TLS, timeout=30) as admin:
        answer = admin.put(
            f"{oidc_url}/admin/realms/{name}",
            headers={"X-Admin-Secret": secret},
            json={
                "token_lifetime": token_lifetime,
                "clients": [{"client_id": CLIENT_ID, "redirect_uris": redirect_uris or []}],
            },
        )
    answer.raise_for_status()
    return Realm(oidc_url, name, answer.json()["issuer"], secret)


# Teams, a CPU resource on a host pool whose tasks run as alice and bob, and both teams'
# policies: what the identity tests' servers share (the identity section is added per realm).
TEAMS_ESTATE = estate_yaml(
    teams={"vision": [], "language": []},
    resources={"cpu": profile("p", cpus=1, memory="200M", walltime="10m")},
    pools={
        "p": {
            "kind": "host",
            "slots": 4,
            "user_map": {"admin": "alice", "alice": "alice", "bob": "bob", "ci-bot": "alice"},
            "job_root": "$JOB_ROOT",
        }
    },
    policies={"vision": {"resources": ["cpu"]}, "language": {"resources": ["cpu"]}},
)


def cli_env(server_url: str, home: Path) -> dict[str, str]:
    """A terminal with no token in its environment: the CLI uses what login kept."""
    env = {k: v for k, v in os.environ.items() if k != "KLIQUE_TOKEN"}
    return {**env, "KLIQUE_API": server_url, "KLIQUE_HOME": str(home), "SSL_CERT_FILE": str(CA)}


def klique(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def sso_login(
    env: dict[str, str], realm: Realm, username: str, password: str
) -> subprocess.CompletedProcess[str]:
    """`klique login --sso` in a terminal; the person confirms the code in a browser."""
    process = subprocess.Popen(
        [sys.executable, "-m", "broker", "login", "--sso"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    line = process.stderr.readline()
    found = re.search(r"confirm the code (\S+)", line)
    if found:
        realm.approve(found[1], username, password).raise_for_status()
    out, err = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, out, line + err)


def browser_login(
    server_url: str,
    username: str,
    password: str,
    next_path: str = "/api/v1/whoami",
    browser: httpx.Client | None = None,
) -> httpx.Client:
    """A browser that logs in to Klique through the provider's login page; returns it with
    its cookies."""
    browser = browser or httpx.Client(verify=TLS, timeout=30)
    answer = browser.get(f"{server_url}/auth/login", params={"next": next_path})
    assert answer.status_code == 302, answer.text
    to_provider = answer.headers["location"]
    form = browser.post(to_provider, data={"username": username, "password": password})
    assert form.status_code == 302, form.text
    back = form.headers["location"]
    assert parse_qs(urlparse(back).query).get("code"), back
    done = browser.get(back)
    assert done.status_code == 303, done.text
    assert urljoin(server_url, done.headers["location"]) == server_url + next_path
    return browser


def page_csrf(browser: httpx.Client, server_url: str) -> str:
    """The session's CSRF token, as the web UI's pages carry it (no cookie holds it)."""
    page = browser.get(f"{server_url}/tasks").text
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, page[:500]
    return found[1]


LDAP_DIR = Path(os.environ.get("KLIQUE_LDAP_DIR", "/tmp/klique-ldap"))
SUFFIX = "dc=klique,dc=test"


def ldap_estate(url: str, start_tls: bool = False) -> str:
    """The estate's identity section for the site's directory at `url`."""
    ldap = {
        "url": url,
        "start_tls": start_tls,
        "ca_file": str(CA),
        "user_dn": f"uid={{user}},ou=people,{SUFFIX}",
        "group_base": f"ou=groups,{SUFFIX}",
    }
    return estate_yaml(identity={"ldap": ldap, "groups": GROUPS})


class Directory:
    """The site's directory, as its administrators change it."""

    def __init__(self, url: str) -> None:
        from ldap3 import Connection, Server, Tls

        tls = Tls(ca_certs_file=str(CA), validate=ssl.CERT_REQUIRED)
        password = (LDAP_DIR / "admin.pw").read_text()
        self.connection = Connection(
            Server(url, use_ssl=True, tls=tls), f"cn=admin,{SUFFIX}", password, auto_bind=True
        )

    def person(self, groups: list[str]) -> tuple[str, str]:
        """A new person in these groups: (user name, password)."""
        from ldap3.utils.hashed import HASHED_SALTED_SHA, hashed

        user, password = f"p{secrets.token_hex(5)}", secrets.token_hex(8)
        dn = f"uid={user},ou=people,{SUFFIX}"
        attributes = {"cn": user, "sn": user, "uid": user}
        attributes["userPassword"] = hashed(HASHED_SALTED_SHA, password)
        assert self.connection.add(dn, ["inetOrgPerson"], attributes), self.connection.result
        self.move(user, [], groups)
        return user, password

    def move(self, user: str, leave: list[str], join: list[str]) -> None:
        from ldap3 import MODIFY_ADD, MODIFY_DELETE

        dn = f"uid={user},ou=people,{SUFFIX}"
        for group, change in [(g, MODIFY_DELETE) for g in leave] + [(g, MODIFY_ADD) for g in join]:
            target = f"cn={group},ou=groups,{SUFFIX}"
            done = self.connection.modify(target, {"member": [(change, [dn])]})
            assert done, self.connection.result
