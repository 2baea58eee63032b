"""An OpenID Connect provider for the tests, built on Authlib's server side (the OP library
that Authlib ships: authorization server, grants, PKCE, device flow, JWT access tokens).

It serves realms, as Keycloak does: each realm is an issuer of its own
(`https://127.0.0.1:9443/realms/NAME`) with its own signing keys, users, clients and token
lifetime, so that every test makes its own and none disturbs another. What it implements,
each by the RFC Authlib follows:

- discovery (OpenID Connect Discovery 1.0) and the JWKS (RFC 7517), keys rotated on request,
  the old key kept published until it is retired;
- the authorization-code flow (RFC 6749 4.1) with PKCE S256 required (RFC 7636), a login form
  for a user name and password, ID tokens (OpenID Connect Core 3.1) with the nonce;
- the device-authorization flow (RFC 8628) with its verification page;
- refresh tokens, rotated at each use (RFC 6749 6, OAuth 2.0 Security BCP 4.14);
- JWT access tokens (RFC 9068) that carry `preferred_username` and `groups`.

An admin API (header `X-Admin-Secret`, the content of `admin.secret` in its folder, mode 600)
creates realms, users and groups, deletes users (their refresh tokens die with them) and
rotates keys; tests use it to play the identity team.

Run: python oidc_provider.py --port 9443 --cert CERT --key KEY --state-dir DIR
"""

from __future__ import annotations

import argparse
import hmac
import html
import secrets
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import flask
from authlib.integrations.flask_oauth2 import AuthorizationServer
from authlib.oauth2.rfc6749 import ClientMixin, grants
from authlib.oauth2.rfc6749.errors import OAuth2Error
from authlib.oauth2.rfc7636 import CodeChallenge
from authlib.oauth2.rfc8628 import DeviceAuthorizationEndpoint, DeviceCodeGrant
from authlib.oauth2.rfc8628.models import DeviceCredentialDict
from authlib.oauth2.rfc9068 import JWTBearerTokenGenerator
from authlib.oidc.core import UserInfo
from authlib.oidc.core.grants import OpenIDCode
from joserfc.jwk import KeySet, RSAKey

SCOPES = "openid profile groups offline_access"


@dataclass
class User:
    username: str
    password: str
    groups: list[str]
    sub: str = field(default_factory=lambda: str(uuid.uuid4()))

    def get_user_id(self) -> str:
        return self.sub


@dataclass
class Client(ClientMixin):  # type: ignore[misc]
    client_id: str
    secret: str | None  # None: a public client (PKCE, no secret)
    redirect_uris: list[str]

    def get_client_id(self) -> str:
        return self.client_id

    def get_default_redirect_uri(self) -> str | None:
        return self.redirect_uris[0] if self.redirect_uris else None

    def get_allowed_scope(self, scope: str) -> str:
        return " ".join(s for s in (scope or "").split() if s in SCOPES.split())

    def check_redirect_uri(self, redirect_uri: str) -> bool:
        return redirect_uri in self.redirect_uris

    def check_client_secret(self, client_secret: str) -> bool:
        return self.secret is not None and hmac.compare_digest(self.secret, client_secret)

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        if self.secret is None:
            return method == "none"
        return method in ("client_secret_basic", "client_secret_post")

    def check_response_type(self, response_type: str) -> bool:
        return response_type == "code"

    def check_grant_type(self, grant_type: str) -> bool:
        return grant_type in (
            "authorization_code",
            "refresh_token",
            DeviceCodeGrant.GRANT_TYPE,
        )


@dataclass
class Code:
    code: str
    client_id: str
    redirect_uri: str
    scope: str
    username: str
    nonce: str | None
    code_challenge: str | None
    code_challenge_method: str | None
    auth_time: int

    def get_redirect_uri(self) -> str:
        return self.redirect_uri

    def get_scope(self) -> str:
        return self.scope

    def get_nonce(self) -> str | None:
        return self.nonce

    def get_auth_time(self) -> int:
        return self.auth_time

    def get_acr(self) -> None:
        return None

    def get_amr(self) -> None:
        return None


@dataclass
class Refresh:
    token: str
    client_id: str
    scope: str
    username: str
    revoked: bool = False

    def check_client(self, client: Client) -> bool:
        return client.client_id == self.client_id

    def get_scope(self) -> str:
        return self.scope

    def get_expires_in(self) -> int:
        return 86400

    def is_expired(self) -> bool:
        return False

    def is_revoked(self) -> bool:
        return self.revoked


def new_key() -> RSAKey:
    return RSAKey.generate_key(
        2048, parameters={"kid": secrets.token_hex(8), "use": "sig", "alg": "RS256"}
    )


