"""The request layer every HTTP adapter shares (the REST API, the web UI, MCP, the route proxy):
who is calling (tokens, browser sessions, scopes, CSRF, report tokens), the cookies that carry
a session, the request-size limit, the ASGI helpers, and the HTTP status of each Klique error.
It knows no adapter; the adapters import it and never each other."""
