"""The company's OpenID Connect provider as the server sees it: its discovery document, its
signing keys (JWKS, fetched again when a token names a key not seen yet: key rotation), the
verification of its tokens, and the code exchange and refresh (Authlib's OAuth 2.0 client).

Verification (joserfc): the signature against the provider's published keys, with an
asymmetric algorithm only (never `none`, never an HMAC that a public key could forge), then
the issuer, the audience, the expiry (and not-before, issued-at), with the estate's clock
leeway (identity.oidc.clock_leeway, 30 s by default).
"""

from __future__ import annotations

import hmac
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from joserfc import jws, jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet

from broker.identity.authlib_httpx import OAuth2Client
from broker.identity_settings import OidcFile

ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA")
_DISCOVERY_TTL_S = 3600.0
_KEYS_TTL_S = 3600.0
# Tokens naming a key not seen yet fetch the keys again: a few at once (a rotation), then one
# every 2 s at most, however many forged key ids arrive.
_REFETCH_BURST = 5.0
_REFETCH_EVERY_S = 2.0


class InvalidToken(Exception):
    """A token Klique does not accept; the message says why, in words for its holder."""


class ProviderUnreachable(Exception):
    """The provider's discovery document or keys could not be read."""


class Provider:
    def __init__(self, settings: OidcFile) -> None:
        self.settings = settings
        self.audience = settings.audience or settings.client_id
        self.http = httpx.Client(timeout=10.0, verify=_tls(settings.ca_file))
        self._lock = threading.Lock()
        self._discovery: dict[str, Any] | None = None
        self._discovery_at = 0.0
        self._keys: KeySet | None = None
        self._keys_at = 0.0
        self._refetches = _REFETCH_BURST
        self._refetch_at = time.time()

    def close(self) -> None:
        self.http.close()

    # Discovery and keys

    def discovery(self) -> dict[str, Any]:
        with self._lock:
            if self._discovery is None or time.time() - self._discovery_at > _DISCOVERY_TTL_S:
                self._discovery = self._fetch_discovery()
                self._discovery_at = time.time()
            return self._discovery

    def endpoint(self, name: str) -> str:
        url = self.discovery().get(name)
        if not isinstance(url, str) or not url.startswith("https://"):
            raise ProviderUnreachable(f"the provider's discovery document has no https {name}")
        return url

    def _fetch_discovery(self) -> dict[str, Any]:
        issuer = self.settings.issuer.rstrip("/")
        document = self._get_json(f"{issuer}/.well-known/openid-configuration")
        # OpenID Connect Discovery 1.0, 4.3: the document's issuer must be the one asked for.
        if document.get("issuer") != self.settings.issuer:
            raise ProviderUnreachable(
                f"the provider at {issuer} calls itself {document.get('issuer')!r}; fix "
                "identity.oidc.issuer in the estate to match it exactly"
            )
        return document

    def keys(self, wanted_kid: str | None = None) -> KeySet:
        """The provider's signing keys; fetched again when `wanted_kid` is not among them (a
        rotated key), within a budget."""
        uri = self.endpoint("jwks_uri")
        with self._lock:
            now = time.time()
            stale = self._keys is None or now - self._keys_at > _KEYS_TTL_S
            unknown = wanted_kid is not None and not _has_kid(self._keys, wanted_kid)
            if stale or (unknown and self._may_refetch(now)):
                self._keys_at = now
                self._keys = KeySet.import_key_set(self._get_json(uri))  # type: ignore[arg-type]
            assert self._keys is not None
            return self._keys

    def _may_refetch(self, now: float) -> bool:
        elapsed = now - self._refetch_at
        self._refetches = min(_REFETCH_BURST, self._refetches + elapsed / _REFETCH_EVERY_S)
        self._refetch_at = now
        if self._refetches < 1:
            return False
        self._refetches -= 1
        return True

    def _get_json(self, url: str) -> dict[str, Any]:
        try:
            response = self.http.get(url)
            response.raise_for_status()
            data = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise ProviderUnreachable(f"cannot read {url}: {exc}") from exc
        if not isinstance(data, dict):
            raise ProviderUnreachable(f"{url} did not answer a JSON object")
        return data

    # Tokens

    def verify(
        self, token: str, nonce: str | None = None, audience: str | None = None
    ) -> dict[str, Any]:
        """The claims of a token the provider signed for Klique (an access token for
        `self.audience`, or an ID token for `audience`, the client id); InvalidToken otherwise."""
        try:
            header = jws.extract_compact(token.encode()).headers()
        except (JoseError, ValueError, UnicodeError) as exc:
            raise InvalidToken("not a signed JWT") from exc
        alg, kid = header.get("alg"), header.get("kid")
        if alg not in ALGORITHMS:
            raise InvalidToken(f"signed with {alg!r}; Klique accepts {', '.join(ALGORITHMS)}")
        keys = self.keys(kid if isinstance(kid, str) else None)
        if isinstance(kid, str) and not _has_kid(keys, kid):
            raise InvalidToken(f"signed with key {kid!r}, which the provider does not publish")
        try:
            decoded = jwt.decode(token, keys, algorithms=list(ALGORITHMS))
        except (JoseError, ValueError) as exc:
            raise InvalidToken(f"its signature does not verify ({exc.__class__.__name__})") from exc
        claims = dict(decoded.claims)
        registry = jwt.JWTClaimsRegistry(
            leeway=self.settings.clock_leeway,
            iss={"essential": True, "value": self.settings.issuer},
            aud={"essential": True, "values": [audience or self.audience]},
            exp={"essential": True},
            sub={"essential": True},
        )
        try:
            registry.validate(claims)
        except JoseError as exc:
            raise InvalidToken(_claim_problem(exc, claims)) from exc
        if nonce is not None and not hmac.compare_digest(str(claims.get("nonce", "")), nonce):
            raise InvalidToken("its nonce is not the one this login sent")
        return claims

    # OAuth 2.0 flows (Authlib)

    def client(self, redirect_uri: str | None = None) -> OAuth2Client:
        secret = _secret(self.settings.client_secret_file)
        return OAuth2Client(
            client_id=self.settings.client_id,
            client_secret=secret,
            token_endpoint_auth_method="client_secret_basic" if secret else "none",
            redirect_uri=redirect_uri,
            scope=" ".join(self.settings.scopes),
            code_challenge_method="S256",
            timeout=10.0,
            verify=_tls(self.settings.ca_file),
        )

    def exchange(self, code: str, redirect_uri: str, verifier: str) -> dict[str, Any]:
        with self.client(redirect_uri) as oauth:
            return dict(
                oauth.fetch_token(
                    self.endpoint("token_endpoint"),
                    grant_type="authorization_code",
                    code=code,
                    code_verifier=verifier,
                )
            )

    def refresh(self, refresh_token: str) -> dict[str, Any]:
        with self.client() as oauth:
            return dict(
                oauth.refresh_token(self.endpoint("token_endpoint"), refresh_token=refresh_token)
            )


def _tls(ca_file: str | None) -> Any:
    import ssl

    return ssl.create_default_context(cafile=ca_file) if ca_file else True


def _secret(path: str | None) -> str | None:
    return Path(path).read_text().strip() if path else None


def _has_kid(keys: KeySet | None, kid: str) -> bool:
    return keys is not None and any(k.kid == kid for k in keys)


def _claim_problem(exc: JoseError, claims: dict[str, Any]) -> str:
    name = getattr(exc, "claim", None) or str(exc)
    if exc.__class__.__name__ == "ExpiredTokenError":
        return "it has expired"
    if name == "iss":
        return f"it was issued by {claims.get('iss')!r}, not by this server's provider"
    if name == "aud":
        return f"it is meant for {claims.get('aud')!r}, not for this Klique server"
    return f"its claim {name!r} is missing or invalid"