class Realm:
    """One issuer: keys, users, clients, codes and tokens, and its Authlib server."""

    def __init__(self, name: str, base_url: str, token_lifetime: int) -> None:
        self.name = name
        self.issuer = f"{base_url}/realms/{name}"
        self.token_lifetime = token_lifetime
        self.keys: list[RSAKey] = [new_key()]  # the first signs; the others are still published
        self.users: dict[str, User] = {}
        self.clients: dict[str, Client] = {}
        self.codes: dict[str, Code] = {}
        self.refresh: dict[str, Refresh] = {}
        self.devices: dict[str, DeviceCredentialDict] = {}
        self.device_grants: dict[str, tuple[str, bool]] = {}  # user code -> (user, approved)
        self.lock = threading.RLock()
        self.server = self._server()

    def signing_keys(self) -> KeySet:
        return KeySet([self.keys[0]])

    def public_keys(self) -> dict[str, Any]:
        return KeySet(self.keys).as_dict(private=False)

    def user(self, username: str) -> User | None:
        return self.users.get(username)

    def claims(self, user: User) -> dict[str, Any]:
        return {"preferred_username": user.username, "groups": list(user.groups)}

    def _server(self) -> AuthorizationServer:
        realm = self
        server = AuthorizationServer(query_client=self.clients.get, save_token=self._save_token)
        server.register_token_generator("default", _AccessTokens(realm))
        server.register_grant(_CodeGrant, [_OpenIDCode(realm), CodeChallenge(required=True)])
        server.register_grant(_RefreshGrant)
        server.register_grant(_DeviceGrant)
        server.register_endpoint(_DeviceEndpoint)
        server.realm = realm  # type: ignore[attr-defined]
        return server

    def _save_token(self, token: dict[str, Any], request: Any) -> None:
        if "refresh_token" in token:
            self.refresh[token["refresh_token"]] = Refresh(
                token["refresh_token"],
                request.client.client_id,
                token.get("scope", ""),
                request.user.username,
            )


def _realm_of(grant: Any) -> Realm:
    return grant.server.realm  # type: ignore[no-any-return]


class _AccessTokens(JWTBearerTokenGenerator):  # type: ignore[misc]
    def __init__(self, realm: Realm) -> None:
        super().__init__(issuer=realm.issuer, refresh_token_generator=_refresh_token)
        self.realm = realm

    def get_jwks(self) -> KeySet:
        return self.realm.signing_keys()

    def get_extra_claims(self, client: Client, grant_type: str, user: User, scope: str) -> Any:
        return self.realm.claims(user)

    def _get_expires_in(self, client: Client, grant_type: str) -> int:
        return self.realm.token_lifetime


def _refresh_token(*_args: Any, **_kwargs: Any) -> str:
    return secrets.token_urlsafe(32)


class _CodeGrant(grants.AuthorizationCodeGrant):  # type: ignore[misc]
    TOKEN_ENDPOINT_AUTH_METHODS = ["client_secret_basic", "client_secret_post", "none"]

    def save_authorization_code(self, code: str, request: Any) -> None:
        data = request.payload.data
        _realm_of(self).codes[code] = Code(
            code=code,
            client_id=request.client.client_id,
            redirect_uri=request.payload.redirect_uri,
            scope=request.payload.scope,
            username=request.user.username,
            nonce=data.get("nonce"),
            code_challenge=data.get("code_challenge"),
            code_challenge_method=data.get("code_challenge_method"),
            auth_time=int(time.time()),
        )

    def query_authorization_code(self, code: str, client: Client) -> Code | None:
        found = _realm_of(self).codes.get(code)
        return found if found and found.client_id == client.client_id else None

    def delete_authorization_code(self, authorization_code: Code) -> None:
        _realm_of(self).codes.pop(authorization_code.code, None)

    def authenticate_user(self, authorization_code: Code) -> User | None:
        return _realm_of(self).user(authorization_code.username)


class _OpenIDCode(OpenIDCode):  # type: ignore[misc]
    def __init__(self, realm: Realm) -> None:
        super().__init__(require_nonce=True)
        self.realm = realm

    def exists_nonce(self, nonce: str, request: Any) -> bool:
        return any(c.nonce == nonce for c in self.realm.codes.values())

    def resolve_client_private_key(self, client: Client) -> KeySet:
        return self.realm.signing_keys()

    def get_client_algorithm(self, client: Client) -> str:
        return "RS256"

    def get_encode_header(self, client: Client) -> dict[str, str]:
        return {"alg": "RS256", "kid": str(self.realm.keys[0].kid)}

    def get_client_claims(self, client: Client) -> dict[str, Any]:
        return {
            "iss": self.realm.issuer,
            "aud": [client.client_id],
            "exp": int(time.time()) + self.realm.token_lifetime,
        }

    def generate_user_info(self, user: User, scope: str) -> UserInfo:
        return UserInfo(sub=user.sub, **self.realm.claims(user))


