"""The web UI's pure parts: launch forms from JSON Schemas, edited parameters, compare rows,
chart series, live event encoding, redirects, and the task list's filter test."""

from __future__ import annotations

from starlette.datastructures import FormData

from broker.domain import Task, TaskSpec, TaskState
from broker.store.web import TaskFilter
from broker.tasks.schemas import TaskOut
from broker.web import forms
from broker.web.live import _json, event
from broker.web.pages_tasks import chart_data, compare_rows, edited_parameters
from broker.web.ui import safe_next

SCHEMA = {
    "type": "object",
    "required": ["image"],
    "properties": {
        "image": {"type": "string", "title": "Image", "default": "jupyter/base"},
        "gpus": {"type": "integer", "minimum": 0, "maximum": 8, "default": 1},
        "lr": {"type": "number"},
        "tensorboard": {"type": "boolean", "default": True},
        "size": {"enum": ["small", "large"], "type": "string", "default": "small"},
        "extra": {"type": "object", "description": "anything else"},
    },
}


def test_a_launch_form_has_one_field_per_property_typed_as_the_schema_says() -> None:
    found = {f.name: f for f in forms.fields(SCHEMA)}
    assert [f.kind for f in found.values()] == [
        "text",
        "integer",
        "number",
        "checkbox",
        "select",
        "json",
    ]
    assert found["image"].required and found["image"].label == "Image"
    assert found["gpus"].minimum == "0" and found["gpus"].maximum == "8"
    assert found["size"].options == ("small", "large")
    assert found["extra"].help == "anything else"


def test_form_values_come_back_typed_and_bad_ones_go_to_the_api_as_given() -> None:
    form = FormData(
        [
            ("field.image", "pytorch"),
            ("field.gpus", "2"),
            ("field.lr", "0.01"),
            ("field.size", "large"),
            ("field.extra", '{"a": 1}'),
        ]
    )
    assert forms.values(SCHEMA, form) == {
        "image": "pytorch",
        "gpus": 2,
        "lr": 0.01,
        "tensorboard": False,
        "size": "large",
        "extra": {"a": 1},
    }
    assert forms.values(SCHEMA, FormData([("field.gpus", "two")]))["gpus"] == "two"


def test_edited_parameters_keep_their_types() -> None:
    original = {"lr": 0.1, "name": "run", "layers": [1, 2]}
    form = FormData(
        [("param.lr", "0.01"), ("param.name", "42"), ("param.layers", "[3]"), ("csrf", "x")]
    )
    assert edited_parameters(original, form) == {"lr": 0.01, "name": "42", "layers": [3]}


def _out(task_id: int, name: str, scalars: list[dict], **fields: object) -> TaskOut:
    task = Task(
        task_id,
        TaskSpec(("python", "train.py"), "cpu", name=name),
        "alice",
        None,
        TaskState.COMPLETED,
    )
    out = TaskOut.of(task)
    out.scalars = scalars
    for key, value in fields.items():
        setattr(out, key, value)
    return out


def test_compare_marks_the_fields_that_differ_and_overlays_scalars_by_step() -> None:
    a = _out(
        1,
        "lr 0.1",
        [{"name": "loss", "value": 1.0, "step": 0}, {"name": "loss", "value": 0.5, "step": 1}],
    )
    b = _out(
        2,
        "lr 0.2",
        [{"name": "loss", "value": 0.9, "step": 0}, {"name": "acc", "value": 0.7, "step": None}],
    )
    rows = {name: differs for name, _, differs in compare_rows([a, b])}
    assert rows["name"] and not rows["resource"] and not rows["command"]
    charts = chart_data([a, b])["charts"]
    assert [c["name"] for c in charts] == ["acc", "loss"]
    loss = charts[1]["series"]
    assert loss == [
        {"label": "task 1", "points": [[0, 1.0], [1, 0.5]]},
        {"label": "task 2", "points": [[0, 0.9]]},
    ]
    assert charts[0]["series"] == [{"label": "task 2", "points": [[1, 0.7]]}]  # by order


def test_an_event_puts_every_line_in_its_own_data_field() -> None:
    assert event("console", "a\nb\r\nc\rd", "5:1") == (
        "event: console\nid: 5:1\ndata: a\ndata: b\ndata: c\ndata: d\n\n"
    )
    assert (
        _json([{"name": "</script><b>&"}])
        == '[{"name": "\\u003c/script\\u003e\\u003cb\\u003e\\u0026"}]'
    )


def test_sign_in_returns_only_to_a_path_on_this_server() -> None:
    assert safe_next("/tasks/3?x=1") == "/tasks/3?x=1"
    for bad in ("https://evil.example", "//evil.example/x", "/\\evil.example", "", None, "tasks"):
        assert safe_next(bad) == "/"


def test_the_live_filter_matches_as_the_query_does() -> None:
    task = Task(
        7,
        TaskSpec(("x",), "cpu", name="Sweep LR", project="vision"),
        "alice",
        None,
        TaskState.QUEUED,
    )
    assert TaskFilter(
        owner="alice", states=(TaskState.QUEUED,), project="vision", search="lr"
    ).matches(task)
    assert TaskFilter(search="VIS").matches(task)
    assert not TaskFilter(owner="bob").matches(task)
    assert not TaskFilter(states=(TaskState.RUNNING,)).matches(task)
    assert not TaskFilter(project="audio").matches(task)
    assert not TaskFilter(search="resnet").matches(task)
