"""Authlib's OAuth 2.0 client over httpx, the HTTP client Klique uses everywhere.

Authlib 1.9 prefers the httpx2 fork and warns, once, at import, when it falls back to httpx;
the fallback is the supported path until Authlib 2 (pyproject.toml pins below it)."""

from __future__ import annotations

import warnings

from authlib.deprecate import AuthlibDeprecationWarning

with warnings.catch_warnings():
    warnings.simplefilter("ignore", AuthlibDeprecationWarning)
    from authlib.integrations.base_client import OAuthError
    from authlib.integrations.httpx_client import OAuth2Client

__all__ = ["OAuth2Client", "OAuthError"]
