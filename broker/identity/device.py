"""The CLI's and SDK's side of single sign-on: the device-authorization flow (RFC 8628) for
`klique login --sso`, and the silent renewal of access tokens with the refresh token, as a
public client over httpx alone (the client installs without the server's Authlib). What is kept
is one credential entry per server, in the credentials file (mode 600, see broker/client.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from broker.errors import KliqueError

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"


class SsoError(KliqueError):
    pass


class TokenRefused(SsoError):
    """The token endpoint's error answer (RFC 6749 5.2): `error` is its code."""

    def __init__(self, error: str, description: str | None) -> None:
        super().__init__(description or error)
        self.error = error
        self.description = description


def device_login(
    oidc: dict[str, Any],
    show: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Log in through the provider that the server names (`oidc`: issuer, client_id, scopes);
    `show` tells the user where to go. Returns the credential entry to keep."""
    issuer = str(oidc["issuer"])
    discovery = _discovery(issuer)
    endpoint = discovery.get("device_authorization_endpoint")
    if not isinstance(endpoint, str):
        raise SsoError(f"the provider {issuer} offers no device login; ask the platform team")
    client_id = str(oidc["client_id"])
    scope = " ".join(oidc.get("scopes") or ["openid", "offline_access"])
    started = _post_form(endpoint, {"client_id": client_id, "scope": scope})
    where = started.get("verification_uri_complete") or started.get("verification_uri")
    show(f"To log in, open {where} and confirm the code {started.get('user_code')}")
    entry = {"kind": "sso", "issuer": issuer, "client_id": client_id}
    entry["token_endpoint"] = str(discovery["token_endpoint"])
    tokens = _poll(entry, str(started["device_code"]), started, sleep)
    return _with_tokens(entry, tokens)


def _poll(
    entry: dict[str, Any], device_code: str, started: dict[str, Any], sleep: Callable[[float], None]
) -> dict[str, Any]:
    interval = float(started.get("interval") or 5)
    deadline = time.monotonic() + float(started.get("expires_in") or 600)
    while time.monotonic() < deadline:
        sleep(interval)
        try:
            return _token(entry, {"grant_type": DEVICE_GRANT, "device_code": device_code})
        except TokenRefused as exc:
            if exc.error == "slow_down":
                interval += 5  # RFC 8628 3.5
            elif exc.error != "authorization_pending":
                reason = exc.description or exc.error
                raise SsoError(f"the login was not completed: {reason}") from None
    raise SsoError("the login code expired before it was confirmed; run `klique login --sso`")


def renew(entry: dict[str, Any]) -> dict[str, Any]:
    """A new access token from the refresh token (the provider may rotate the refresh token)."""
    refresh_token = entry.get("refresh_token")
    if not refresh_token:
        raise SsoError("no refresh token is kept; run `klique login --sso` again")
    try:
        tokens = _token(entry, {"grant_type": "refresh_token", "refresh_token": refresh_token})
    except TokenRefused as exc:
        raise SsoError(
            "your single sign-on session has ended (the provider said: "
            f"{exc.description or exc.error}); run `klique login --sso` again"
        ) from None
    return _with_tokens(entry, tokens)


def _with_tokens(entry: dict[str, Any], tokens: dict[str, Any]) -> dict[str, Any]:
    return {
        **entry,
        "access_token": str(tokens["access_token"]),
        "refresh_token": str(tokens.get("refresh_token") or entry.get("refresh_token") or ""),
        "expires_at": time.time() + float(tokens.get("expires_in") or 300),
    }


def _token(entry: dict[str, Any], grant: dict[str, str]) -> dict[str, Any]:
    """One grant at the token endpoint (RFC 6749 4.1.3, 6; RFC 8628 3.4) as a public client:
    the client id in the form, no secret. The tokens, or TokenRefused with the provider's code."""
    form = {**grant, "client_id": str(entry["client_id"])}
    try:
        # The system's trust store (and SSL_CERT_FILE): the provider is the company's.
        response = httpx.post(
            str(entry["token_endpoint"]),
            data=form,
            headers={"Accept": "application/json"},
            timeout=30,
        )
    except httpx.HTTPError as exc:
        raise SsoError(f"cannot reach the single sign-on provider: {exc}") from None
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise SsoError(
            f"the provider's token endpoint answered {response.status_code} without a JSON object"
        )
    if "error" in answer or response.status_code != 200 or "access_token" not in answer:
        error = str(answer.get("error") or f"HTTP {response.status_code}")
        description = answer.get("error_description")
        raise TokenRefused(error, str(description) if description else None)
    return answer


def _discovery(issuer: str) -> dict[str, Any]:
    try:
        response = httpx.get(f"{issuer.rstrip('/')}/.well-known/openid-configuration", timeout=30)
        response.raise_for_status()
        data = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise SsoError(f"cannot read the provider's configuration at {issuer}: {exc}") from None
    if not isinstance(data, dict) or data.get("issuer") != issuer:
        raise SsoError(f"the provider at {issuer} does not call itself {issuer}")
    return data


def _post_form(url: str, data: dict[str, str]) -> dict[str, Any]:
    try:
        response = httpx.post(url, data=data, timeout=30)
        answer = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise SsoError(f"cannot start the login at {url}: {exc}") from None
    if response.status_code != 200 or not isinstance(answer, dict):
        raise SsoError(f"the provider refused to start a login: {answer}")
    return answer
