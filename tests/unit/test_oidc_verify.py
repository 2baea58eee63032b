"""What the server accepts of a single sign-on token, on tokens signed here: the provider's
keys and discovery document are set in advance, so nothing is fetched."""

from __future__ import annotations

import base64
import json
import time

import pytest
from joserfc import jwt
from joserfc.jwk import KeySet, OctKey, RSAKey

from broker.identity.oidc import InvalidToken, Provider
from broker.identity_settings import OidcFile

ISSUER = "https://sso.example.com/realms/acme"
KEY = RSAKey.generate_key(2048, parameters={"kid": "k1", "alg": "RS256"})


@pytest.fixture
def provider() -> Provider:
    found = Provider(OidcFile(issuer=ISSUER, client_id="klique", clock_leeway=0))
    found._discovery = {"issuer": ISSUER, "jwks_uri": f"{ISSUER}/jwks"}
    found._discovery_at = time.time()
    found._keys = KeySet([RSAKey.import_key(KEY.as_dict(private=False))])
    found._keys_at = time.time()
    found._refetches = 0  # nothing may be fetched
    return found


class In:
    """A time this many seconds from when the token is made (parameters are made long before
    a parallel run reaches their test)."""

    def __init__(self, seconds: int) -> None:
        self.seconds = seconds


def claims(**changes: object) -> dict[str, object]:
    now = int(time.time())
    base: dict[str, object] = {"iss": ISSUER, "aud": "klique", "sub": "u1", "exp": now + 60}
    base |= {"iat": now, "preferred_username": "alice"}
    made = {k: now + v.seconds if isinstance(v, In) else v for k, v in (base | changes).items()}
    return {k: v for k, v in made.items() if v is not None}


def signed(payload: dict[str, object], key: object = KEY, header: dict | None = None) -> str:
    return jwt.encode(header or {"alg": "RS256", "kid": "k1"}, payload, key)


def test_a_good_token_gives_its_claims(provider) -> None:
    assert provider.verify(signed(claims()))["preferred_username"] == "alice"


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"iss": "https://evil.example.com"}, "issued by 'https://evil.example.com'"),
        ({"aud": "another-app"}, "meant for 'another-app'"),
        ({"exp": In(-1)}, "it has expired"),
        ({"exp": None}, "'exp' is missing or invalid"),
        ({"sub": None}, "'sub' is missing or invalid"),
        ({"nbf": In(600)}, "'nbf' is missing or invalid"),
    ],
)
def test_claims_are_checked(provider, changes, reason) -> None:
    with pytest.raises(InvalidToken, match=reason):
        provider.verify(signed(claims(**changes)))


def test_a_token_signed_by_another_key_under_the_same_key_id_is_refused(provider) -> None:
    forger = RSAKey.generate_key(2048, parameters={"kid": "k1"})
    with pytest.raises(InvalidToken, match="signature does not verify"):
        provider.verify(signed(claims(), forger))


def test_a_key_the_provider_does_not_publish_is_refused(provider) -> None:
    other = RSAKey.generate_key(2048, parameters={"kid": "k2"})
    with pytest.raises(InvalidToken, match="does not publish"):
        provider.verify(signed(claims(), other, {"alg": "RS256", "kid": "k2"}))


def _b64(data: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def test_alg_none_is_refused(provider) -> None:
    token = f"{_b64({'alg': 'none', 'kid': 'k1'})}.{_b64(claims())}."
    with pytest.raises(InvalidToken, match="signed with 'none'"):
        provider.verify(token)


def test_hmac_signed_with_the_public_key_is_refused(provider) -> None:
    """The classic confusion: HS256 keyed with the provider's public key, which anyone has."""
    public = json.dumps(KEY.as_dict(private=False)).encode()
    token = jwt.encode({"alg": "HS256", "kid": "k1"}, claims(), OctKey.import_key(public))
    with pytest.raises(InvalidToken, match="signed with 'HS256'"):
        provider.verify(token)


def test_an_id_token_needs_the_login_s_nonce(provider) -> None:
    token = signed(claims(nonce="n-1"))
    assert provider.verify(token, nonce="n-1")["sub"] == "u1"
    with pytest.raises(InvalidToken, match="nonce"):
        provider.verify(token, nonce="n-2")


def test_garbage_is_refused(provider) -> None:
    with pytest.raises(InvalidToken, match="not a signed JWT"):
        provider.verify("a.b.c")
