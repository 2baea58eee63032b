"""A sweep's expansion (JSON lines, grids, placeholders) and a batch's validation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from broker.sweeps import SweepError, combine, fill, grid, read_lines
from broker.tasks.batches import BatchRequest, SweepRequest


def test_placeholders_fill_each_argument_with_the_values_text():
    params = {"lr": 0.01, "opt": "adam; rm -rf /", "layers": [1, 2], "on": True}
    assert fill("--lr={lr}", params, "x") == "--lr=0.01"
    assert fill("{opt}", params, "x") == "adam; rm -rf /"
    assert fill("{layers}/{on}", params, "x") == "[1, 2]/true"
    assert fill("{{lr}} {}", params, "x") == "{lr} {}"  # doubled braces and {} stay literal


def test_a_missing_key_names_where_and_the_key():
    with pytest.raises(SweepError, match=r"line 3 of p.jsonl has no key 'bs' .*its keys: lr"):
        fill("--bs={bs}", {"lr": 1}, "line 3 of p.jsonl")


def test_a_grid_is_every_combination_in_order():
    points = grid(["lr=0.1,0.01", "opt=adam,sgd"])
    assert [p for _, p in points] == [
        {"lr": 0.1, "opt": "adam"},
        {"lr": 0.1, "opt": "sgd"},
        {"lr": 0.01, "opt": "adam"},
        {"lr": 0.01, "opt": "sgd"},
    ]
    assert points[1][0] == "grid point lr=0.1 opt=sgd"
    assert grid([]) == []


@pytest.mark.parametrize("item", ["lr", "=1,2", "lr=", "not a name=1"])
def test_a_malformed_grid_item_is_refused(item):
    with pytest.raises(SweepError, match="KEY=VALUE"):
        grid([item])


def test_lines_and_a_grid_combine(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"lr": 0.1}\n\n{"lr": 0.2, "bs": 8}\n')
    lines = read_lines(path)
    assert [w for w, _ in lines] == [f"line 1 of {path}", f"line 3 of {path}"]
    both = combine(lines, grid(["bs=16,32"]))
    assert [p for _, p in both] == [
        {"lr": 0.1, "bs": 16},
        {"lr": 0.1, "bs": 32},
        {"lr": 0.2, "bs": 16},
        {"lr": 0.2, "bs": 32},
    ]
    assert combine(lines, []) == lines


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[1, 2]\n", "line 1 .* is not a JSON object"),
        ("{}\n{lr: 1}\n", "line 2 .* is not JSON"),
        ("\n\n", "has no lines"),
    ],
)
def test_a_bad_sweep_file_says_which_line(tmp_path, text, problem):
    path = tmp_path / "p.jsonl"
    path.write_text(text)
    with pytest.raises(SweepError, match=problem):
        read_lines(path)


def test_a_batch_items_error_names_its_index_and_field():
    good = {"command": ["true"]}
    with pytest.raises(ValidationError) as caught:
        BatchRequest.model_validate({"tasks": [good, good, {"command": ["a\x00b"]}]})
    assert [e["loc"] for e in caught.value.errors()] == [("tasks", 2, "command", 0)]
    with pytest.raises(ValidationError) as caught:
        BatchRequest.model_validate({"tasks": [dict(good, owner="bob")]})
    assert caught.value.errors()[0]["loc"] == ("tasks", 0, "owner")
    with pytest.raises(ValidationError):
        BatchRequest.model_validate({"tasks": []})
    with pytest.raises(ValidationError):
        SweepRequest.model_validate({"tasks": [good], "name": "two\nlines"})
    with pytest.raises(ValidationError):
        BatchRequest.model_validate({"tasks": [dict(good, resource="../etc")]})
