"""Apps in integration and security tests: launching them through the API, waiting for their
routes, a tiny HTTP server as an app, and a real headless Chromium (Debian's) for pages."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from conftest import TASK_PY, Server, wait_for

# An HTTP app: answers every request with its instance's name, the path and the headers it
# received, as JSON; `/set-cookie` also sends what an app may not: Klique's own cookies (the
# route's, a browser session's, its old CSRF cookie) under their names and in disguise (nameless,
# another case, a prefix), cookies for a wider domain or path, Clear-Site-Data, and two cookies
# an app may set (no path; a path inside its route, which X-Forwarded-Prefix names). `/page` is
# an HTML page (for a browser: its scripts run on the route's origin).
PLANTED = [
    "klique_route=planted; Path=/",
    "klique_session=planted; Path=/",
    "klique_csrf=planted; Path=/",
    "=klique_session=nameless; Path=/",
    "KLIQUE_SESSION=upper",
    "__Host-klique_session=prefixed; Path=/; Secure",
    "wide=1; Path=/",
    "dom=1; Domain=127.0.0.1",
    "climb=1; Path=/routes/other/",
]
ECHO = f"""
import http.server, json, sys
PLANTED = {PLANTED!r}
port, name = int(sys.argv[1]), sys.argv[2]
class Echo(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({{"name": name, "path": self.path,
                           "headers": {{k.lower(): v for k, v in self.headers.items()}}}}).encode()
        self.send_response(200)
        if self.path.endswith("/set-cookie"):
            prefix = self.headers.get("X-Forwarded-Prefix", "")
            for cookie in PLANTED + ["app_cookie=fine", "app_path=1; Path=" + prefix + "/"]:
                self.send_header("Set-Cookie", cookie)
            self.send_header("Clear-Site-Data", '"cookies", "storage"')
            self.send_header("X-Klique-User", "admin")
        if self.path.endswith("/page"):  # a page for a browser, whose scripts run as the app's
            body = b"<!doctype html><title>app</title><p>" + name.encode() + b"</p>"
            self.send_header("Content-Type", "text/html")
        else:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_POST = do_GET
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), Echo).serve_forever()
"""


def echo_command(name: str) -> list[str]:
    return [TASK_PY, "-c", ECHO, "{port}", name]


def launch(server: Server, token: str, app: str, **body: Any) -> dict[str, Any]:
    with server.api(token) as api:
        answer = api.post(f"/apps/{app}/launch", json=body)
    assert answer.status_code == 201, answer.text
    return answer.json()  # type: ignore[no-any-return]


def instance(server: Server, token: str, task_id: int) -> dict[str, Any]:
    with server.api(token) as api:
        return api.get(f"/apps/instances/{task_id}").json()  # type: ignore[no-any-return]


def wait_ready(server: Server, token: str, task_id: int, timeout: float = 60) -> dict[str, Any]:
    """Until the app answers through its route; fails with its console if it ends first."""

    def ready() -> dict[str, Any] | None:
        found = instance(server, token, task_id)
        assert found["state"] not in ("failed", "cancelled", "lost", "timeout", "completed"), (
            found,
            server.cli("logs", str(task_id), token=token).output[-3000:],
        )
        return found if found["ready"] else None

    try:
        return wait_for(ready, timeout, f"app {task_id} to answer through its route", 0.2)
    except AssertionError as exc:
        logs = server.cli("logs", str(task_id), token=token).output[-3000:]
        raise AssertionError(f"{exc}\n{logs}") from None


def stop(server: Server, token: str, task_id: int) -> dict[str, Any]:
    with server.api(token) as api:
        answer = api.post(f"/apps/instances/{task_id}/stop")
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


@contextmanager
def chromium(*flags: str) -> Iterator[Any]:
    """Debian's headless Chromium through its chromedriver (packages chromium, chromium-driver),
    with `flags` added (`--host-resolver-rules=...` for a wildcard domain without DNS)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = "/usr/bin/chromium"
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
        *flags,
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    driver.set_script_timeout(120)
    try:
        yield driver
    finally:
        driver.quit()


# Run in the page: start a kernel through the route's API, then execute 1+1 over the kernel's
# WebSocket (the route's, with the page's cookie) and hand back its result.
RUN_ONE_PLUS_ONE = """
const base = arguments[0], done = arguments[arguments.length - 1];
(async () => {
  const made = await fetch(base + "api/kernels", {method: "POST",
    headers: {"Content-Type": "application/json"}, body: JSON.stringify({name: "python3"})});
  if (!made.ok) { done("starting a kernel: " + made.status + " " + await made.text()); return; }
  const kernel = await made.json();
  const origin = location.origin.replace(/^http/, "ws");
  const url = origin + base + "api/kernels/" + kernel.id + "/channels";
  const ws = new WebSocket(url);
  const session = crypto.randomUUID(), id = crypto.randomUUID();
  ws.onerror = () => done("the kernel's WebSocket failed");
  ws.onclose = (e) => done("the kernel's WebSocket closed: " + e.code);
  ws.onopen = () => ws.send(JSON.stringify({channel: "shell", buffers: [], parent_header: {},
    metadata: {}, header: {msg_id: id, username: "klique", session, version: "5.3",
      msg_type: "execute_request", date: new Date().toISOString()},
    content: {code: "1+1", silent: false, store_history: false, user_expressions: {},
      allow_stdin: false}}));
  ws.onmessage = (event) => {
    const msg = JSON.parse(event.data);
    if (msg.parent_header && msg.parent_header.msg_id === id && msg.msg_type === "execute_result") {
      ws.onclose = null; ws.close(); done(msg.content.data["text/plain"]);
    }
  };
})().catch((e) => done("error: " + e));
"""


@asynccontextmanager
async def mcp_session(server: Server, token: str) -> AsyncIterator[Any]:
    """The official MCP SDK's client, over HTTP, with a Klique token as the bearer."""
    import httpx2
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        streamable_http_client(f"{server.url}/mcp", http_client=http) as streams,
        ClientSession(streams[0], streams[1]) as session,
    ):
        await session.initialize()
        yield session


async def call(session: Any, tool: str, **arguments: Any) -> tuple[bool, str]:
    """(whether the tool refused, its text)."""
    result = await session.call_tool(tool, arguments)
    return bool(result.is_error), result.content[0].text