class _RefreshGrant(grants.RefreshTokenGrant):  # type: ignore[misc]
    TOKEN_ENDPOINT_AUTH_METHODS = ["client_secret_basic", "client_secret_post", "none"]
    INCLUDE_NEW_REFRESH_TOKEN = True  # rotated at each use

    def authenticate_refresh_token(self, refresh_token: str) -> Refresh | None:
        found = _realm_of(self).refresh.get(refresh_token)
        return found if found and not found.revoked else None

    def authenticate_user(self, refresh_token: Refresh) -> User | None:
        return _realm_of(self).user(refresh_token.username)

    def revoke_old_credential(self, refresh_token: Refresh) -> None:
        refresh_token.revoked = True


class _DeviceEndpoint(DeviceAuthorizationEndpoint):  # type: ignore[misc]
    INTERVAL = 1  # seconds between polls: the tests' users approve at once

    def get_verification_uri(self) -> str:
        return f"{self.server.realm.issuer}/device"

    def save_device_credential(self, client_id: str, scope: str, data: dict[str, Any]) -> None:
        credential = DeviceCredentialDict(
            client_id=client_id, scope=scope, expires_at=time.time() + self.EXPIRES_IN, **data
        )
        self.server.realm.devices[data["device_code"]] = credential


class _DeviceGrant(DeviceCodeGrant):  # type: ignore[misc]
    def query_device_credential(self, device_code: str) -> DeviceCredentialDict | None:
        return _realm_of(self).devices.get(device_code)

    def query_user_grant(self, user_code: str) -> tuple[User, bool] | None:
        realm = _realm_of(self)
        found = realm.device_grants.get(user_code)
        if found is None:
            return None
        user = realm.user(found[0])
        return (user, found[1]) if user is not None else None

    def should_slow_down(self, credential: DeviceCredentialDict) -> bool:
        return False


class Provider:
    def __init__(self, base_url: str, admin_secret: str) -> None:
        self.base_url = base_url
        self.admin_secret = admin_secret
        self.realms: dict[str, Realm] = {}
        self.lock = threading.RLock()


