"""The MCP tools: the CLI's verbs for agents. Each one calls the REST API as the caller
(broker/mcp/calls.py) and returns what the API answered, as JSON text."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer

from broker.mcp.calls import Api, as_text, wait_for_refusal

TASK_FIELDS = ("id", "name", "state", "reason", "resource", "pool", "project", "exit_code")


def register(server: MCPServer, api: Api) -> None:
    """Every tool, bound to the API."""

    @server.tool()
    async def list_compute_resources() -> str:
        """The compute resources (sizes of GPU, CPU, memory, walltime) and whether your team may
        use each."""
        return as_text(await api.call("GET", "/resources"))

    @server.tool()
    async def submit_task(
        command: list[str],
        resource: str | None = None,
        project: str = "default",
        name: str = "",
        env: dict[str, str] | None = None,
        requirements: list[str] | None = None,
        image: str | None = None,
    ) -> str:
        """Submit a command (an argv list, run without a shell) as a task on a compute resource.
        Requirements are pip packages for the task's environment."""
        body = {
            "command": command,
            "resource": resource,
            "project": project,
            "name": name,
            "env": env or {},
            "requirements": requirements or [],
            "image": image,
        }
        task = await api.call("POST", "/tasks", json=body)
        task = await wait_for_refusal(api, task)
        return as_text({k: task.get(k) for k in TASK_FIELDS})

    @server.tool()
    async def show_task(task_id: int) -> str:
        """One of your tasks: command, state history, exit code and scalars."""
        return as_text(await api.call("GET", f"/tasks/{task_id}"))

    @server.tool()
    async def task_logs(task_id: int, offset: int = 0) -> str:
        """A task's console from a byte offset (the answer says where to go on from)."""
        return as_text(await api.call("GET", f"/tasks/{task_id}/logs", params={"offset": offset}))

    @server.tool()
    async def why_task(task_id: int) -> str:
        """Why a task waits: the primary reason and what each pool said."""
        return as_text(await api.call("GET", f"/tasks/{task_id}/why"))

    @server.tool()
    async def cancel_task(task_id: int) -> str:
        """Cancel one of your tasks, queued or running."""
        task = await api.call("POST", f"/tasks/{task_id}/cancel")
        return as_text({k: task.get(k) for k in TASK_FIELDS})

    @server.tool()
    async def list_runs(state: str | None = None, limit: int = 50) -> str:
        """Your tasks, newest first; `state` filters (comma-separated: running,queued,...)."""
        params: dict[str, Any] = {"limit": limit}
        if state:
            params["state"] = state
        tasks = await api.call("GET", "/tasks", params=params)
        return as_text([{k: t.get(k) for k in TASK_FIELDS} for t in tasks])

    @server.tool()
    async def compare_runs(task_ids: list[int]) -> str:
        """Runs side by side: command, resource, state, exit code, runtime, last scalars."""
        rows = []
        for task_id in task_ids[:20]:
            task = await api.call("GET", f"/tasks/{task_id}")
            rows.append(_comparison(task))
        return as_text(rows)

    @server.tool()
    async def usage(by: str = "project", since_days: float | None = None) -> str:
        """GPU-hours and wall time from the ledger (yours), by team, project, user, pool or
        resource."""
        import time

        params: dict[str, Any] = {"by": by}
        if since_days is not None:
            params["since"] = time.time() - since_days * 86400
        return as_text(await api.call("GET", "/usage", params=params))

    @server.tool()
    async def list_apps() -> str:
        """The app catalogue (sessions and endpoints) with their launch forms, and your running
        apps with their routes."""
        catalogue = await api.call("GET", "/apps")
        running = await api.call("GET", "/apps/instances")
        return as_text({"catalogue": catalogue, "running": running})

    @server.tool()
    async def launch_app(
        app: str,
        resource: str | None = None,
        params: dict[str, Any] | None = None,
        name: str = "",
        project: str = "default",
        route: str | None = None,
        teams: list[str] | None = None,
    ) -> str:
        """Launch an app (jupyter, shell, vllm, sglang, http): it runs as a task until stopped or
        its walltime; its route is https://SERVER/routes/ROUTE/."""
        body = {
            "resource": resource,
            "params": params or {},
            "name": name,
            "project": project,
            "route": route,
            "teams": teams or [],
        }
        return as_text(await api.call("POST", f"/apps/{app}/launch", json=body))

    @server.tool()
    async def stop_app(task_id: int) -> str:
        """Stop one of your apps; its compute resource is freed and its runtime metered."""
        return as_text(await api.call("POST", f"/apps/instances/{task_id}/stop"))


def _comparison(task: dict[str, Any]) -> dict[str, Any]:
    start, end = task.get("started_at"), task.get("finished_at")
    last: dict[str, Any] = {}
    for scalar in task.get("scalars") or []:
        last[scalar["name"]] = scalar["value"]
    return {
        "id": task["id"],
        "name": task["name"],
        "command": task["command"],
        "resource": task["resource"],
        "state": task["state"],
        "exit_code": task["exit_code"],
        "runtime_s": round(end - start, 3) if start and end else None,
        "scalars": last,
    }
