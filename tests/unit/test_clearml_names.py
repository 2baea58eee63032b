"""ClearML's names on klique.Task: connect() of a dict, an argparse.Namespace or an object
(under a section name), connect_configuration() of a dict or a file, in a job whose stored
values (a clone's edits) win."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

from klique.task import Task


def in_a_job(parameters: dict) -> Task:
    """A task as Task.init attaches to it inside a job that cannot reach the API."""
    task = Task(SimpleNamespace(url=""), 7)  # type: ignore[arg-type]
    task._job = {"id": 7, "parameters": parameters}
    return task


def test_connect_takes_a_namespace_or_an_object_and_the_stored_values_win() -> None:
    task = in_a_job({"Args/lr": "0.01", "Args/epochs": 5, "batch": 64})
    args = argparse.Namespace(lr=0.1, epochs=3, name="run")
    assert task.connect(args, name="Args") is args
    assert (args.lr, args.epochs, args.name) == (0.01, 5, "run")  # in the defaults' types

    class Config:
        batch = 32

        def __init__(self) -> None:
            self.batch = 32
            self._private = "kept"

    config = task.connect(Config())
    assert (config.batch, config._private) == (64, "kept")
    plain = {"batch": 16, "other": 1}
    assert task.connect(plain) == {"batch": 64, "other": 1}


def test_connect_configuration_gives_the_stored_dict_or_a_file_with_the_stored_text(
    tmp_path: Path,
) -> None:
    task = in_a_job({"configuration/General": {"layers": 4}, "configuration/file": "edited"})
    assert task.connect_configuration({"layers": 2}) == {"layers": 4}
    original = tmp_path / "config.yaml"
    original.write_text("layers: 2")
    edited = task.connect_configuration(original, name="file")
    assert Path(edited).read_text() == "edited" and Path(edited).suffix == ".yaml"
    same = in_a_job({"configuration/file": "layers: 2"})
    assert same.connect_configuration(str(original), name="file") == str(original)
