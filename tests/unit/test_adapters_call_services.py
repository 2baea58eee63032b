"""Every adapter (the REST API, the web UI, MCP, the route proxy) calls the services in
broker/tasks/: none reaches past the task service to its control loop (`tasks.loop`), calls the
rules' own modules (records, batches, artifacts) itself, or keeps the app operations' store."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ADAPTERS = ("api", "web", "mcp", "route_proxy")
RULES = {"broker.tasks.records", "broker.tasks.batches", "broker.tasks.artifacts"}
BEHIND_SERVICES = {"broker.store.apps"}  # the app operations' own store (broker/tasks/apps.py)


def reaches_past(source: str) -> list[str]:
    """What a module does that an adapter leaves to a service, with its line."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "loop":
            if isinstance(node.value, ast.Name) and node.value.id == "tasks":
                found.append(f"{node.lineno}: tasks.loop")
        elif isinstance(node, ast.ImportFrom) and node.module in RULES:
            # Their request and answer bodies are an adapter's to read; their functions not.
            calls = [a.name for a in node.names if not a.name[:1].isupper()]
            found += [f"{node.lineno}: {node.module}.{name}" for name in calls]
        elif isinstance(node, ast.ImportFrom) and node.module == "broker.tasks":
            modules = {f"broker.tasks.{a.name}" for a in node.names} & RULES
            found += [f"{node.lineno}: {m}" for m in sorted(modules)]
        elif isinstance(node, ast.ImportFrom) and node.module in BEHIND_SERVICES:
            found.append(f"{node.lineno}: {node.module}")
    return found


def test_the_check_sees_each_way_past_a_service() -> None:
    source = (
        "from broker.tasks import records\n"
        "from broker.tasks.batches import BatchOut, create_many\n"
        "from broker.store.apps import AppStore\n"
        "def f(tasks):\n    return tasks.loop\n"
        "def g(service):\n    return service.out\n"
    )
    assert reaches_past(source) == [
        "1: broker.tasks.records",
        "2: broker.tasks.batches.create_many",
        "3: broker.store.apps",
        "5: tasks.loop",
    ]


def test_no_adapter_reaches_past_the_services() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{where}"
        for adapter in ADAPTERS
        for path in sorted((ROOT / "broker" / adapter).rglob("*.py"))
        for where in reaches_past(path.read_text())
    ]
    assert found == []
