"""The SDK's pure parts and the server's: the state paths of local and cached tasks, the
estate's artifacts section, the artifact store, parameters, step inputs, compare and the graph."""

from __future__ import annotations

import ast
import asyncio
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from broker.artifacts import ArtifactStore
from broker.cli.sdk import comparison, draw
from broker.domain import TaskState, can_transition
from broker.errors import EstateError, TooLarge
from broker.estate import parse_estate
from klique import _environment
from klique._step import _decode
from klique.pipeline import Controller, step
from klique.task import _like

ROOT = Path(__file__).resolve().parents[2]
ESTATE = """
resources:
  cpu: {profile: {pools: [p]}}
pools:
  p: {kind: host}
"""


def test_a_local_run_starts_running_and_a_reused_step_starts_completed() -> None:
    assert can_transition(TaskState.CREATED, TaskState.RUNNING)
    assert can_transition(TaskState.CREATED, TaskState.COMPLETED)
    assert can_transition(TaskState.RUNNING, TaskState.QUEUED)  # execute_remotely
    assert not can_transition(TaskState.CREATED, TaskState.SUBMITTED)
    assert not can_transition(TaskState.CREATED, TaskState.TIMEOUT)


def test_the_estate_names_the_artifact_store_its_limit_and_the_pipeline_resource() -> None:
    estate = parse_estate(
        ESTATE + "artifacts: {store: 's3://lab/klique', max_size: 2G}\n"
        "defaults: {pipeline_resource: cpu}\n"
    )
    assert estate.artifacts.store == "s3://lab/klique"
    assert estate.artifacts.max_bytes == 2 << 30
    assert estate.pipeline_resource == "cpu"
    assert parse_estate(ESTATE).artifacts.max_bytes == 10 << 30
    with pytest.raises(EstateError) as found:
        parse_estate(ESTATE + "defaults: {pipeline_resource: gpu}\n", "e.yaml")
    assert "defaults.pipeline_resource: compute resource 'gpu' is not declared" in str(found.value)


async def _chunks(*parts: bytes):  # type: ignore[no-untyped-def]
    for part in parts:
        yield part


def test_the_artifact_store_keeps_content_once_by_digest_and_nothing_past_its_limit(
    tmp_path: Path,
) -> None:
    store = ArtifactStore(None, tmp_path, max_bytes=10)
    digest, size = asyncio.run(store.put(_chunks(b"hello ", b"you")))
    again, _ = asyncio.run(store.put(_chunks(b"hello you")))
    assert (digest, size) == (again, 9)
    assert b"".join(store.read(digest)) == b"hello you"
    assert store.path(digest).endswith(f"/sha256/{digest[:2]}/{digest}")
    with pytest.raises(TooLarge, match="artifacts.max_size"):
        asyncio.run(store.put(_chunks(b"123456", b"789012")))
    assert list((tmp_path / "artifacts" / "tmp").iterdir()) == []
    assert len(list((tmp_path / "artifacts" / "sha256").rglob("*"))) == 2


@pytest.mark.parametrize(
    ("default", "stored", "expected"),
    [(0.1, 0.01, 0.01), (3, "5", 5), (True, "false", False), ("a", 7, "7"), (2, "x", "x")],
)
def test_stored_parameters_take_the_type_of_the_scripts_defaults(default, stored, expected) -> None:
    assert _like(default, stored) == expected and type(_like(default, stored)) is type(expected)


def test_step_inputs_travel_as_json_or_pickles_and_come_back_the_same() -> None:
    controller = Controller(
        SimpleNamespace(_api=None, id=1),  # type: ignore[arg-type]
        {"code": None, "command": ["python3", "flow.py"]},
        "p",
    )
    for value in (3, "text", [1, 2], {"a": {"b": None}}, {1, 2}, (1, "x"), b"raw"):
        encoded = controller._encode(value)
        assert _decode(None, encoded) == value  # type: ignore[arg-type]
    assert controller._encode({"a": 1}) == {"value": {"a": 1}}
    assert "pickle" in controller._encode({1, 2})


def test_a_step_called_outside_a_pipeline_is_a_plain_call() -> None:
    @step(resource="cpu")
    def double(x):  # type: ignore[no-untyped-def]
        return 2 * x

    assert double(4) == 8


def test_compare_puts_parameters_and_last_scalars_side_by_side() -> None:
    tasks = [
        {
            "id": 1,
            "parameters": {"lr": 0.1},
            "scalars": [{"name": "loss", "value": v} for v in (3, 2)],
        },
        {"id": 2, "parameters": {"lr": 0.01, "epochs": 5}, "scalars": []},
    ]
    assert comparison(tasks) == [
        {"what": "param lr", "1": 0.1, "2": 0.01},
        {"what": "param epochs", "1": None, "2": 5},
        {"what": "last loss", "1": 2, "2": None},
    ]


def test_the_graph_puts_each_step_one_stage_after_what_it_reads() -> None:
    def step(i, name, state, needs, reason=""):  # type: ignore[no-untyped-def]
        return {
            "id": i,
            "name": name,
            "state": state,
            "resource": "cpu",
            "pool": "p",
            "needs": needs,
            "reason": reason,
        }

    lines = draw(
        [
            step(1, "prepare", "completed", []),
            step(2, "train", "failed", [1], "exited with code 1"),
            step(3, "other", "running", []),
        ]
    )
    assert lines == [
        "[1] prepare: done on cpu @ p",
        "    └─ [2] train: FAILED on cpu @ p  <- prepare [1]",
        "       exited with code 1",
        "[3] other: running on cpu @ p",
    ]


def test_a_script_in_a_checkout_runs_there_as_it_runs_here(tmp_path: Path, monkeypatch) -> None:
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "train.py").write_text("print(1)\n")
    git = ["git", "-c", "user.email=a@example.com", "-c", "user.name=A"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "."], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "one"], cwd=repo, check=True)
    monkeypatch.chdir(repo)
    monkeypatch.setattr(sys, "argv", ["src/train.py", "--lr", "0.1"])
    found = _environment.origin()
    assert found["command"] == ["python3", "src/train.py", "--lr", "0.1"]
    assert found["code"]["subdir"] == "" and found["code"]["diff"] == ""
    monkeypatch.chdir(tmp_path)  # from outside the checkout: run in the script's folder
    monkeypatch.setattr(sys, "argv", [str(repo / "src" / "train.py")])
    found = _environment.origin()
    assert found["command"] == ["python3", "train.py"] and found["code"]["subdir"] == "src"


def optional_imports(tree: ast.AST) -> set[ast.AST]:
    """The imports in the body of a `try` that catches ImportError: a package the SDK uses
    only where the user has it (Pillow for report_image(image=array), plotly's converter)."""
    guarded: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id == "ImportError" for h in node.handlers
        ):
            guarded |= {n for stmt in node.body for n in ast.walk(stmt)}
    return guarded


def test_the_sdk_is_python_38_and_the_standard_library_only() -> None:
    allowed = set(sys.stdlib_module_names) | {"klique", "inside_job"}
    for path in sorted((ROOT / "klique").glob("*.py")):
        tree = ast.parse(path.read_text(), feature_version=(3, 8))
        optional = optional_imports(tree)
        for node in ast.walk(tree):
            if node in optional:
                continue
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] in allowed, f"{path.name} imports {name}"