def create_app(provider: Provider) -> flask.Flask:
    app = flask.Flask(__name__)

    def realm_or_404(name: str) -> Realm:
        realm = provider.realms.get(name)
        if realm is None:
            flask.abort(404)
        return realm

    def admin() -> None:
        given = flask.request.headers.get("X-Admin-Secret", "")
        if not hmac.compare_digest(given, provider.admin_secret):
            flask.abort(401)

    @app.get("/health")
    def health() -> Any:
        return {"ok": True, "realms": len(provider.realms)}

    @app.get("/realms/<name>/.well-known/openid-configuration")
    def discovery(name: str) -> Any:
        realm = realm_or_404(name)
        issuer = realm.issuer
        return {
            "issuer": issuer,
            "authorization_endpoint": f"{issuer}/authorize",
            "token_endpoint": f"{issuer}/token",
            "device_authorization_endpoint": f"{issuer}/device_authorization",
            "jwks_uri": f"{issuer}/jwks",
            "end_session_endpoint": f"{issuer}/logout",
            "response_types_supported": ["code"],
            "grant_types_supported": [
                "authorization_code",
                "refresh_token",
                DeviceCodeGrant.GRANT_TYPE,
            ],
            "code_challenge_methods_supported": ["S256"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "scopes_supported": SCOPES.split(),
            "token_endpoint_auth_methods_supported": [
                "client_secret_basic",
                "client_secret_post",
                "none",
            ],
        }

    @app.get("/realms/<name>/jwks")
    def jwks(name: str) -> Any:
        realm = realm_or_404(name)
        with realm.lock:
            return realm.public_keys()

    @app.route("/realms/<name>/authorize", methods=["GET", "POST"])
    def authorize(name: str) -> Any:
        realm = realm_or_404(name)
        with realm.lock:
            try:
                grant = realm.server.get_consent_grant(end_user=None)
            except OAuth2Error as error:
                return realm.server.handle_error_response(None, error)
            if flask.request.method == "GET":
                return _login_form(flask.request.full_path, "")
            user = _login(realm)
            if user is None:
                return _login_form(flask.request.full_path, "wrong user name or password"), 401
            return realm.server.create_authorization_response(grant_user=user, grant=grant)

    @app.post("/realms/<name>/token")
    def token(name: str) -> Any:
        realm = realm_or_404(name)
        with realm.lock:
            return realm.server.create_token_response()

    @app.post("/realms/<name>/device_authorization")
    def device_authorization(name: str) -> Any:
        realm = realm_or_404(name)
        with realm.lock:
            return realm.server.create_endpoint_response("device_authorization")

    @app.route("/realms/<name>/device", methods=["GET", "POST"])
    def device(name: str) -> Any:
        realm = realm_or_404(name)
        if flask.request.method == "GET":
            return _device_form(flask.request.args.get("user_code", ""))
        with realm.lock:
            user_code = flask.request.form.get("user_code", "")
            if not any(d["user_code"] == user_code for d in realm.devices.values()):
                return "unknown code", 400
            user = _login(realm)
            if user is None:
                return "wrong user name or password", 401
            approved = flask.request.form.get("action", "approve") == "approve"
            realm.device_grants[user_code] = (user.username, approved)
        return "done: return to your terminal"

    @app.get("/realms/<name>/logout")
    def logout(name: str) -> Any:
        realm_or_404(name)
        target = flask.request.args.get("post_logout_redirect_uri")
        return flask.redirect(target) if target else "logged out"

    @app.put("/admin/realms/<name>")
    def put_realm(name: str) -> Any:
        admin()
        body = flask.request.get_json()
        with provider.lock:
            realm = Realm(name, provider.base_url, int(body.get("token_lifetime", 300)))
            for c in body.get("clients", []):
                realm.clients[c["client_id"]] = Client(
                    c["client_id"], c.get("secret"), list(c.get("redirect_uris", []))
                )
            provider.realms[name] = realm
        return {"issuer": realm.issuer}, 201

    @app.put("/admin/realms/<name>/clients/<client_id>")
    def put_client(name: str, client_id: str) -> Any:
        admin()
        realm = realm_or_404(name)
        body = flask.request.get_json()
        with realm.lock:
            realm.clients[client_id] = Client(
                client_id, body.get("secret"), list(body.get("redirect_uris", []))
            )
        return "", 204

    @app.put("/admin/realms/<name>/users/<username>")
    def put_user(name: str, username: str) -> Any:
        admin()
        realm = realm_or_404(name)
        body = flask.request.get_json()
        with realm.lock:
            old = realm.users.get(username)
            realm.users[username] = User(
                username,
                body.get("password", old.password if old else secrets.token_hex(8)),
                list(body.get("groups", old.groups if old else [])),
                old.sub if old else str(uuid.uuid4()),
            )
        return {"sub": realm.users[username].sub}

    @app.delete("/admin/realms/<name>/users/<username>")
    def delete_user(name: str, username: str) -> Any:
        admin()
        realm = realm_or_404(name)
        with realm.lock:
            realm.users.pop(username, None)
            for refresh in realm.refresh.values():
                if refresh.username == username:
                    refresh.revoked = True
        return "", 204

    @app.post("/admin/realms/<name>/rotate")
    def rotate(name: str) -> Any:
        """A new signing key; `retire: true` also stops publishing the older ones."""
        admin()
        realm = realm_or_404(name)
        with realm.lock:
            retire = bool((flask.request.get_json(silent=True) or {}).get("retire"))
            realm.keys = [new_key(), *([] if retire else realm.keys)]
        return {"kid": realm.keys[0].kid}

    return app


def _login(realm: Realm) -> User | None:
    form = flask.request.form
    user = realm.user(form.get("username", ""))
    if user is None or not hmac.compare_digest(user.password, form.get("password", "")):
        return None
    return user


def _login_form(action: str, error: str) -> str:
    return (
        f"<form method=post action='{html.escape(action)}'><p>{html.escape(error)}</p>"
        "<input name=username><input name=password type=password>"
        "<button>Sign in</button></form>"
    )


def _device_form(user_code: str) -> str:
    return (
        f"<form method=post><input name=user_code value='{html.escape(user_code)}'>"
        "<input name=username><input name=password type=password>"
        "<button name=action value=approve>Approve</button>"
        "<button name=action value=deny>Deny</button></form>"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9443)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--state-dir", required=True)
    args = parser.parse_args()
    secret = (Path(args.state_dir) / "admin.secret").read_text().strip()
    provider = Provider(f"https://{args.host}:{args.port}", secret)
    from werkzeug.serving import run_simple

    run_simple(
        args.host,
        args.port,
        create_app(provider),
        threaded=True,
        ssl_context=(args.cert, args.key),
    )


if __name__ == "__main__":
    main()
