"""A pipeline step's job: `python3 -m klique step`. Imports the pipeline's script (without
running its main), resolves the step's inputs from the artifacts of the steps before it,
calls the function and uploads what it returns as this task's artifacts."""

from __future__ import annotations

import base64
import importlib.util
import os
import pickle
import sys

from klique._api import KliqueError
from klique.artifacts import File, upload
from klique.task import Task

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List

MODULE = "__klique_pipeline__"  # the script's name here: its `if __name__ == "__main__"` stays shut


def main() -> int:
    task = Task.init()
    if task.running_locally:
        task.fail("a step runs inside a Klique job")
        raise KliqueError("`python3 -m klique step` runs inside a pipeline step's job only")
    params = task.parameters
    spec = params.get("klique.step") or {}
    func = _function(str(spec["script"]), str(spec["function"]))
    args = [_decode(task, a) for a in params.get("args") or []]
    kwargs = {k: _decode(task, v) for k, v in (params.get("kwargs") or {}).items()}
    result = func(*args, **kwargs)
    returns: List[str] = list(spec.get("returns") or ["result"])
    values = [result] if len(returns) == 1 else list(result)
    if len(values) != len(returns):
        raise KliqueError(f"step {spec['function']} returned {len(values)} values for {returns}")
    for name, value in zip(returns, values):  # noqa: B905 (lengths checked; Python 3.8)
        # Only File(...) is a file: a string that happens to name one stays a string.
        upload(task._api, task.id, name, value, as_object=not isinstance(value, File))
    return 0


def _function(script: str, name: str) -> Any:
    path = os.path.abspath(script)
    sys.path.insert(0, os.path.dirname(path))
    loader = importlib.util.spec_from_file_location(MODULE, path)
    if loader is None or loader.loader is None:
        raise KliqueError(f"cannot import the pipeline's script {path}")
    module = importlib.util.module_from_spec(loader)
    sys.modules[MODULE] = module
    loader.loader.exec_module(module)
    found = getattr(module, name, None)
    func = getattr(found, "func", found)
    if not callable(func):
        raise KliqueError(f"{path} has no step {name!r}")
    return func


def _decode(task: Task, value: Dict[str, Any]) -> Any:
    if "artifact" in value:
        ref = value["artifact"]
        return Task(task._api, int(ref["task"])).artifacts[str(ref["name"])].get()
    if "pickle" in value:
        return pickle.loads(base64.b64decode(value["pickle"]))  # noqa: S301 (the owner's own)
    return value.get("value")
