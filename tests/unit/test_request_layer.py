"""The request layer every HTTP adapter shares (broker/http/): the status of each Klique error,
the session's cookies, and the rule that the adapters (the REST API, the web UI, MCP, the route
proxy) import the layer and never each other."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from starlette.responses import Response

from broker.errors import (
    Conflict,
    EstateError,
    IllegalTransition,
    KliqueError,
    NotFound,
    NotPermitted,
    SubmitUnknown,
    TooLarge,
)
from broker.http.cookies import (
    CSRF_COOKIE,
    SESSION_COOKIE,
    clear_session_cookies,
    set_session_cookies,
)
from broker.http.errors import error_answer, status_of

BROKER = Path(__file__).resolve().parents[2] / "broker"
ADAPTERS = ("api", "web", "mcp", "route_proxy")


class NoSuchPool(NotFound):
    """A kind the table does not name: it answers as its nearest named ancestor."""


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (NotFound("no task 7"), 404),
        (NoSuchPool("no pool p"), 404),
        (NotPermitted("not yours"), 403),
        (Conflict("the task has ended"), 409),
        (TooLarge("over the limit"), 413),
        (EstateError(["line 3: no such pool"]), 400),
        (IllegalTransition("queued -> completed"), 400),
        (SubmitUnknown("sbatch timed out"), 400),
        (KliqueError("anything else"), 400),
    ],
)
def test_each_kind_of_error_has_one_status(error: KliqueError, status: int) -> None:
    assert status_of(error) == status
    answer = error_answer(error)
    assert answer.status_code == status
    assert json.loads(bytes(answer.body)) == {"detail": str(error)}


def test_a_session_cookie_is_never_a_scripts_and_the_old_csrf_cookie_goes() -> None:
    response = Response()
    set_session_cookies(response, "secret-session", secure=True)
    set, cleared = response.headers.getlist("set-cookie")
    assert set.startswith(f"{SESSION_COOKIE}=secret-session;")
    assert "HttpOnly" in set and "SameSite=lax" in set and "Secure" in set and "Path=/" in set
    assert cleared.startswith(f'{CSRF_COOKIE}="";') and "Max-Age=0" in cleared

    ended = Response()
    clear_session_cookies(ended)
    names = [c.split("=", 1)[0] for c in ended.headers.getlist("set-cookie")]
    assert names == [SESSION_COOKIE, CSRF_COOKIE]
    assert all("Max-Age=0" in c for c in ended.headers.getlist("set-cookie"))


def imported_packages(package: str) -> dict[str, set[str]]:
    """Each module of broker/<package>: the broker packages it imports (anywhere in it)."""
    found: dict[str, set[str]] = {}
    for path in sorted((BROKER / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            else:
                continue
            names |= {m.split(".")[1] for m in modules if m.startswith("broker.")}
        found[str(path.relative_to(BROKER.parent))] = names
    return found


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_an_adapter_imports_no_other_adapter(adapter: str) -> None:
    others = set(ADAPTERS) - {adapter}
    crossing = {
        module: sorted(names & others)
        for module, names in imported_packages(adapter).items()
        if names & others
    }
    assert crossing == {}


def test_the_request_layer_imports_no_adapter_and_not_the_composition() -> None:
    above = {*ADAPTERS, "app", "server", "cli", "demo"}
    crossing = {
        module: sorted(names & above)
        for module, names in imported_packages("http").items()
        if names & above
    }
    assert crossing == {}
