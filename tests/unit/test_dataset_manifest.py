"""A dataset version's manifest: names and paths checked, and what a version changes relative
to its parent (only that content is sent and stored)."""

from __future__ import annotations

import pytest

from broker.datasets.manifest import apply, check_manifest, check_name, check_path, diff, new_bytes
from broker.errors import EstateError, KliqueError
from broker.estate import load_estate, parse_estate
from klique._api import KliqueError as SDKError
from klique.datasets import changed, inside
from klique.datasets import check_path as sdk_check_path

A, B, C = "a" * 64, "b" * 64, "c" * 64


def entry(digest: str, size: int = 1) -> dict[str, object]:
    return {"digest": digest, "size": size}


@pytest.mark.parametrize("name", ["images", "v1.2", "a_b-c"])
def test_plain_names_are_dataset_names(name):
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".hidden", "a..b", "x" * 129, "a b"])
def test_a_name_is_never_a_path(name):
    with pytest.raises(KliqueError, match="dataset name"):
        check_name(name)


@pytest.mark.parametrize("path", ["a.csv", "train/x 1.png", "a/b/c+d-e_f.txt"])
def test_relative_plain_paths_are_kept(path):
    assert check_path(path) == path
    assert sdk_check_path(path) == path


@pytest.mark.parametrize(
    "path", ["", "/etc/passwd", "../x", "a/../../x", "a//b", "a/./b", ".ssh/key", "a/", "x" * 1025]
)
def test_paths_that_could_leave_the_folder_are_refused_by_both_sides(path, tmp_path):
    with pytest.raises(KliqueError, match="dataset file"):
        check_path(path)
    with pytest.raises(SDKError, match="dataset file"):
        inside(str(tmp_path), path)


def test_a_manifest_checks_digests_sizes_and_file_folder_clashes():
    assert check_manifest({"x": entry(A, 3)}) == {"x": {"digest": A, "size": 3}}
    with pytest.raises(KliqueError, match="digest"):
        check_manifest({"x": entry("A" * 64)})
    with pytest.raises(KliqueError, match="size"):
        check_manifest({"x": {"digest": A, "size": -1}})
    with pytest.raises(KliqueError, match="also a folder"):
        check_manifest({"a": entry(A), "a/b": entry(B)})


def test_a_child_sends_only_the_content_its_parent_lacks():
    parent = {"same": entry(A, 10), "edited": entry(B, 20), "gone": entry(C, 30)}
    child = {"same": entry(A, 10), "edited": entry(C, 30), "new": entry("d" * 64, 5)}
    change = diff(parent, child)
    assert change.added == ("new",)
    assert change.changed == ("edited",)
    assert change.removed == ("gone",)
    # C was the removed file's content: known already, never sent again
    assert change.new_digests == {"d" * 64}
    assert new_bytes(child, change.new_digests) == 5
    assert changed(parent, child) == ["d" * 64]


def test_a_first_version_sends_each_content_once():
    child = {"x": entry(A, 7), "copy of x": entry(A, 7)}
    assert diff({}, child).new_digests == {A}
    assert new_bytes(child, {A}) == 7


def test_apply_puts_and_removes():
    parent = {"a": entry(A), "b": entry(B)}
    assert apply(parent, {"c": entry(C)}, ["a"]) == {"b": entry(B), "c": entry(C)}
    assert parent == {"a": entry(A), "b": entry(B)}  # the parent is left as it was


ESTATE = """
resources:
  cpu:
    profile: {cpus: 1, memory: 1G, walltime: 1h, pools: [local]}
pools:
  local:
    kind: host
"""


def test_the_estate_names_an_s3_store_with_its_bucket(tmp_path):
    source = tmp_path / "estate.yaml"
    source.write_text(
        ESTATE + "datasets:\n  store: s3\n  bucket: klique-data\n  credentials_file: s3.ini\n"
    )
    found = load_estate(source).datasets
    assert (found.store, found.bucket) == ("s3", "klique-data")
    assert found.credentials_file == str(tmp_path / "s3.ini")  # beside the estate file
    assert parse_estate(ESTATE).datasets.store == "artifacts"
    with pytest.raises(EstateError, match="datasets.bucket"):
        parse_estate(ESTATE + "datasets:\n  store: s3\n")
